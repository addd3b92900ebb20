"""``tracker import <source> ...``: one subcommand per registered importer.

Each subcommand takes the importer's own arguments plus ``--project``, ``--dry-run``
and ``--home``; reading, planning and writing are :mod:`tracker.importer`'s, the same
for every source. Progress goes to stderr (only when it is a terminal); the summary
table goes to stdout.
"""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from tracker.cli import friendly


class _Bar:
    """A :class:`tracker.importer.Reporter` drawing a rich progress bar on stderr."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.task: TaskID | None = None

    def start(self, label: str, total: float) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(label, total=max(float(total), 1e-9))

    def advance(self, amount: float) -> None:
        if self.task is not None:
            self.progress.advance(self.task, amount)


def _summary(plans: list[Any], dry_run: bool, seconds: float) -> None:
    from tracker.commands._output import print_rows

    verb = "would import" if dry_run else "imported"
    print_rows(
        ("run_id", "name", "project", "action", "segments", "keys", "points", "new points"),
        [(p.run.run_id, p.run.name, p.run.project, p.action, str(len(p.segments)), str(p.keys), str(p.points),
          str(p.new_points)) for p in plans],
        title=f"{verb} {len(plans)} run(s) in {seconds:.1f} s", keys=("run_id", "name"),
        drop_order=("segments", "keys", "project"),
    )


def _make_command(importer: Any) -> click.Command:
    def callback(project: str | None, dry_run: bool, home: str | None, **options: Any) -> None:
        from tracker.importer import import_runs
        from tracker.spool import home_dir
        from tracker.store import Store

        t0 = time.perf_counter()
        err = Console(stderr=True)
        progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                            TimeElapsedColumn(), console=err, disable=not err.is_terminal, transient=True)
        root = home_dir(home)
        with progress:
            runs = list(importer.read(_Bar(progress), **options))
            if project:
                for run in runs:
                    run.project = project
            bar = progress.add_task("writing", total=max(len(runs), 1))
            plans = import_runs(runs, root, dry_run=dry_run, on_write=lambda p: progress.advance(bar))
        if not runs:
            raise click.ClickException(f"no runs found in the {importer.name} source; check the path or URI")
        if not dry_run and any(p.action != "unchanged" for p in plans):
            Store(root).ingest(timeout=2.0)
        _summary(plans, dry_run, time.perf_counter() - t0)

    params = [
        *importer.params,
        click.Option(["--project"], default=None, help="Project of the imported runs (default: from the source)."),
        click.Option(["--dry-run"], is_flag=True, help="Show the runs, keys and points that would be imported; write nothing."),
        click.Option(["--home"], type=click.Path(file_okay=False), envvar="TRACKER_HOME", default=None,
                     help="Store folder (default: $TRACKER_HOME or ./.tracker)."),
    ]
    return click.Command(importer.name, callback=friendly(callback), params=params, help=importer.help)


class ImportGroup(click.Group):
    """``tracker import``: its subcommands come from the importers registry, built on first use."""

    _host: Any = None

    def _fill(self) -> None:
        from tracker.host import get_host

        host = get_host()
        if host is self._host:
            return
        self._host = host
        self.commands.clear()
        for name, importer in sorted(host.items("importers").items()):
            self.add_command(_make_command(importer), name)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._fill()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._fill()
        return super().list_commands(ctx)


@click.group("import", cls=ImportGroup)
def import_group() -> None:
    """Import runs from other tools (Ultralytics, TensorBoard, MLflow, CSV); idempotent."""


def register(cli: click.Group) -> None:
    cli.add_command(import_group)
