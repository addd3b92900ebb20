"""``tracker plugins``: every plugin, its version, what it registered, and why it is unavailable."""

from __future__ import annotations

import json
import sys

import click

from tracker.cli import friendly
from tracker.commands._output import print_rows


@click.command("plugins")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@friendly
def plugins(fmt: str) -> None:
    """List plugins with what each registered."""
    from tracker.host import get_host

    rows = list(get_host().describe())
    if fmt == "json":
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table_rows = []
    for row in rows:
        registered = "; ".join(f"{kind}: {', '.join(keys)}" for kind, keys in row["registered"].items())
        status = "ok" if row["status"] is None else f"unavailable: {row['status']}"
        table_rows.append([row["name"], row["version"], registered or "-", status])
    print_rows(
        ("plugin", "version", "registered", "status"), table_rows, title="tracker plugins",
        keys=("plugin",), wrap=("registered", "status"), style=lambda column, value: None if column != "status" else
        ("green" if value == "ok" else "yellow"),
    )


def register(cli: click.Group) -> None:
    cli.add_command(plugins)
