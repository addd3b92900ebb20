"""``tracker demo``: train three small runs (see :mod:`tracker.demo`), then open the app."""

from __future__ import annotations

import secrets
import socket
import subprocess
import time

import click
from rich.console import Console

from tracker.cli import friendly
from tracker.commands.ui import app_env, streamlit_command


def _free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise click.ClickException("no free localhost port for the web UI")


@click.command("demo")
@click.option("--steps", type=click.IntRange(60, 100_000), default=400, show_default=True, help="Steps per run.")
@click.option("--home", type=click.Path(file_okay=False), envvar="TRACKER_HOME", default=None,
              help="Store folder (default: $TRACKER_HOME or ./.tracker).")
@click.option("--ui/--no-ui", default=True, show_default=True, help="Start the web UI at the end.")
@click.option("--port", type=click.IntRange(0, 65535), default=8501, show_default=True)
@friendly
def demo(steps: int, home: str | None, ui: bool, port: int) -> None:
    """Train plain BCE vs class-weighted BCE + repeat-factor sampling on COCO-frequency data."""
    from tracker import demo as d
    from tracker.run import home_dir
    from tracker.store import Store

    console = Console(soft_wrap=True)
    t0 = time.perf_counter()
    runs = d.run_quick(steps, home, secrets.token_hex(2), say=console.print)
    weighted = runs.weighted
    store = Store(home)
    store.ingest()
    summary = store.query(
        "SELECT run_id, status, last_step, n_points, segments FROM run_summary WHERE run_id IN (?, ?, ?) "
        "ORDER BY run_id", runs.run_ids,
    )
    console.print(f"trained in {time.perf_counter() - t0:.1f} s; store: [cyan]{home_dir(home)}[/]")
    for row in summary.iter_rows(named=True):
        console.print(f"  {row['run_id']}: {row['status']}, last step {row['last_step']}, "
                      f"{row['n_points']} points, {row['segments']} segment(s)")
    console.print("look at it with:\n"
                  f"  tracker runs show {weighted}\n"
                  f"  tracker analyze {weighted}\n"
                  "  tracker sql \"SELECT run_id, key, count(*) FROM curves GROUP BY ALL\"\n"
                  "  streamlit run webui   (or: tracker ui)")
    if not ui:
        return
    port = _free_port(port)
    cmd = streamlit_command(port)
    console.print(f"web UI on [bold]http://127.0.0.1:{port}/[/] (Ctrl-C to stop)")
    proc = subprocess.Popen(cmd, env=app_env(home))
    try:
        proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=10)


def register(cli: click.Group) -> None:
    cli.add_command(demo)
