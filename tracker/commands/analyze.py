"""``tracker analyze RUN``: verdicts per loss key, detector events and stagnant classes."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from tracker.cli import friendly

MAX_EVENTS = 100
VERDICT_STYLE = {"converging": "green", "diverging": "bold red", "plateaued": "yellow", "too short to tell": "dim"}
SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "dim"}


def _overrides(assignments: tuple[str, ...]) -> dict[str, Any]:
    from tracker.analysis.params import parse_assignment

    out: dict[str, Any] = {}
    for text in assignments:
        detector, param, value = parse_assignment(text)
        if param == "enabled" and value is False:
            out[detector] = False
            continue
        section = out.setdefault(detector, {})
        if isinstance(section, dict):
            section[param] = value
    return out


def _trend_cell(report: Any) -> str:
    t = report.trend
    if t is None:
        return "-"
    return f"tau {t.tau:+.2f}, {t.relative_slope:+.1%}/1k steps, conf {t.confidence:.3f}"


def render(analysis: Any, console: Console) -> None:
    """Print ``analysis`` as rich tables."""
    title = f"run {analysis.run_id} ({analysis.project}/{analysis.name}), status {analysis.status}"
    keys = Table(title=title, title_justify="left")
    for col in ("key", "rank", "verdict", "trend (Mann-Kendall, Sen)", "points", "last step", "why"):
        keys.add_column(col, overflow="fold")
    for r in analysis.keys:
        style = VERDICT_STYLE.get(r.verdict, "")
        keys.add_row(
            r.key, str(r.rank), f"[{style}]{r.verdict}[/]", _trend_cell(r), str(r.points), str(r.last_step), r.reason
        )
    if not analysis.keys:
        console.print(f"[dim]{title}: no loss keys to judge (keys matching the analysis patterns, default *loss*)[/]")
    else:
        console.print(keys)
    events = Table(title=f"events ({len(analysis.events)})", title_justify="left")
    for col in ("step", "rank", "key", "kind", "severity", "message"):
        events.add_column(col, overflow="fold")
    for rec in analysis.events[:MAX_EVENTS]:
        e = rec.event
        sev = SEVERITY_STYLE.get(e.severity, "")
        events.add_row(str(e.step), str(rec.rank), e.key or "", e.kind, f"[{sev}]{e.severity}[/]", e.message)
    console.print(events if analysis.events else "[green]no events[/]")
    if len(analysis.events) > MAX_EVENTS:
        console.print(f"[dim]... {len(analysis.events) - MAX_EVENTS} more events (use --format json for all)[/]")
    for s in analysis.stagnant:
        names = ", ".join(f"{c.name} ({c.change:+.0%})" for c in s.classes)
        console.print(
            f"stagnant classes of {s.key} (rank {s.rank}), total {s.total_change:+.0%} since the start: {names}"
        )


def register(cli: click.Group) -> None:
    """Add ``tracker analyze`` to ``cli``."""

    @cli.command("analyze")
    @click.argument("run_id")
    @click.option("--key", default=None, help="Analyse only this key (default: every key matching *loss*).")
    @click.option(
        "--format",
        "fmt",
        type=click.Choice(("table", "json")),
        default="table",
        show_default=True,
        help="Output format.",
    )
    @click.option("--save", is_flag=True, help="Store the events found in the run's events table (new ones only).")
    @click.option(
        "--set",
        "assignments",
        multiple=True,
        metavar="DETECTOR.PARAM=VALUE",
        help="Override a detector parameter, e.g. --set divergence.factor=2 or --set plateau.enabled=false.",
    )
    @click.option(
        "--home",
        type=click.Path(file_okay=False),
        envvar="TRACKER_HOME",
        default=None,
        help="Store folder (default: $TRACKER_HOME or ./.tracker).",
    )
    @friendly
    def analyze_command(
        run_id: str, key: str | None, fmt: str, save: bool, assignments: tuple[str, ...], home: str | None
    ) -> None:
        """Judge each loss key of RUN (converging, diverging, plateaued, too short to tell) with its
        trend statistic, and list the detectors' events and the stagnant classes."""
        from tracker.analysis.offline import analyze, save_events

        analysis = analyze(run_id, key=key, home=home, **_overrides(assignments))
        saved = save_events(analysis, home=home) if save else None
        if fmt == "json":
            out = analysis.to_dict()
            if saved is not None:
                out["saved_events"] = saved
            sys.stdout.write(json.dumps(out, indent=2, default=str) + "\n")
            return
        console = Console()
        render(analysis, console)
        if saved is not None:
            console.print(f"saved {saved} new event(s) to the events table")
