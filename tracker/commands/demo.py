"""``tracker demo``: train runs, interrupt and resume one, then open the app.

By default the runs train a real detector (YOLO11n with Ultralytics, the
``ultralytics`` extra) on a synthetic dataset with COCO's long tail;
``--quick`` runs the fast synthetic demo (three runs of a linear multi-label model in
numpy, see :mod:`tracker.demo`).
"""

from __future__ import annotations

import importlib.util
import secrets
import shlex
import socket
import time

import click
from rich.console import Console

from tracker.cli import friendly
from tracker.commands._output import activate_hint, tracker_command
from tracker.commands.ui import app_env, run_app, streamlit_command


def _free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise click.ClickException("no free localhost port for the web UI")


def _quick(console: Console, steps: int, home: str | None, tag: str) -> tuple[list[str], str]:
    """The synthetic demo (:func:`tracker.demo.run_quick`): its run ids and the one to look at."""
    from tracker import demo as d

    runs = d.run_quick(steps, home, tag, say=console.print)
    return list(runs.run_ids), runs.weighted


def _yolo(console: Console, epochs: int, images: int, home: str | None, tag: str) -> tuple[list[str], str]:
    """The real-detector demo (tracker.integrations.yolo_demo)."""
    if importlib.util.find_spec("ultralytics") is None:
        raise click.ClickException(
            "the YOLO demo needs Ultralytics: pip install 'tracker[ultralytics]' (AGPL-3.0), "
            "or run the synthetic one with: tracker demo --quick"
        )
    from tracker.integrations.yolo_demo import run_demo

    console.print("[bold]tracker demo[/]: YOLO11n trained with Ultralytics on CPU, "
                  "stock BCE vs class-weighted BCE + repeat-factor sampling")
    result = run_demo(home, tag, train_images=images, val_images=max(8, images // 4), epochs=epochs,
                      echo=lambda line: console.print(line, highlight=False))
    console.print(f"training took {result.seconds:.1f} s (two runs, one killed with SIGKILL and resumed)")
    return [result.plain, result.weighted], result.weighted


@click.command("demo")
@click.option("--quick", is_flag=True, help="The fast synthetic demo (numpy model) instead of training YOLO11n.")
@click.option("--steps", type=click.IntRange(60, 100_000), default=400, show_default=True,
              help="Steps per run (--quick).")
@click.option("--epochs", type=click.IntRange(2, 1000), default=12, show_default=True, help="Epochs per YOLO run.")
@click.option("--images", type=click.IntRange(16, 100_000), default=256, show_default=True,
              help="Synthetic training images for the YOLO runs.")
@click.option("--home", type=click.Path(file_okay=False), envvar="TRACKER_HOME", default=None,
              help="Store folder (default: $TRACKER_HOME or ./.tracker).")
@click.option("--ui/--no-ui", default=True, show_default=True, help="Start the web UI at the end.")
@click.option("--port", type=click.IntRange(0, 65535), default=8501, show_default=True)
@friendly
def demo(quick: bool, steps: int, epochs: int, images: int, home: str | None, ui: bool, port: int) -> None:
    """Train stock vs class-weighted + repeat-factor-sampled runs, kill and resume one, open the app."""
    from tracker.spool import home_dir
    from tracker.store import Store

    console = Console(soft_wrap=True)
    t0 = time.perf_counter()
    tag = secrets.token_hex(2)
    run_ids, weighted = _quick(console, steps, home, tag) if quick else _yolo(console, epochs, images, home, tag)
    store = Store(home)
    store.ingest()
    summary = store.query(
        "SELECT run_id, status, last_step, n_points, segments FROM run_summary "
        "WHERE list_contains(?, run_id) ORDER BY run_id", [run_ids],
    )
    console.print(f"done in {time.perf_counter() - t0:.1f} s; store: [cyan]{home_dir(home)}[/]")
    for row in summary.iter_rows(named=True):
        console.print(f"  {row['run_id']}: {row['status']}, last step {row['last_step']}, "
                      f"{row['n_points']} points, {row['segments']} segment(s)")
    # pasted as printed into a fresh shell, these work: `.venv/bin/tracker` unless the environment is active,
    # and the store named when it is not the default one
    cli = tracker_command() if home is None else f"TRACKER_HOME={shlex.quote(str(home_dir(home)))} {tracker_command()}"
    console.print("look at it with:\n"
                  f"  {cli} runs show {weighted}\n"
                  f"  {cli} analyze {weighted}\n"
                  f"  {cli} sql \"SELECT run_id, key, count(*) FROM curves GROUP BY ALL\"\n"
                  f"  {cli} ui", markup=False, highlight=False)
    if activate_hint():
        console.print(f"(or activate the environment first, `{activate_hint()}`, and type plain `tracker`)",
                      markup=False, highlight=False)
    if not ui:
        return
    port = _free_port(port)
    cmd = streamlit_command(port)
    console.print(f"web UI on [bold]http://127.0.0.1:{port}/[/] (Ctrl-C to stop)")
    run_app(cmd, app_env(home))


def register(cli: click.Group) -> None:
    cli.add_command(demo)
