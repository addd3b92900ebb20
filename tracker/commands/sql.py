"""``tracker sql "SELECT ..."``: run SQL over the store (read-only)."""

from __future__ import annotations

import click

from tracker.cli import friendly
from tracker.commands._output import format_option, print_frame
from tracker.commands.runs import home_option
from tracker.store import Store


@click.command("sql")
@click.argument("query")
@home_option
@format_option
@click.option("--snapshot", type=int, default=None,
              help="Read the lake as of snapshot N (DuckLake time travel; see `tracker lake status`).")
@friendly
def sql(query: str, home: str | None, fmt: str, snapshot: int | None) -> None:
    """Run QUERY over the store: tables runs, segments, metrics, class_metrics, classes,
    events; views curves, class_curves, hidden_metrics, run_summary."""
    store = Store(home)
    if snapshot is not None:
        from tracker.store import query as store_query

        print_frame(store_query(query, home=home, snapshot=snapshot), fmt)
        return
    store.ingest(timeout=1.0)
    print_frame(store.query(query), fmt)


def register(cli: click.Group) -> None:
    cli.add_command(sql)
