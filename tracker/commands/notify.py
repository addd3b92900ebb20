"""``tracker notify test`` and ``tracker notify watch``: try the alert targets, watch for crashed runs."""

from __future__ import annotations

import sys
import time

import click

from tracker.cli import friendly

_home = click.option("--home", type=click.Path(file_okay=False), envvar="TRACKER_HOME", default=None,
                     help="The store folder (default $TRACKER_HOME or ./.tracker).")


@click.group("notify")
def notify_group() -> None:
    """Alerts: send a test message to every target, or watch the store for crashed runs."""


@notify_group.command("test")
@click.option("--to", "targets", multiple=True,
              help="A target NAME:ARGUMENT (repeatable); default: the configured ones.")
@friendly
def test_command(targets: tuple[str, ...]) -> None:
    """Send a sample message through every configured notifier and report each.

    Targets come from --to, else TRACKER_NOTIFY, else [tool.tracker.notify] in pyproject.toml.
    Exits 1 when one failed, 2 when none is configured.
    """
    import socket

    from tracker.host import get_host
    from tracker.notify import config

    cfg = config.load(list(targets) if targets else None)
    cfg.source = "--to" if targets else cfg.source
    if not cfg.targets:
        click.echo("no notify target configured: pass --to, set TRACKER_NOTIFY or add [tool.tracker.notify] "
                   "targets to pyproject.toml (see docs/alerts.md)", err=True)
        sys.exit(2)
    notifiers = get_host().items("notifiers")
    config.check_targets(cfg.targets, notifiers)
    message = {"run_id": "notify-test", "project": "tracker", "name": "notify-test", "rank": 0,
               "host": socket.gethostname(), "title": "[info] test message from tracker notify test",
               "kind": "test", "severity": "info", "key": None, "step": None,
               "text": "if you read this, alerts from this machine reach you", "data": {}, "rule": "test",
               "held_back": 0, "time": time.time()}
    failed = 0
    for target in cfg.targets:
        started = time.perf_counter()
        try:
            notifiers[target.notifier].send(target, message)
        except Exception as exc:
            failed += 1
            click.echo(f"FAIL\t{target.shown}\t{config.mask(f'{type(exc).__name__}: {exc}')}")
        else:
            click.echo(f"ok\t{target.shown}\t{(time.perf_counter() - started) * 1000:.0f} ms")
    click.echo(f"{len(cfg.targets) - failed} of {len(cfg.targets)} target(s) reached (from {cfg.source})", err=True)
    if failed:
        sys.exit(1)


@notify_group.command("watch")
@_home
@click.option("--once", is_flag=True, help="Check once and exit.")
@click.option("--to", "targets", multiple=True,
              help="Where to report crashes of runs without targets of their own (default: TRACKER_NOTIFY, "
                   "then pyproject.toml).")
@click.option("--every", type=click.FloatRange(min=0.1), default=None,
              help="Seconds between checks (default: TRACKER_HEARTBEAT_S, 60).")
@friendly
def watch_command(home: str | None, once: bool, every: float | None, targets: tuple[str, ...]) -> None:
    """Check the store for crashed runs and undelivered alerts, and send them.

    A run counts as crashed once its heartbeat is older than two TRACKER_HEARTBEAT_S
    intervals (or its process is gone on this host); each is notified once, by
    whichever process sees it first: to the run's own targets, else to this command's
    (--to, TRACKER_NOTIFY, pyproject.toml), for runs still beating when it started.
    With a lake, the runs of dead hosts too: those the lake reads crashed, claimed
    once across all hosts in the catalog and sent to this command's targets.
    Runs until interrupted unless --once.
    """
    from tracker.host import get_host
    from tracker.notify import config
    from tracker.notify.recovery import recover
    from tracker.spool import home_dir
    from tracker.store.spoolmeta import heartbeat_s

    root = home_dir(home)
    interval = every if every is not None else heartbeat_s()
    own = config.load(list(targets) if targets else None)
    notifiers = get_host().items("notifiers")
    config.check_targets(own.targets, notifiers)
    since = time.time() - 2 * heartbeat_s()
    while True:
        counts = recover(root, notifiers, fallback=own, since=since)
        if any(counts.values()) or once:
            click.echo(f"{time.strftime('%H:%M:%S')}\tcrashed {counts['crashed']}\tsent {counts['sent']}\t"
                       f"failed {counts['failed']}")
        if once:
            return
        try:
            time.sleep(interval)
        except KeyboardInterrupt:  # pragma: no cover - interactive
            return


def register(cli: click.Group) -> None:
    cli.add_command(notify_group)
