"""``tracker plugins``: every plugin, its version, what it registered, and why it is unavailable."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from tracker.cli import friendly
from tracker.host import get_host


@click.command("plugins")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@friendly
def plugins(fmt: str) -> None:
    """List plugins with what each registered."""
    rows = list(get_host().describe())
    if fmt == "json":
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table(title="tracker plugins")
    for col in ("plugin", "version", "registered", "status"):
        table.add_column(col, overflow="fold")
    for row in rows:
        registered = "; ".join(f"{kind}: {', '.join(keys)}" for kind, keys in row["registered"].items())
        status = "[green]ok[/]" if row["status"] is None else f"[yellow]unavailable:[/] {row['status']}"
        table.add_row(row["name"], row["version"], registered or "-", status)
    Console().print(table)


def register(cli: click.Group) -> None:
    cli.add_command(plugins)
