"""``tracker runs list|show|rm|fork|compare|groups``, ``tracker export`` and ``tracker ingest``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tracker.cli import friendly
from tracker.commands._output import format_option, print_frame, stdout_is_terminal
from tracker.commands.summary import run_fields
from tracker.errors import RunError

if TYPE_CHECKING:  # the store (DuckDB, polars) loads when a command uses it
    from tracker.store import Store

home_option = click.option(
    "--home", type=click.Path(file_okay=False), envvar="TRACKER_HOME", default=None,
    help="Store folder (default: $TRACKER_HOME or ./.tracker).",
)


def _store(home: str | None) -> Store:
    from tracker.store import Store

    store = Store(home)
    is_lake = getattr(store, "setting", None) is not None
    if not is_lake and not store.path.exists() and not (store.home / "runs").exists():
        raise click.ClickException(f"No store found at {store.home}; log a run first or pass --home / TRACKER_HOME")
    store.ingest(timeout=1.0)
    return store


def _check_run(store: Store, run_id: str) -> None:
    if store.query("SELECT count(*) AS n FROM runs WHERE run_id = ?", [run_id])["n"][0] == 0:
        ids = store.query("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 10")["run_id"].to_list()
        raise RunError(f"Unknown run {run_id!r}; recent runs: {', '.join(ids) or 'none'}")


@click.group()
def runs() -> None:
    """List, show and remove runs."""


@runs.command("list")
@home_option
@click.option("--project", default=None, help="Only runs of this project.")
@click.option("--status", default=None, help="Only runs with this status.")
@format_option
@friendly
def list_runs(home: str | None, project: str | None, status: str | None, fmt: str) -> None:
    """One line per run, newest first."""
    store = _store(home)
    fork_of = ("CAST(NULL AS VARCHAR)" if getattr(store, "setting", None) is not None  # the lake: no forks
               else "CASE WHEN parent_run_id IS NOT NULL THEN parent_run_id || '@' || fork_step END")
    df = store.query(
        "SELECT run_id, project, name, status, strftime(created_at, '%Y-%m-%d %H:%M') AS created, "
        "round(duration_s, 1) AS duration_s, "
        f"last_step, n_points, segments, {fork_of} AS fork_of, tags "
        "FROM run_summary "
        "WHERE (? IS NULL OR project = ?) AND (? IS NULL OR status = ?) ORDER BY created_at DESC",
        [project, project, status, status],
    )
    print_frame(
        df, fmt, title=f"runs in {store.home}", keys=("run_id", "name"),
        drop_order=("fork_of", "tags", "segments", "n_points", "duration_s", "project", "created", "last_step"), shrink=("tags",),
    )


@runs.command("show")
@click.argument("run_id")
@home_option
@format_option
@click.option("--full", is_flag=True, help="Show long config values whole instead of summarised.")
@friendly
def show_run(run_id: str, home: str | None, fmt: str, full: bool) -> None:
    """A run's metadata and config, segments and keys (long config values summarised unless --full)."""
    store = _store(home)
    _check_run(store, run_id)
    info = store.query("SELECT * FROM run_summary WHERE run_id = ?", [run_id])
    segs = store.query(
        "SELECT rank, segment, start_step, end_step, reason, strftime(started_at, '%Y-%m-%d %H:%M:%S') AS started, "
        "strftime(ended_at, '%Y-%m-%d %H:%M:%S') AS ended FROM segments WHERE run_id = ? ORDER BY rank, segment",
        [run_id],
    )
    keys = store.query(
        "SELECT key, count(*) AS points, min(step) AS first_step, max(step) AS last_step, "
        "arg_max(value, step) AS last_value, min(value) AS min_value FROM curves WHERE run_id = ? "
        "GROUP BY key ORDER BY key",
        [run_id],
    )
    if fmt == "json":
        import json

        out = {"run": info.to_dicts()[0], "segments": segs.to_dicts(), "keys": keys.to_dicts()}
        sys.stdout.write(json.dumps(out, default=str, indent=2) + "\n")
        return
    import polars as pl

    record = info.to_dicts()[0]
    full = full or fmt != "table"  # csv: every value whole
    fields = run_fields(record, full=full, width=None if full else _summary_width(fmt, run_fields(record)))
    sections = (
        ("run", pl.DataFrame(fields, schema=["field", "value"], orient="row"), ("field", "value")),
        ("segments", segs, ("rank", "segment")),
        ("keys", keys, ("key",)),
    )
    plain = fmt == "table" and not stdout_is_terminal()
    for i, (title, df, key_columns) in enumerate(sections):
        if plain:
            sys.stdout.write(("\n" if i else "") + f"# {title}\n")
        print_frame(df, fmt, title=None if plain else title, keys=key_columns)


def _summary_width(fmt: str, fields: list[tuple[str, str]]) -> int:
    """How many characters a summarised config value may take: what a terminal leaves beside the names."""
    if fmt == "table" and stdout_is_terminal():
        from rich.console import Console

        longest = max((len(name) for name, _ in fields), default=0)
        return max(24, Console().width - longest - 7)
    return 60


@runs.command("rm")
@click.argument("run_ids", nargs=-1, required=True)
@home_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@friendly
def rm_runs(run_ids: tuple[str, ...], home: str | None, yes: bool) -> None:
    """Remove runs and all their rows."""
    store = _store(home)
    for run_id in run_ids:
        _check_run(store, run_id)
    if not yes:
        click.confirm(f"Remove {len(run_ids)} run(s) and all their rows?", abort=True)
    for run_id in run_ids:
        n = store.delete_run(run_id)
        click.echo(f"removed run {run_id} ({n} rows)")


@click.command("export")
@click.argument("run_id")
@home_option
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet"]), default="csv", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="File to write (default: stdout for csv, <run>.parquet).")
@click.option("--all-rows", is_flag=True, help="Include rows hidden by a resume.")
@click.option("--x", "x_key", default=None, help="Add column x: this logged key's last value at or before each row's step (e.g. epoch).")
@friendly
def export(run_id: str, home: str | None, fmt: str, output: str | None, all_rows: bool, x_key: str | None) -> None:
    """Export a run's scalar rows (visible ones unless --all-rows)."""
    store = _store(home)
    _check_run(store, run_id)
    if x_key is not None and all_rows:
        raise click.UsageError("--x reads the visible rows; leave out --all-rows")
    if x_key is not None:
        from tracker.runsets import x_axis_sql

        df = store.query(f"SELECT c.step, c.key, c.value, c.wall_time, c.rank, x FROM ({x_axis_sql(x_key)}) c "
                         "WHERE c.run_id = ? ORDER BY c.key, c.step, c.rank", [run_id])
    else:
        source = "metrics" if all_rows else "curves"
        df = store.query(f"SELECT step, key, value, wall_time, rank, segment FROM {source} WHERE run_id = ? ORDER BY key, step, rank", [run_id])
    if fmt == "parquet":
        path = Path(output or f"{run_id}.parquet").resolve()
        df.write_parquet(path)
        click.echo(f"wrote {df.height} rows to {path}", err=True)
    elif output:
        df.write_csv(output)
        click.echo(f"wrote {df.height} rows to {Path(output).resolve()}", err=True)
    else:
        sys.stdout.write(df.write_csv())


@click.command("ingest")
@home_option
@friendly
def ingest(home: str | None) -> None:
    """Move spooled rows of live or crashed runs into the database now."""
    from tracker.store import Store

    report = Store(home).ingest()
    if report.skipped_locked:
        raise click.ClickException("the store is locked by another process; try again")
    click.echo(f"ingested {report.files} files ({report.rows} rows); {report.corrupt} corrupt files set aside")


@runs.command("fork")
@click.argument("point", metavar="RUN@STEP")
@home_option
@click.option("--run-id", default=None, help="The fork's run id (default: a new one).")
@click.option("--name", default=None, help="The fork's name (default: the parent's name and @STEP).")
@click.option("--project", default=None, help="The fork's project (default: the parent's).")
@format_option
@friendly
def fork_run(point: str, home: str | None, run_id: str | None, name: str | None, project: str | None, fmt: str) -> None:
    """Make a run that shares RUN's visible rows up to STEP (nothing copied); continue it with
    tracker.init(project, run_id=NEW, resume="must"). RUN alone forks at its last step."""
    from tracker.commands.runsets import fork_command

    fork_command(point, home, run_id, name, project, fmt)


@runs.command("compare")
@click.argument("run_ids", nargs=-1, required=True)
@home_option
@click.option("--key", "keys", multiple=True, help="Summary metric keys (default: every key all runs share).")
@click.option("--all-config", is_flag=True, help="Show every config key, not only those that differ.")
@click.option("--class-key", default="val/AP50-95", show_default=True,
              help="Per-class key whose last values are compared, rarest classes first (by assign/gt).")
@format_option
@friendly
def compare_runs(run_ids: tuple[str, ...], home: str | None, keys: tuple[str, ...], all_config: bool,
                 class_key: str, fmt: str) -> None:
    """Compare 2-N runs: the config keys that differ (nested keys flattened), each key's
    last, min and max side by side, and the per-class difference, rare classes first."""
    from tracker.commands.runsets import compare_command

    compare_command(_store(home), run_ids, keys, all_config, fmt, class_key)


@runs.command("groups")
@click.argument("config_keys", nargs=-1, required=True)
@home_option
@click.option("--key", default="loss", show_default=True, help="The metric summarised per group.")
@click.option("--project", default=None, help="Only runs of this project.")
@format_option
@friendly
def group_runs(config_keys: tuple[str, ...], home: str | None, key: str, project: str | None, fmt: str) -> None:
    """Runs grouped by config keys (e.g. loss.scheme loss.beta): per group its runs and the
    mean, std, min and max of the metric's last and best (min) value."""
    from tracker.commands.runsets import groups_command

    groups_command(_store(home), config_keys, key, project, fmt)


def register(cli: click.Group) -> None:
    cli.add_command(runs)
    cli.add_command(export)
    cli.add_command(ingest)
