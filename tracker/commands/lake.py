"""``tracker lake init|push|status``: the DuckLake store (catalog in PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

import click

from tracker.cli import friendly
from tracker.commands._output import format_option, print_frame
from tracker.commands.runs import home_option
from tracker.errors import ConfigError


def _lake(home: str | None):  # type: ignore[no-untyped-def]
    from tracker.store.lake import LakeStore
    from tracker.store.settings import current

    setting = current()
    if setting is None:
        raise ConfigError(
            "no lake selected: set TRACKER_STORE='ducklake:postgres:dbname=... host=... user=... password=...' "
            "and TRACKER_DATA_PATH, or pass --store/--data-path before the command"
        )
    return LakeStore(home, setting)


@click.group("lake")
def lake() -> None:
    """The shared store on DuckLake: init, push local runs, status."""


@lake.command("init")
@home_option
@friendly
def init(home: str | None) -> None:
    """Create the tracker's tables and views in the lake (idempotent)."""
    store = _lake(home)
    tables = store.init()
    click.echo(f"lake {store.setting.masked()} (data {store.setting.data_path}): {len(tables)} tables and views")


@lake.command("push")
@click.option("--from", "source", type=click.Path(file_okay=False, exists=True), default=None,
              help="The local store folder (TRACKER_HOME of the DuckDB file) whose runs to copy.")
@home_option
@friendly
def push(source: str | None, home: str | None) -> None:
    """Commit this host's spool into the lake now, or with --from copy a local store's runs
    into it (runs already there are skipped). Both are idempotent.

    Without --from, the segments of processes on this host that died (a kill -9) are
    first brought up to their durable chunks, so every row that reached the spool goes
    to the lake; the resume rule hides those at or after a later segment's start.
    """
    from tracker.store.local import LocalStore

    if source is None:
        from tracker.store.lakespool import claim_orphans

        store = _lake(home)
        claimed = claim_orphans(store.home)
        report = store.ingest(timeout=10.0)
        click.echo(f"committed {report.rows} rows ({report.files} chunks) of {store.home} into "
                   f"{store.setting.masked()}" + (f"; {claimed} segment(s) of dead processes claimed" if claimed else ""))
        return

    local = LocalStore(source)
    if not local.path.exists() and not (local.home / "runs").exists():
        raise ConfigError(f"--from {source!r}: no store there (no {local.path.name}); pass a TRACKER_HOME folder")
    local.ingest(timeout=5.0)
    store = _lake(home)
    ids = local.query("SELECT run_id FROM runs WHERE parent_run_id IS NULL ORDER BY created_at")["run_id"].to_list()
    forks = local.query("SELECT count(*) AS n FROM runs WHERE parent_run_id IS NOT NULL")["n"][0]
    copied = skipped = 0
    with click.progressbar(ids, label="pushing runs", show_pos=True) as bar:
        for run_id in bar:
            if store.push_run(Path(local.path), run_id):
                copied += 1
            else:
                skipped += 1
    click.echo(f"pushed {copied} runs into {store.setting.masked()}; {skipped} already there"
               + (f"; {forks} fork(s) left out (the lake has no lineage)" if forks else ""))


@lake.command("follow")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds between commits.")
@home_option
@friendly
def follow(interval: float, home: str | None) -> None:
    """Commit this host's spool into the lake every INTERVAL seconds, until interrupted.

    Run one per host with TRACKER_LAKE_COMMITTER=follow in the training processes'
    environment; they then leave every commit to this process.
    """
    import logging
    import signal
    import threading

    from tracker.store.lakerun import follow as follow_spool

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    store = _lake(home)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    click.echo(f"committing {store.home} into {store.setting.masked()} every {interval:g} s", err=True)
    try:
        follow_spool(store.home, interval, stop)
    except KeyboardInterrupt:
        pass
    from tracker.store.lake import STATS

    click.echo(f"stopped: {STATS['commits']} commits, {STATS['conflicts']} conflicts retried", err=True)


@lake.command("status")
@home_option
@format_option
@friendly
def status(home: str | None, fmt: str) -> None:
    """Catalog, data path, snapshots, and each host's backlog: the chunks and rows its
    spool still held at its last commit, and how old the oldest of them was then."""
    import polars as pl

    from tracker.store.lakespool import backlog

    store = _lake(home)
    snaps = store.snapshots()
    click.echo(f"catalog:   {store.setting.masked()}")
    click.echo(f"data path: {store.setting.data_path}")
    last = snaps.tail(1).rows()
    click.echo(f"snapshots: {snaps.height}" + (f" (latest {last[0][0]} at {last[0][1]})" if last else ""))
    here = backlog(store.home)
    click.echo(f"this host: {here.chunks} chunks, {here.rows:,} rows pending in {store.home}"
               + (f" (oldest {here.oldest_s:.1f} s)" if here.chunks else ""))
    hosts = store.query("SELECT * FROM hosts ORDER BY host, home")
    for col in ("pending_rows", "backlog_s"):  # a lake no writer of this release has migrated yet
        if col not in hosts.columns:
            hosts = hosts.with_columns(pl.lit(None, pl.Float64).alias(col))
    print_frame(hosts.select("host", "home", pl.col("pending").alias("backlog_chunks"),
                             pl.col("pending_rows").alias("backlog_rows"), pl.col("backlog_s").round(1),
                             "committed_at"), fmt)


def register(cli: click.Group) -> None:
    cli.add_command(lake)
