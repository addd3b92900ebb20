"""What both stores do with this host's spool: the shared half of
:class:`tracker.store.local.LocalStore` and :class:`tracker.store.lake.LakeStore`.

* Readers shadow the stored tables with the spool's rows (:meth:`SpoolStore._shadow`):
  temp tables or views that add the chunks not yet ingested and the run metadata of
  the spool's valid JSON files (:mod:`tracker.spoolcheck`: a bad file leaves out its
  own run only).
* Ingestion skips chunks whose names ``ingested_files`` already holds
  (:func:`file_key`) and sets aside a chunk that cannot be read
  (:meth:`SpoolStore._set_aside_corrupt`).
* The writes of offline tools (:meth:`add_events`, :meth:`set_status`,
  :meth:`delete_run`) are written once, over the backend's one write primitive
  :meth:`SpoolStore._write` (one transaction; the lake retries conflicts).
"""

from __future__ import annotations

import abc
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from tracker import spool, spoolcheck
from tracker.errors import DataError
from tracker.store.base import IngestReport, Store
from tracker.store.spoolmeta import META_TABLES, spool_meta
from tracker.store.sqltext import inline_params

if TYPE_CHECKING:  # pragma: no cover
    import duckdb

    from tracker.events import Event

log = logging.getLogger("tracker.store.local")

DB_NAME = "tracker.duckdb"
RUN_TABLES = ("metrics", "class_metrics", "events", "segments", "classes", "ingested_files", "runs")


def file_key(path: Path) -> str:
    """A spool file's name in ``ingested_files``: ``<run_id>/<file name>``."""
    return f"{path.parent.name}/{path.name}"


def stored_fingerprint(con: duckdb.DuckDBPyConnection) -> str | None:
    """The spool fingerprint recorded by the last ingestion (None before the first)."""
    row = con.execute("SELECT fingerprint FROM spool_state WHERE id = 1").fetchone()
    return row[0] if row else None


def events_rows(run_id: str, events: Sequence[Event], rank: int, segment: int | None) -> Any:
    """``events`` of one run as an Arrow table in the shape of the ``events`` table."""
    import pyarrow as pa

    n = len(events)
    return pa.table({
        "run_id": [run_id] * n,
        "rank": pa.array([rank] * n, pa.int32()),
        "segment": pa.array([segment if segment is not None else -1] * n, pa.int32()),
        "step": pa.array([e.step for e in events], pa.int64()),
        "key": [e.key for e in events],
        "kind": [e.kind for e in events],
        "severity": [e.severity for e in events],
        "message": [e.message for e in events],
        "data": [json.dumps(e.data, default=float) for e in events],
        "wall_time": [time.time()] * n,
    })


class SpoolStore(Store):
    """A store plus the spool of this host's live runs under ``home`` (see the module doc)."""

    VIEWS: Mapping[str, str]  # the views a reader makes over the spool's rows

    def __init__(self, home: str | os.PathLike[str] | None = None):
        self.home = spool.home_dir(home)
        self.path = self.home / DB_NAME  # the local DuckDB file (a lake host's home holds only the spool)
        from tracker.notify.recovery import recover_soon

        recover_soon(self.home)  # alerts a dead run left queued, crashed runs (docs/alerts.md)

    @abc.abstractmethod
    def _write(self, work: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
        """``work(con)`` in one write transaction of the store; returns what it returned."""

    # -- ingestion helpers -------------------------------------------------------------
    def _already_ingested(self, con: duckdb.DuckDBPyConnection, files: Sequence[Path]) -> set[str]:
        """The keys of ``files`` that ``ingested_files`` already holds."""
        if not files:
            return set()
        rows = con.execute(*inline_params(
            "SELECT name FROM ingested_files WHERE name IN (SELECT unnest(?))", [[file_key(f) for f in files]]
        )).fetchall()
        return {r[0] for r in rows}

    def _set_aside_corrupt(self, files: list[Path], report: IngestReport) -> list[Path]:
        """``files`` that read in full as their table; the others go to ``<home>/corrupt/``."""
        if not files:
            return []
        import pyarrow.parquet as pq

        good = []
        for path in files:
            try:
                meta = pq.read_metadata(path)
                expected = spool.SCHEMAS[spool.table_of(path)]
                if meta.schema.to_arrow_schema().names != expected.names:
                    raise ValueError(f"columns {meta.schema.to_arrow_schema().names}")
                pq.read_table(path)
            except Exception as exc:
                dest = spoolcheck.quarantine(self.home, path)
                log.warning("tracker: corrupt spool file %s moved to %s (%s)", path, dest, exc)
                report.corrupt += 1
                continue
            good.append(path)
        return good

    # -- readers -----------------------------------------------------------------------
    def _shadow(
        self, con: duckdb.DuckDBPyConnection, materialize: bool, files: Sequence[Path], fingerprint: str
    ) -> None:
        """Temp tables/views over the stored tables plus the spool ``files`` (see module doc)."""
        done = self._already_ingested(con, files)
        pending = [f for f in files if file_key(f) not in done]
        if not pending and stored_fingerprint(con) == fingerprint:
            return  # everything is ingested: the database's own tables and views are current
        db = con.execute("SELECT current_database()").fetchone()[0]
        kind = "TABLE" if materialize else "VIEW"
        stmts: list[str] = []
        scan = spoolcheck.scan(self.home)
        pending = spoolcheck.good_chunks(pending, scan.bad_runs)
        for (name, keys), table in zip(META_TABLES, spool_meta(self.home, scan)):
            con.register(f"_spool_{name}", table)
            on = " AND ".join(f"d.{k} = s.{k}" for k in keys)
            stmts.append(
                f"CREATE TEMP {kind} {name} AS SELECT d.* FROM ({self._stored_sql(db, name)}) d "
                f"WHERE NOT EXISTS (SELECT 1 FROM _spool_{name} s WHERE {on}) "
                f"UNION ALL BY NAME SELECT * FROM _spool_{name}"
            )
        for table in spool.TABLES:
            paths = [str(p) for p in pending if spool.table_of(p) == table]
            cols = ", ".join(spool.column_names(table))
            sql = f'SELECT {cols} FROM "{db}".main.{table}'
            if paths:
                listing = "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"
                sql += f" UNION ALL SELECT {cols} FROM read_parquet({listing})"
            stmts.append(f"CREATE TEMP {kind} {table} AS {sql}")
        stmts.extend(f"CREATE TEMP VIEW {name} AS {sql}" for name, sql in self.VIEWS.items())
        con.execute(";\n".join(stmts))

    def _stored_sql(self, db: str, table: str) -> str:
        """The stored rows of metadata ``table`` as readers see them (the lake derives a
        dead run's status here: :meth:`tracker.store.lake.LakeStore._stored_sql`)."""
        return f'SELECT * FROM "{db}".main.{table}'

    # -- writes ------------------------------------------------------------------------
    def add_events(self, run_id: str, events: Sequence[Event], rank: int = 0, segment: int | None = None) -> int:
        """Insert events for a run (offline analysis); returns how many."""
        if not events:
            return 0
        rows = events_rows(run_id, events, rank, segment)

        def work(con: duckdb.DuckDBPyConnection) -> None:
            con.register("_ev", rows)
            con.execute(f"INSERT INTO events ({', '.join(rows.column_names)}) SELECT * FROM _ev")
            con.unregister("_ev")

        self._write(work)
        return len(events)

    def set_status(self, run_id: str, status: str) -> None:
        """Set a run's status in its spool metadata (if here) and in the store."""
        path = spool.run_dir(self.home, run_id) / "run.json"
        try:
            meta = spool.read_run_meta(path)
        except DataError:
            meta = None  # a bad run.json stays as it is, for `tracker doctor`
        if meta is not None:
            meta["status"] = status
            spool.atomic_write_json(path, meta)
        self._write(lambda con: con.execute("UPDATE runs SET status = ? WHERE run_id = ?", [status, run_id]))

    def delete_run(self, run_id: str) -> int:
        """Remove a run everywhere (tables and this host's spool folder). Returns rows removed."""

        def work(con: duckdb.DuckDBPyConnection) -> int:
            return sum(con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id]).fetchone()[0]
                       for table in RUN_TABLES)

        n = int(self._write(work))
        folder = spool.run_dir(self.home, run_id)
        if folder.exists():
            shutil.rmtree(folder)
        return n
