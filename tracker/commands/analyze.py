"""``tracker analyze RUN``: verdicts per loss key, detector events and stagnant classes."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console

from tracker.cli import friendly

MAX_EVENTS = 100
VERDICT_STYLE = {"converging": "green", "diverging": "bold red", "plateaued": "yellow", "too short to tell": "dim"}
SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "dim"}
KIND_TITLE = {
    "overfitting": "overfitting", "metric_collapse": "metric collapse", "zero_loss": "loss identically zero",
    "stopped_early": "stopped early", "divergence": "divergence", "non_finite": "NaN/inf",
    "val_losses_absent": "validation losses not computed", "head_never_learnt": "a head never learnt",
}


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


def _confidence(report: Any) -> str:
    t = report.trend
    return "-" if t is None else f"{t.confidence:.2f}"


def _unit(rec: Any, analysis: Any = None) -> str:
    return str(rec.event.data.get("unit") or getattr(analysis, "unit", None) or "step")


def _advice(rec: Any) -> str:
    return str(rec.event.data.get("advice") or "")


def _message(rec: Any) -> str:
    """The event's message without the advice it may end with (shown on its own line)."""
    message, advice = rec.event.message, _advice(rec)
    if advice and message.endswith(advice):
        message = message[: -len(advice)].rstrip("; ,")
    return message


def _finding_conf(rec: Any) -> str:
    c = rec.event.data.get("confidence", 1.0 if rec.event.kind == "non_finite" else None)
    return f"{float(c):.2f}" if isinstance(c, (int, float)) else "-"


def _title(analysis: Any) -> str:
    points = max((r.points for r in analysis.keys), default=0)
    return f"run {analysis.run_id} ({analysis.project}/{analysis.name}) {analysis.status}, {points} points"


def render_findings(analysis: Any, console: Console) -> None:
    """The findings, one block each: what, where, why and what to do (wraps to the terminal)."""
    from rich.text import Text

    if not analysis.findings:
        console.print("[green]no findings[/] (no overfitting, collapse, zero loss, early stop, divergence or NaN)")
        return
    console.print(f"[bold]findings ({len(analysis.findings)})[/]")
    for rec in analysis.findings:
        e = rec.event
        style = SEVERITY_STYLE.get(e.severity, "")
        rank = f", rank {rec.rank}" if any(r.rank for r in analysis.findings) else ""
        head = Text(f"{e.severity.upper()} ", style=style)
        head.append(KIND_TITLE.get(e.kind, e.kind), style="bold")
        head.append(f"  {_unit(rec, analysis)} {e.step}{rank}, confidence {_finding_conf(rec)}")
        console.print(head)
        console.print(Text(_message(rec)))
        if _advice(rec):
            console.print(Text("what to do: ", style="bold") + Text(_advice(rec)))


def _key_rows(analysis: Any, advice: bool) -> tuple[list[str], list[list[str]]]:
    ranks = len({r.rank for r in analysis.keys}) > 1
    cols = ["key", *(["rank"] if ranks else []), "verdict", "conf", "points", "why", *(["what to do"] if advice else [])]
    rows = [
        [r.key, *([str(r.rank)] if ranks else []), r.verdict, _confidence(r), str(r.points), r.reason,
         *([r.advice or ""] if advice else [])]
        for r in analysis.keys
    ]
    return cols, rows


def _verdict_advice(analysis: Any) -> list[tuple[str, list[str], str]]:
    """(verdict, keys, advice) for each distinct piece of advice of the per-key verdicts."""
    out: dict[tuple[str, str], list[str]] = {}
    for r in analysis.keys:
        if r.advice:
            out.setdefault((r.verdict, r.advice), []).append(r.key)
    return [(verdict, keys, advice) for (verdict, advice), keys in out.items()]


def _other_events(analysis: Any) -> list[Any]:
    shown = {id(f.event) for f in analysis.findings}
    return [r for r in analysis.events if id(r.event) not in shown]


def _event_rows(analysis: Any, limit: int | None) -> tuple[list[str], list[list[str]]]:
    rest = _other_events(analysis)
    cols = ["step", "rank", "key", "kind", "severity", "message"]
    rows = [[str(r.event.step), str(r.rank), r.event.key or "", r.event.kind, r.event.severity, r.event.message]
            for r in rest[:limit]]
    return cols, rows


def _style(column: str, value: str) -> str | None:
    if column == "verdict":
        return VERDICT_STYLE.get(value)
    if column == "severity":
        return SEVERITY_STYLE.get(value)
    return None


def render(analysis: Any, console: Console, terminal: bool | None = None) -> None:
    """Print ``analysis``: findings, then a verdict per key, then the other events.

    On a terminal the findings wrap to its width and the tables are fitted to it
    (80 columns read well); through a pipe every section is tab-separated text with a
    header line (sections apart by an empty line, their titles on stderr), as the
    other commands print.
    """
    from tracker.commands._output import print_rows, stdout_is_terminal

    tty = stdout_is_terminal() if terminal is None else terminal
    if not tty:
        _render_plain(analysis, console)
        return
    console.print(f"[bold]{_title(analysis)}[/]")
    render_findings(analysis, console)
    cols, rows = _key_rows(analysis, advice=False)
    if rows:
        console.print()
        print_rows(cols, rows, title=f"verdict per key ({len(rows)})", keys=("key",), wrap=("why",),
                   drop_order=("conf", "points"), style=_style, console=console, terminal=True)
        for verdict, keys, advice in _verdict_advice(analysis):
            console.print(f"[bold]what to do[/] ({verdict}: {', '.join(keys)}): {advice}")
    else:
        console.print("[dim]no loss keys to judge (keys matching the analysis patterns, default *loss*)[/]")
    cols, rows = _event_rows(analysis, MAX_EVENTS)
    if rows:
        console.print()
        print_rows(cols, rows, title=f"other events ({len(rows)})", keys=("step",), wrap=("message",),
                   drop_order=("rank", "severity"), style=_style, console=console, terminal=True)
        hidden = len(_other_events(analysis)) - len(rows)
        if hidden > 0:
            console.print(f"[dim]... {hidden} more events (use --format json for all)[/]")
    for s in analysis.stagnant:
        names = ", ".join(f"{c.name} ({c.change:+.0%})" for c in s.classes)
        console.print(
            f"stagnant classes of {s.key} (rank {s.rank}), total {s.total_change:+.0%} since the start: {names}"
        )


def _render_plain(analysis: Any, console: Console) -> None:
    """The tab-separated form of :func:`render` (see its doc)."""
    from tracker.commands._output import print_rows

    sections = []
    rows = [[str(r.event.step), _unit(r, analysis), r.event.kind, r.event.severity, r.event.key or "", _finding_conf(r),
             _message(r), _advice(r)] for r in analysis.findings]
    sections.append((["step", "unit", "finding", "severity", "key", "confidence", "message", "what to do"], rows,
                     f"{_title(analysis)}: findings"))
    cols, rows = _key_rows(analysis, advice=True)
    sections.append((cols, rows, "verdict per key"))
    cols, rows = _event_rows(analysis, None)
    if rows:
        sections.append((cols, rows, "other events"))
    for s in analysis.stagnant:
        rows = [[s.key, str(s.rank), str(c.index), c.name, f"{c.change:+.3f}"] for c in s.classes]
        sections.append((["key", "rank", "class_index", "class", "change"], rows, "stagnant classes"))
    for i, (cols, rows, title) in enumerate(sections):
        if i:
            console.file.write("\n")
        print_rows(cols, rows, title=title, console=console, terminal=False)


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
        help="Output format (table: fitted to the terminal, tab-separated through a pipe).",
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
        """Judge RUN: findings (overfitting with its best epoch, a metric collapsed to zero, a loss
        identically zero, a run stopped early, divergence, NaN/inf), each with its confidence and what
        to do; a verdict per loss key (converging, diverging, plateaued, too short to tell) with its
        trend statistic; the other detectors' events and the stagnant classes."""
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
            message = f"saved {saved} new event(s) to the events table"
            if console.is_terminal:
                console.print(message)
            else:
                sys.stderr.write(message + "\n")
