"""``tracker doctor [--fix]``: list the store's bad files, and set them aside."""

from __future__ import annotations

import sys

import click

from tracker.cli import friendly
from tracker.commands.runs import home_option


@click.command("doctor")
@home_option
@click.option("--fix", is_flag=True, help="Move the bad files to <TRACKER_HOME>/corrupt/<run_id>/.")
@friendly
def doctor_command(home: str | None, fix: bool) -> None:
    """Check every run.json, segment file and data chunk in the spool, and the database.

    Exits 1 when a problem is found (after --fix: when one is left). A bad file affects
    only its own run: readers leave that run's spool out until the file is fixed or set aside.
    """
    from tracker import doctor
    from tracker.store import open_store

    store = open_store(home)
    problems = doctor.check(store.home)
    if not problems:
        click.echo(f"no problems found in {store.home}")
        return
    for p in problems:
        click.echo(f"{p.kind}\t{p.run_id or '-'}\t{p.message}")
    if not fix:
        click.echo(f"{len(problems)} problem(s); `tracker doctor --fix` moves the bad files to "
                   f"{store.home / doctor.QUARANTINE}/", err=True)
        sys.exit(1)
    moved = doctor.fix(store.home, problems)
    for p, dest in moved:
        note = " (a placeholder keeps the segment's number)" if p.kind == "segment" else ""
        click.echo(f"moved {p.path} -> {dest}{note}")
    left = [p for p in problems if p not in {m[0] for m in moved}]
    if left:
        click.echo(f"{len(left)} problem(s) cannot be set aside (the database itself): restore it from a backup",
                   err=True)
        sys.exit(1)


def register(cli: click.Group) -> None:
    cli.add_command(doctor_command)
