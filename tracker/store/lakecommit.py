"""What one commit writes into the lake: the schema's DDL for DuckLake, the chunks' rows,
and the run metadata with each host's backlog. Used by :class:`tracker.store.lake.LakeStore`.

Where a commit's time goes (measured with a process logging 100k-400k points/s on two
cores): the INSERT of the chunks' rows, then the run metadata (DELETE + INSERT of four
small tables), then the lookup of the chunks' names in ``ingested_files``. So a chunk
is checked by its Parquet footer only (names, columns and row count, which the commit
needs anyway); its pages are read once, by the INSERT, and only an INSERT that fails
reads every chunk in full to find the bad one (:meth:`LakeStore._commit_chunks`).
"""

from __future__ import annotations

import hashlib
import logging
import socket
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from tracker import schema, spool, spoolcheck
from tracker.store.lakespool import Backlog
from tracker.store.spoolstore import file_key
from tracker.store.spoolmeta import META_TABLES

log = logging.getLogger("tracker.store.lake")

HOSTS_COLUMNS = "host VARCHAR, home VARCHAR, pending BIGINT, committed_at TIMESTAMP, pending_rows BIGINT, backlog_s DOUBLE"
# migrations of a lake made by an older release: (schema_migrations name, statements)
MIGRATIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("hosts-backlog", ("ALTER TABLE hosts ADD COLUMN IF NOT EXISTS pending_rows BIGINT",
                       "ALTER TABLE hosts ADD COLUMN IF NOT EXISTS backlog_s DOUBLE")),
)


def lake_ddl() -> list[str]:
    """The schema's tables (without primary keys) and views, for DuckLake."""
    stmts = []
    for name, cols in {**schema.TABLES_SQL, "spool_state": "id INTEGER, fingerprint VARCHAR",
                       "hosts": HOSTS_COLUMNS, "schema_migrations": "name VARCHAR, applied_at TIMESTAMP"}.items():
        parts = [p.strip() for p in cols.replace("PRIMARY KEY (", "PRIMARY KEY(").split(",")]
        kept, skip = [], False
        for p in parts:  # drop "PRIMARY KEY(a, b)" (spans parts) and a column's " PRIMARY KEY"
            if p.startswith("PRIMARY KEY("):
                skip = not p.endswith(")")
                continue
            if skip:
                skip = not p.endswith(")")
                continue
            kept.append(p.removesuffix(" PRIMARY KEY"))
        stmts.append(f"CREATE TABLE IF NOT EXISTS {name} ({', '.join(kept)})")
    stmts.extend(f"CREATE VIEW IF NOT EXISTS {name} AS {sql}" for name, sql in schema.VIEWS_SQL.items())
    stmts.extend(f"INSERT INTO schema_migrations VALUES ('{name}', now())" for name, _ in MIGRATIONS)
    return stmts


def check_footers(home: Path, files: list[Path]) -> tuple[dict[Path, int], int]:
    """({chunk: rows} of the chunks whose footer is that of their table, chunks set aside).

    A chunk whose footer cannot be read or whose columns are not its table's goes to
    ``<home>/corrupt/`` with a warning (see :mod:`tracker.spoolcheck`)."""
    good: dict[Path, int] = {}
    bad = 0
    for path in files:
        try:
            meta = pq.read_metadata(path)
            expected = list(spool.column_names(spool.table_of(path)))
            if meta.schema.names != expected:
                raise ValueError(f"columns {meta.schema.names}, expected {expected}")
        except Exception as exc:
            dest = spoolcheck.quarantine(home, path)
            log.warning("tracker: corrupt spool file %s moved to %s (%s)", path, dest, exc)
            bad += 1
            continue
        good[path] = meta.num_rows
    return good, bad


def already_ingested(con: duckdb.DuckDBPyConnection, files: list[Path]) -> set[str]:
    """The names of ``files`` that ``ingested_files`` already holds."""
    if not files:
        return set()
    names = [file_key(f) for f in files]
    con.register("_names", pa.table({"name": names}))
    try:  # the range lets DuckLake skip data files by their min/max names: chunk names only grow
        return {r[0] for r in con.execute(
            "SELECT i.name FROM ingested_files i JOIN _names n ON i.name = n.name "
            "WHERE i.name BETWEEN ? AND ?", [min(names), max(names)]).fetchall()}
    finally:
        con.unregister("_names")


def commit_rows(con: duckdb.DuckDBPyConnection, todo: dict[Path, int]) -> tuple[int, int]:
    """Append the rows of chunks ``todo`` ({path: rows}) not yet in the lake, with their
    names in ``ingested_files``; returns (rows, chunks) committed. Inside a transaction."""
    done = already_ingested(con, list(todo))
    todo = {p: n for p, n in todo.items() if file_key(p) not in done}
    if not todo:
        return 0, 0
    for table in spool.TABLES:
        paths = [str(p) for p in todo if spool.table_of(p) == table]
        if paths:
            cols = ", ".join(spool.column_names(table))
            # no ORDER BY: sorting was 3/4 of a commit's CPU, and a key's curve reads as fast
            con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM read_parquet(?)", [paths])
    con.register("_ingest", pa.table({"name": [file_key(p) for p in todo],
                                       "run_id": [p.parent.name for p in todo], "rows": list(todo.values())}))
    con.execute("INSERT INTO ingested_files SELECT name, run_id, rows, now() FROM _ingest")
    con.unregister("_ingest")
    return sum(todo.values()), len(todo)


def commit_meta(con: duckdb.DuckDBPyConnection, tables: tuple[pa.Table, ...], home: Path, backlog: Backlog) -> None:
    """Upsert the spool's run metadata ``tables`` and this host's row in ``hosts``. Inside a transaction."""
    for (name, keys), table in zip(META_TABLES, tables):
        if table.num_rows == 0:
            continue
        con.register("_meta", table)
        on = " AND ".join(f"s.{k} = {name}.{k}" for k in keys)
        cols = ", ".join(table.column_names)
        if name == "runs":  # the newest writer of a run's row wins (a run moves between hosts)
            con.execute(f"DELETE FROM runs WHERE EXISTS (SELECT 1 FROM _meta s WHERE {on} "
                        "AND s.updated_at >= runs.updated_at)")
            con.execute(f"INSERT INTO runs ({cols}) SELECT {cols} FROM _meta s "
                        "WHERE NOT EXISTS (SELECT 1 FROM runs WHERE runs.run_id = s.run_id)")
        else:
            con.execute(f"DELETE FROM {name} WHERE EXISTS (SELECT 1 FROM _meta s WHERE {on})")
            con.execute(f"INSERT INTO {name} ({cols}) SELECT {cols} FROM _meta")
        con.unregister("_meta")
    host = socket.gethostname()
    con.execute("DELETE FROM hosts WHERE host = ? AND home = ?", [host, str(home)])
    con.execute("INSERT INTO hosts (host, home, pending, committed_at, pending_rows, backlog_s) "
                "VALUES (?, ?, ?, now(), ?, ?)", [host, str(home), backlog.chunks, backlog.rows, backlog.oldest_s])


def meta_shape(tables: tuple[pa.Table, ...]) -> str:
    """A digest of run metadata without its progress columns (``updated_at``, ``end_step``)."""
    h = hashlib.blake2b(digest_size=16)
    for table in tables:
        kept = [c for c in table.column_names if c not in ("updated_at", "end_step")]
        h.update(repr(table.select(kept).to_pydict()).encode())
    return h.hexdigest()
