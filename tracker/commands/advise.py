"""``tracker advise RUN``: concrete changes for the classes that do not learn, each with its evidence."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from tracker.cli import friendly

NO_ADVICE = 1  # exit status: the signals are there and support no change
NO_SIGNALS = 3  # exit status: the run logged none of the signals advice is made from


def build(run_id: str, home: str | None) -> dict[str, Any]:
    """The advice for ``run_id`` as a JSON-ready dict (run, advice, restart, signals)."""
    from tracker.analysis.offline import find_run
    from tracker.rare_advice import advise, notes, restart_line
    from tracker.rare_classes import collect, stagnant
    from tracker.store import open_store

    store = open_store(home)
    run = find_run(store, run_id)
    rc = collect(store, run["run_id"])
    signals = {"grad": rc.ratio_steps is not None, "assign": rc.assign_steps is not None,
               "ap": rc.ap_steps is not None, "counts": rc.counts is not None}
    step, stuck = stagnant(run["run_id"], home=home)
    measured = signals["grad"] or signals["assign"] or signals["ap"]
    advice = advise(rc, [name for _, name, _, _ in stuck]) if measured else []
    return {
        "run_id": run["run_id"], "name": run.get("name"), "signals": signals, "measured": measured,
        "stagnant": {"step": step, "classes": [name for _, name, _, _ in stuck]},
        "advice": [a.as_dict() for a in advice],
        "checked": notes(rc, advice) if measured else [],
        "restart": restart_line(advice, rc) if advice else None,
    }


def render(out: dict[str, Any]) -> None:
    """Print ``out`` for people: each change, its evidence, then the line to restart with."""
    echo = click.echo
    echo(f"run {out['run_id']} ({out.get('name') or '-'})")
    if not out["measured"]:
        echo("no assignment, gradient or per-class AP signals in this run; train with track() (on by default) "
             "or log them with run.log_assignments()")
        return
    if not out["advice"]:
        echo("no change advised:")
        for line in out["checked"]:
            echo(f"  - {line}")
        return
    for i, a in enumerate(out["advice"], 1):
        echo(f"{i}. [{a['kind']}] {a['change']}")
        for line in a["evidence"]:
            echo(f"     - {line}")
    if out["checked"]:
        echo("no change needed:")
        for line in out["checked"]:
            echo(f"  - {line}")
    echo("restart with:")
    for line in out["restart"].splitlines():
        echo(f"  {line}")


def register(cli: click.Group) -> None:
    """Add ``tracker advise`` to ``cli``."""

    @cli.command("advise")
    @click.argument("run_id")
    @click.option("--format", "fmt", type=click.Choice(("text", "json")), default="text", show_default=True,
                  help="Output format.")
    @click.option("--home", type=click.Path(file_okay=False), envvar="TRACKER_HOME", default=None,
                  help="Store folder (default: $TRACKER_HOME or ./.tracker).")
    @friendly
    def advise_command(run_id: str, fmt: str, home: str | None) -> None:
        """Advise RUN on its rare classes: class weights fitted to its counts and gradients, EQL v2
        positive weights, a repeat-factor threshold and its effect per frequency group, a larger imgsz
        for boxes without a positive anchor; each with its evidence, and the line to restart with.

        Exit status: 0 with advice, 1 when the signals support no change, 3 when the run logged none
        of the signals (assign/*, grad/*, val/AP50-95), 1 with an error message for an unknown run,
        2 for bad usage."""
        out = build(run_id, home)
        if fmt == "json":
            sys.stdout.write(json.dumps(out, indent=2, default=str) + "\n")
        else:
            render(out)
        if not out["measured"]:
            sys.exit(NO_SIGNALS)
        if not out["advice"]:
            sys.exit(NO_ADVICE)
