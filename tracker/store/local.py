"""The DuckDB store: one file, short connections, idempotent ingestion of spool files.

Rules:

* DuckDB lets one process hold a file read-write, or many hold it read-only, never
  both. Every connection here is short (open, work, close), opening retries on the
  file lock and gives a clear :class:`StoreLockedError` after a bounded wait
  (``TRACKER_LOCK_TIMEOUT`` seconds, default 15). Within a process, connections are
  serialised by a lock, since DuckDB refuses two configurations of one file.
* Ingestion (:meth:`LocalStore.ingest`) inserts spool files' rows and records their names
  in ``ingested_files`` in one transaction, then removes the files while still holding
  the write lock. A crash between commit and removal leaves files whose names are
  recorded: readers skip them and the next ingestion removes them. A file that cannot
  be read is moved to ``<home>/corrupt/`` with a warning; nothing is deleted unread.
* A bad file affects only its own run (:mod:`tracker.spoolcheck`): a run whose ``run.json``
  or a segment file is invalid is left out of readers and ingestion, an unreadable
  chunk is left out of readers, each with one warning naming the file.
* Queries (:meth:`LocalStore.query`) open the file read-only and shadow the tables with
  temp views that add the rows still in spool files, so they see everything flushed,
  without waiting for ingestion and without blocking a training process. The first
  read-only open of a process attaches the file to a DuckDB instance made on a
  thread when this module was imported (:class:`_SpareEngine`): a new instance
  costs about 10 ms, which then overlaps the imports instead of the first query.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import duckdb


class _SpareEngine:
    """One in-memory DuckDB instance made ahead of need, on a thread, for the next
    read-only open (which then only attaches the file: about 3 ms).

    A new DuckDB instance spends about 10 ms building its function catalog, in C++
    with the interpreter lock released, so made at import it overlaps the imports
    below (polars) and whatever the caller does before its first query.
    ``TRACKER_PREWARM=0`` switches it off. An instance made before a fork is not used
    in the child.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._made: tuple[int, duckdb.DuckDBPyConnection] | None = None

    def start(self) -> None:
        if os.environ.get("TRACKER_PREWARM", "1") == "0":
            return
        with self._lock:
            if self._thread is not None:
                return
            pid = os.getpid()

            def make() -> None:
                with contextlib.suppress(Exception):
                    self._made = (pid, duckdb.connect())

            self._thread = threading.Thread(target=make, name="tracker-duckdb-spare", daemon=True)
            self._thread.start()

    def take(self) -> duckdb.DuckDBPyConnection | None:
        """The spare instance (waiting for it if it is being made), or None."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return None
        thread.join()
        made, self._made = self._made, None
        return made[1] if made is not None and made[0] == os.getpid() else None

    def close(self) -> None:
        """At exit: no thread may be inside DuckDB when the interpreter goes."""
        spare = self.take()
        if spare is not None:
            spare.close()


_SPARE = _SpareEngine()
_SPARE.start()
atexit.register(_SPARE.close)

import polars as pl  # noqa: E402  (after the spare engine started: its import overlaps it)

from tracker import schema, spool, spoolcheck
from tracker.errors import ConfigError, StoreError, StoreLockedError
from tracker.store.base import IngestReport, on_release
from tracker.store.spoolmeta import META_TABLES, spool_meta
from tracker.store.spoolstore import DB_NAME, SpoolStore, file_key, stored_fingerprint
from tracker.store.sqltext import inline_params, lock_down, sql_text

log = logging.getLogger(__name__)

_DB_ALIAS = "tracker"  # the name DuckDB gives the file when it opens it directly

_PROCESS_LOCK = threading.RLock()
_MIGRATED: set[Path] = set()


class _ReaderCache:
    """At most one idle read-only connection per process, closed after a short idle time."""

    def __init__(self) -> None:
        self.entry: tuple[Path, Any, duckdb.DuckDBPyConnection] | None = None
        self.timer: threading.Timer | None = None

    def take(self, path: Path, state: Any) -> duckdb.DuckDBPyConnection | None:
        if self.entry is None:
            return None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        cached_path, cached_state, con = self.entry
        if cached_path == path and cached_state == state:
            self.entry = None
            return con
        self.drop()
        return None

    def keep(self, path: Path, state: Any, con: duckdb.DuckDBPyConnection) -> None:
        idle = float(os.environ.get("TRACKER_READER_IDLE_S", "0.5"))
        if idle <= 0:
            con.close()
            return
        self.drop()
        self.entry = (path, state, con)
        self.timer = threading.Timer(idle, self._expire, args=(con,))
        self.timer.daemon = True
        self.timer.start()

    def _expire(self, con: duckdb.DuckDBPyConnection) -> None:
        with _PROCESS_LOCK:
            if self.entry is not None and self.entry[2] is con:
                self.drop()

    def drop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.entry is not None:
            self.entry[2].close()
            self.entry = None


_READERS = _ReaderCache()


def _lock_timeout() -> float:
    return float(os.environ.get("TRACKER_LOCK_TIMEOUT", "15"))


class LocalStore(SpoolStore):
    """The store under ``home``: the DuckDB file plus the spool of live runs."""

    VIEWS = schema.LOCAL_VIEWS_SQL  # the views a reader makes over the spool's rows (the lake: schema.VIEWS_SQL)

    def __repr__(self) -> str:
        return f"LocalStore({str(self.home)!r})"

    # -- connections -----------------------------------------------------------------
    def _connection(self, write: bool, timeout: float | None) -> duckdb.DuckDBPyConnection:
        """Open (retrying on the lock) and migrate once per process. Caller holds _PROCESS_LOCK."""
        if not write and not self.path.exists():
            write = True  # the first connection creates and migrates the file
        con = self._open(write, timeout)
        if self.path not in _MIGRATED:
            try:
                if write:
                    applied = schema.migrate(con)
                elif not schema.is_current(con):
                    con.close()
                    con = self._open(True, timeout)
                    applied = schema.migrate(con)
                else:
                    applied = []
                if applied:  # into the file at once, not left in the write-ahead log
                    con.execute("CHECKPOINT")
            except Exception:
                con.close()
                raise
            _MIGRATED.add(self.path)
        return con

    @contextlib.contextmanager
    def connect(self, write: bool = False, timeout: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short connection; read-only unless ``write``. Retries on the file lock."""
        with _PROCESS_LOCK:
            _READERS.drop()
            con = self._connection(write, timeout)
            try:
                yield con
            finally:
                if write:  # fold the write-ahead log into the file now: every read-only open replays it
                    with contextlib.suppress(duckdb.Error):
                        con.execute("CHECKPOINT")
                con.close()

    def _open(self, write: bool, timeout: float | None) -> duckdb.DuckDBPyConnection:
        if write:
            self.home.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + (_lock_timeout() if timeout is None else timeout)
        delay = 0.01
        spare = None if write else _SPARE.take()
        try:
            while True:
                try:
                    if spare is None:
                        return duckdb.connect(str(self.path), read_only=not write)
                    spare.execute(f"ATTACH {sql_text(str(self.path))} AS {_DB_ALIAS} (READ_ONLY)")
                    spare.execute(f"USE {_DB_ALIAS}")
                    con, spare = spare, None
                    return con
                except duckdb.IOException as exc:
                    msg = str(exc)
                    if "lock" not in msg.lower() or time.monotonic() >= deadline:
                        if "lock" in msg.lower():
                            raise StoreLockedError(
                                f"store {self.path} is locked by another process ({msg.splitlines()[0]}); "
                                "it is retried for TRACKER_LOCK_TIMEOUT seconds: close the other writer "
                                "or raise TRACKER_LOCK_TIMEOUT"
                            ) from None
                        raise StoreError(f"cannot open store {self.path}: {msg}") from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.2)
        finally:
            if spare is not None:
                spare.close()

    # -- ingestion ---------------------------------------------------------------------
    def ingest(self, timeout: float | None = None) -> IngestReport:
        """Move spool files into the tables (idempotent, crash-safe). See module doc."""
        report = IngestReport()
        for tmp in spool.stale_temp_files(self.home):
            with contextlib.suppress(OSError):
                tmp.unlink()
        # the fingerprint is taken BEFORE the metadata is read: a run.json or segment file that
        # changes after this point (a rank finishing while another ingests) leaves the stored
        # fingerprint behind the spool's, so readers rebuild from the files instead of trusting
        # a row read before the change
        fingerprint = spool.meta_fingerprint(self.home)
        scan = spoolcheck.scan(self.home)
        files = [f for f in spool.data_files(self.home) if f.parent.name not in scan.bad_runs]
        try:
            ctx = self.connect(write=True, timeout=timeout)
            con = ctx.__enter__()
        except StoreLockedError:
            report.skipped_locked = True
            return report
        try:
            done = self._already_ingested(con, files)
            todo = [f for f in files if file_key(f) not in done]
            todo = self._set_aside_corrupt(todo, report)
            if todo or stored_fingerprint(con) != fingerprint:  # else nothing new: no write
                con.execute("BEGIN")
                try:
                    self._upsert_meta(con, scan, fingerprint)
                    for table in spool.TABLES:
                        paths = [str(p) for p in todo if spool.table_of(p) == table]
                        if paths:
                            cols = ", ".join(spool.column_names(table))
                            order = "run_id, key, step" if table != "events" else "run_id, step"
                            con.execute(*inline_params(
                                f"INSERT INTO {table} ({cols}) SELECT {cols} FROM read_parquet(?) "
                                f"ORDER BY {order}",
                                [paths],
                            ))
                    if todo:
                        import pyarrow as pa  # only with files to record: a call with none never loads it
                        import pyarrow.parquet as pq

                        names = [file_key(p) for p in todo]
                        rows = [pq.read_metadata(p).num_rows for p in todo]
                        runs = [p.parent.name for p in todo]
                        con.register("_ingest", pa.table({"name": names, "run_id": runs, "rows": rows}))
                        con.execute("INSERT INTO ingested_files SELECT name, run_id, rows, now() FROM _ingest")
                        report.rows = sum(rows)
                    con.execute("COMMIT")
                except Exception:
                    con.execute("ROLLBACK")
                    raise
            report.files = len(todo)
            for p in [*todo, *(f for f in files if file_key(f) in done)]:
                with contextlib.suppress(OSError):
                    p.unlink()
        finally:
            ctx.__exit__(None, None, None)
        return report

    def _upsert_meta(self, con: duckdb.DuckDBPyConnection, scan: spoolcheck.SpoolScan, fingerprint: str) -> None:
        con.execute(*inline_params("INSERT OR REPLACE INTO spool_state VALUES (1, ?)", [fingerprint]))
        for (name, _keys), table in zip(META_TABLES, spool_meta(self.home, scan)):
            if table.num_rows == 0:
                continue
            con.register("_meta", table)
            cols = ", ".join(table.column_names)
            con.execute(f"INSERT OR REPLACE INTO {name} ({cols}) SELECT {cols} FROM _meta")
            con.unregister("_meta")

    # -- queries -----------------------------------------------------------------------
    @contextlib.contextmanager
    def reader(self, safe: bool = False, memory_limit: str | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection whose tables and views include the spool's rows.

        ``safe=True`` copies the spool rows into temp tables and then switches off
        external access and locks the configuration (for user-typed SQL), after setting
        DuckDB's ``memory_limit`` (e.g. ``"1GB"``) when given and switching off spilling. Otherwise
        the connection is kept for ``TRACKER_READER_IDLE_S`` (default 0.5 s) after use,
        so a burst of queries opens the file once; it is reused only while the spool
        is unchanged, and dropped before any write in this process.
        """
        with _PROCESS_LOCK:
            files = spool.data_files(self.home)
            state = (tuple(files), spool.meta_fingerprint(self.home))
            con = None if safe else _READERS.take(self.path, state)
            if con is None:
                _READERS.drop()
                con = self._shadowed(safe, files, state[1], memory_limit)
            keep = False
            try:
                yield con
                keep = not safe
            finally:
                if keep:
                    _READERS.keep(self.path, state, con)
                else:
                    con.close()

    def _shadowed(
        self, safe: bool, files: Sequence[Path], fingerprint: str, memory_limit: str | None = None
    ) -> duckdb.DuckDBPyConnection:
        """A read-only connection with the spool's rows (a chunk that fails to read is left out)."""
        for attempt in (0, 1):
            con = self._connection(False, None)
            try:
                self._shadow(con, safe, files, fingerprint)
                if safe:
                    lock_down(con, memory_limit)
                return con
            except duckdb.Error as exc:
                con.close()
                if attempt == 1 or not _recheck_chunks(files):
                    raise StoreError(f"cannot read the spool under {self.home}: {str(exc).splitlines()[0]}") from None
            except Exception:
                con.close()
                raise
        raise AssertionError("unreachable")

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None,
              snapshot: int | None = None) -> pl.DataFrame:
        """Run ``sql`` over everything logged so far; returns a polars DataFrame.

        ``snapshot`` needs the lake (a ConfigError here: the DuckDB file keeps no snapshots)."""
        if snapshot is not None:
            raise ConfigError(
                f"snapshot={snapshot!r} needs the lake store (time travel); the local DuckDB file keeps no "
                "snapshots: set TRACKER_STORE='ducklake:postgres:...' or drop snapshot"
            )
        sql, params = inline_params(sql, params)
        for attempt in (0, 1):
            with self.reader() as con:
                try:
                    return result_frame(con, sql, params)
                except duckdb.Error as exc:
                    if attempt == 0 and _recheck_chunks(spool.data_files(self.home)):
                        continue  # an unreadable chunk was found and is now left out
                    raise StoreError(f"query failed: {str(exc).splitlines()[0]}\n  in: {sql.strip()[:200]}") from None
        raise AssertionError("unreachable")

    # -- writes ------------------------------------------------------------------------
    def _write(self, work: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
        """``work(con)`` in one transaction of a short write connection."""
        with self.connect(write=True) as con:
            con.execute("BEGIN")
            try:
                out = work(con)
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")
            return out


Store = LocalStore  # this module's name of it before the interface (tracker.store.Store) existed


# column types polars takes through the Arrow C stream with the same result as through pyarrow
_STREAMED_TYPES = frozenset({
    "boolean", "tinyint", "smallint", "integer", "bigint", "hugeint", "utinyint", "usmallint", "uinteger",
    "ubigint", "float", "double", "decimal", "varchar", "blob", "uuid", "date", "time", "timestamp",
    "timestamp with time zone",
})


def _streams(t: duckdb.DuckDBPyType) -> bool:
    """True for a column type that streams into polars as pyarrow would give it: a flat one, or a list of one."""
    return _streams(t.children[0][1]) if t.id == "list" else t.id in _STREAMED_TYPES


def result_frame(con: duckdb.DuckDBPyConnection, sql: str, params: Any = None) -> pl.DataFrame:
    """The result of ``sql`` as a polars DataFrame.

    A lone SELECT without parameters whose columns are all flat types or lists of them
    (a run's tags) streams into polars through the Arrow C interface, without pyarrow:
    a CLI query of a store with no live runs then never loads pyarrow and numpy (about
    0.1 s). Anything else goes through DuckDB's ``.pl()`` (structs, maps, arrays and
    INTERVAL columns, statements that are not queries, parameters), which gives the
    same frames.
    """
    if params is None:
        statements = con.extract_statements(sql)
        if len(statements) == 1 and statements[0].type == duckdb.StatementType.SELECT:
            rel = con.sql(sql)
            if rel is not None and all(_streams(t) for t in rel.types):
                return pl.DataFrame(rel)
        return con.execute(sql).pl()
    return con.execute(sql, params).pl()


def _recheck_chunks(files: Sequence[Path]) -> bool:
    """Read every row of ``files``; True when that found a chunk not yet known to be bad."""
    return len(spoolcheck.good_chunks(files, set())) > len(spoolcheck.good_chunks(files, set(), deep=True))


@on_release
def release() -> None:
    """Close this process's idle cached reader of the DuckDB file now (before another tool opens it)."""
    with _PROCESS_LOCK:
        _READERS.drop()
