"""``tracker sql "SELECT ..."``: run one SQL statement over the store, read-only.

The store file is opened read-only, the spool's rows are copied into temp tables,
then DuckDB's external access is switched off and its configuration locked: the
statement cannot change the store, read or write files (``read_csv``, ``COPY``,
``ATTACH``), install extensions or change settings. ``--allow-files`` keeps
external access on (the store stays read-only), for ``COPY (...) TO 'out.parquet'``
or a join with a CSV file. One statement per call: a second one is refused, never
silently dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from tracker import spool
from tracker.cli import friendly
from tracker.commands._output import format_option, print_frame
from tracker.commands.runs import home_option
from tracker.errors import StoreError
from tracker.sqlguard import single_statement

if TYPE_CHECKING:  # DuckDB and the store load when the command runs
    import duckdb


def one_statement(query: str) -> duckdb.Statement:
    """The single statement in ``query`` (DuckDB's parser), or a ConfigError saying what is wrong."""
    return single_statement(
        query,
        empty="the query is empty; e.g. tracker sql \"SELECT * FROM run_summary\"",
        many="tracker sql runs one statement per call; got {count} ({kinds}): "
             "run each in its own `tracker sql` call",
    )


def _why(exc: duckdb.Error) -> str:
    first = str(exc).splitlines()[0]
    low = first.lower()
    if "disabled by configuration" in low or "permission" in low:
        return f"query refused: file access is off in tracker sql; pass --allow-files to read or write files ({first})"
    if "locked" in low:
        return f"query refused: settings cannot be changed in tracker sql ({first})"
    if "read-only" in low or "read only" in low:
        return f"query refused: tracker sql opens the store read-only ({first})"
    return f"query failed: {first}"


@click.command("sql")
@click.argument("query")
@home_option
@click.option("--allow-files", is_flag=True,
              help="Let the statement read and write files (read_csv, COPY ... TO); the store stays read-only.")
@format_option
@click.option("--snapshot", type=int, default=None,
              help="Read the lake as of snapshot N (DuckLake time travel; see `tracker lake status`).")
@friendly
def sql(query: str, home: str | None, allow_files: bool, fmt: str, snapshot: int | None) -> None:
    """Run one read-only statement QUERY over the store: tables runs, segments, metrics,
    class_metrics, classes, events; views curves, class_curves, hidden_metrics, run_summary."""
    import duckdb

    from tracker.store import Store
    from tracker.store.local import result_frame

    statement = one_statement(query)
    store = Store(home)
    if snapshot is not None:
        from tracker.store import query as store_query

        print_frame(store_query(statement.query, home=home, snapshot=snapshot), fmt)
        return
    if spool.data_files(store.home):
        store.ingest(timeout=1.0)  # pending chunks into the tables first (a write); else a read-only open
    if allow_files:
        frame = store.query(statement.query)
    else:
        with store.reader(safe=True) as con:
            try:
                frame = result_frame(con, statement.query)
            except duckdb.Error as exc:
                raise StoreError(_why(exc)) from None
    print_frame(frame, fmt)


def register(cli: click.Group) -> None:
    cli.add_command(sql)
