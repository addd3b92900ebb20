"""The store on DuckLake: catalog in PostgreSQL, Parquet data files on shared storage.

Rules (see docs/store.md, "The lake: many machines"):

* The same tables and views as the local store (``tracker.schema``), created in the
  lake without primary keys (DuckLake has none); upserts of run metadata are
  DELETE + INSERT in one transaction.
* Extensions are LOADed from the ``duckdb-extension-*`` wheels by file path, with
  DuckDB's auto-install and auto-load switched off: nothing is downloaded, ever.
* Training processes write only their local spool. :meth:`LakeStore.ingest` commits
  every pending chunk of this host's spool in ONE append-only transaction, recording
  the chunk names in ``ingested_files`` in the same transaction (a chunk committed
  twice after a crash between commit and cleanup is skipped), under a per-spool file
  lock (several processes of one host share a spool); then the run metadata in a
  second transaction, batched (see :meth:`LakeStore.ingest`). Conflicting committers (DuckLake 1.5 races on
  snapshot ids, duckdb/ducklake #1094, #1283) are retried by DuckLake itself
  (``ducklake_max_retry_count`` raised to 100) and then by us, with exponential
  backoff and jitter.
* A catalog that cannot be reached raises :class:`StoreUnavailableError`; a rejected
  password or a missing database raises :class:`StoreError` at once. Every message
  has the password masked.
* Queries read through one read-only attachment per process, kept between queries,
  and add this host's rows still in the spool, like the local store; ``snapshot=N``
  reads the lake as of snapshot N (time travel) alone.
* A dead host's runs read as ``crashed`` everywhere: each commit of a live run's
  metadata carries its heartbeat (``runs.updated_at``, the newest of its segments'
  heartbeats), so readers on every host show a ``running`` run whose heartbeat in the
  lake is older than two ``TRACKER_HEARTBEAT_S`` plus ``TRACKER_LAKE_META_INTERVAL``
  as ``crashed`` (:func:`stale_after_s`); the row itself is left as committed, and a
  resume commits ``running`` again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

import duckdb
import polars as pl
import pyarrow as pa

from tracker import schema, spool
from tracker.errors import ConfigError, StoreError, StoreUnavailableError
from tracker.store import lakecommit
from tracker.store.lakecommit import MIGRATIONS, lake_ddl, meta_shape
from tracker.store.lakeconn import classify, is_conflict, offline_connection
from tracker.store.lakespool import Backlog, backlog
from tracker.store.base import IngestReport, on_release
from tracker.store.settings import LakeSetting, current
from tracker.store.spoolmeta import host_meta
from tracker.store.spoolmeta import stale_after_s as spool_stale_after_s
from tracker.store.spoolstore import SpoolStore
from tracker.fork import refuse_fork_push
from tracker.store.sqltext import inline_params, lock_down, sql_text

log = logging.getLogger(__name__)

ALIAS = "lake"
CONNECT_TIMEOUT_S = 3
_MIGRATED: set[str] = set()
LAKE_VIEWS = "views-m003"  # schema_migrations row: the lake's views are those of schema.m003
_SHARED: dict[tuple[int, str], duckdb.DuckDBPyConnection] = {}  # (pid, lake) -> read-only attachment
_SHARED_LOCK = threading.Lock()
_META_SENT: dict[tuple[str, Path], tuple[str, float]] = {}  # (lake, spool) -> (shape, when) of the last metadata commit
STATS = {"commits": 0, "rows": 0, "conflicts": 0, "conflicts_rows": 0, "conflicts_meta": 0, "unavailable": 0,
         "commit_s": 0.0, "commit_max_s": 0.0, "final_commit_s": 0.0}


class LakeStore(SpoolStore):
    """The store in a DuckLake, plus this host's spool under ``home``."""

    VIEWS = schema.VIEWS_SQL  # no forks in a lake (tracker.fork refuses them): the views of m003

    def __init__(self, home: str | os.PathLike[str] | None = None, setting: LakeSetting | None = None):
        super().__init__(home)
        found = setting or current()
        if found is None:
            raise ConfigError("LakeStore needs a lake: set TRACKER_STORE='ducklake:postgres:...'")
        self.setting = found

    def __repr__(self) -> str:
        return f"LakeStore({self.setting.masked()!r}, data_path={self.setting.data_path!r}, home={str(self.home)!r})"

    # -- connections -----------------------------------------------------------------
    def attach(self, read_only: bool = True, snapshot: int | None = None,
               timeout: float | None = None) -> duckdb.DuckDBPyConnection:
        """An in-memory connection with the lake attached as ``lake`` and in use."""
        con = offline_connection()
        opts = [f"DATA_PATH {sql_text(self.setting.data_path)}"]
        if read_only or snapshot is not None:
            opts.append("READ_ONLY")
        if snapshot is not None:
            opts.append(f"SNAPSHOT_VERSION {int(snapshot)}")
        target = self.setting.attach_target(timeout or CONNECT_TIMEOUT_S)
        try:
            for attempt in range(6):
                try:
                    con.execute(f"ATTACH {sql_text(target)} AS {ALIAS} ({', '.join(opts)})")
                    break
                except duckdb.Error as exc:  # two hosts creating a new catalog at once: one wins
                    low = str(exc).lower()
                    if attempt == 5 or not ("duplicate key" in low or "already exists" in low):
                        raise
                    time.sleep(0.1 * (attempt + 1) * (0.5 + random.random()))
            con.execute(f"USE {ALIAS}")
            if self.setting.key() not in _MIGRATED and snapshot is None:
                self._migrate(con, read_only)
        except duckdb.Error as exc:
            con.close()
            raise classify(self.setting, exc) from None
        except Exception:
            con.close()
            raise
        return con

    def _migrate(self, con: duckdb.DuckDBPyConnection, read_only: bool) -> None:
        have = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_catalog = ?", [ALIAS]).fetchall()}
        wanted = {*schema.TABLES_SQL, *schema.VIEWS_SQL, "spool_state", "hosts", "schema_migrations"}
        if not wanted <= have:
            if read_only:
                raise StoreError(f"the lake {self.setting.masked()} has no tracker tables yet; "
                                 "run `tracker lake init`")
            self._retrying(lambda c: [c.execute(s) for s in lake_ddl()], con)
        done = {r[0] for r in con.execute("SELECT DISTINCT name FROM schema_migrations").fetchall()}
        if LAKE_VIEWS not in done:  # views of an older release: re-create them (a reader waits for a writer)
            if read_only:
                return
            self._retrying(lambda c: [c.execute(s) for s in (
                *(f"CREATE OR REPLACE VIEW {name} AS {sql}" for name, sql in schema.VIEWS_SQL.items()),
                f"INSERT INTO schema_migrations VALUES ('{LAKE_VIEWS}', now())")], con)
        for name, stmts in MIGRATIONS:  # columns added since (IF NOT EXISTS: two writers may race)
            if name in done:
                continue
            if read_only:
                return
            self._retrying(lambda c, todo=(*stmts, f"INSERT INTO schema_migrations VALUES ('{name}', now())"):
                           [c.execute(x) for x in todo], con)
        _MIGRATED.add(self.setting.key())

    def init(self) -> list[str]:
        """Create the catalog's tables and views (idempotent); returns the tables now there."""
        _MIGRATED.discard(self.setting.key())
        con = self.attach(read_only=False)
        try:
            return [r[0] for r in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_catalog = ? ORDER BY 1",
                [ALIAS]).fetchall()]
        finally:
            con.close()

    def _retrying(self, work: Any, con: duckdb.DuckDBPyConnection, attempts: int = 8, what: str = "") -> Any:
        """Run ``work(con)`` in a transaction; retry conflicts with exponential backoff and jitter."""
        delay = 0.05
        for attempt in range(attempts):
            start = time.perf_counter()
            con.execute("BEGIN")
            try:
                out = work(con)
                con.execute("COMMIT")
                spent = time.perf_counter() - start
                STATS["commits"] += 1
                STATS["commit_s"] += spent
                STATS["commit_max_s"] = max(STATS["commit_max_s"], spent)
                return out
            except duckdb.Error as exc:
                with contextlib.suppress(duckdb.Error):
                    con.execute("ROLLBACK")
                if not is_conflict(exc) or attempt == attempts - 1:
                    raise
                STATS["conflicts"] += 1
                if what:
                    STATS[f"conflicts_{what}"] += 1
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def connect(self, write: bool = False, timeout: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short connection to the lake; read-only unless ``write``."""
        con = self.attach(read_only=not write, timeout=timeout)
        try:
            yield con
        finally:
            con.close()

    # -- commits -----------------------------------------------------------------------
    @contextlib.contextmanager
    def _spool_lock(self, shared: bool = False) -> Iterator[None]:
        """Committers hold it exclusively; readers of the spool's files share it."""
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / ".lake-commit.lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def ingest(self, timeout: float | None = None, con: duckdb.DuckDBPyConnection | None = None,
               final: bool = True) -> IngestReport:
        """Commit this host's pending spool chunks into the lake (idempotent).

        Two transactions: the rows (appends only, with their chunk names in
        ``ingested_files``), then the run metadata (runs, segments, classes, hosts:
        DELETE + INSERT). Appends of several hosts do not conflict in DuckLake; deletes
        do, so a live run's metadata is committed at once only when something other
        than its progress changed (a new run, segment, status or class list), and its
        progress (``end_step``, ``updated_at``) at most every ``TRACKER_LAKE_META_INTERVAL``
        seconds (default 5), or now when ``final``. The metadata committed is the one
        read before the chunks were listed, and rows go first, so a segment's ``end_step``
        in the lake never claims a step whose rows are not in it. The ``hosts`` row
        records what the spool still holds after the commit (chunks, rows, age).

        ``con``: a connection from :meth:`attach` kept by a committer between commits
        (attaching costs a second on a busy machine); None: attach and close here.
        """
        report = IngestReport()
        with self._spool_lock():
            for tmp in spool.stale_temp_files(self.home):
                with contextlib.suppress(OSError):
                    tmp.unlink()
            fingerprint = spool.meta_fingerprint(self.home)
            meta_due = not self._meta_committed(fingerprint)
            # the metadata is read BEFORE the chunks are listed: a segment file claims a step only
            # once the chunk holding it is in place, so every step it claims is in a chunk listed
            # below (or in the lake already) and the lake's segments never run ahead of its rows
            tables = host_meta(self.home) if meta_due else None
            files = spool.data_files(self.home)
            if not files and not meta_due:
                return report
            own = con is None
            con = self.attach(read_only=False, timeout=timeout) if con is None else con
            try:
                if files:
                    self._commit_chunks(con, files, report)
                    for p in files:  # all in the lake now (or set aside as corrupt)
                        with contextlib.suppress(OSError):
                            p.unlink()
                if tables is not None:
                    self._commit_progress(con, tables, fingerprint, final)
            except duckdb.Error as exc:
                raise classify(self.setting, exc) from None
            finally:
                if own:
                    con.close()
        STATS["rows"] += report.rows
        return report

    def _commit_chunks(self, con: duckdb.DuckDBPyConnection, files: list[Path], report: IngestReport) -> None:
        """The rows of ``files`` in one transaction; a chunk that cannot be read is set aside.

        Footers are checked first (cheap); only when the INSERT fails for another reason
        than a conflict or the catalog is every chunk read in full, the bad ones set aside,
        and the rest committed."""
        todo, report.corrupt = lakecommit.check_footers(self.home, files)
        if not todo:
            return
        try:
            report.rows, report.files = self._retrying(lambda c: self._commit_rows(c, todo), con, what="rows")
        except duckdb.Error as exc:
            if is_conflict(exc) or isinstance(classify(self.setting, exc), StoreUnavailableError):
                raise
            kept = self._set_aside_corrupt(list(todo), report)
            if len(kept) == len(todo):
                raise
            todo = {p: todo[p] for p in kept}
            report.rows, report.files = self._retrying(lambda c: self._commit_rows(c, todo), con, what="rows")

    def _commit_progress(self, con: duckdb.DuckDBPyConnection, tables: tuple[pa.Table, ...],
                         fingerprint: str, final: bool) -> None:
        """Commit the run metadata ``tables`` when due (see :meth:`ingest`)."""
        shape = meta_shape(tables)
        last = _META_SENT.get((self.setting.key(), self.home))
        interval = meta_interval_s()
        if not (final or last is None or last[0] != shape or time.monotonic() - last[1] >= interval):
            return
        left = backlog(self.home)
        try:  # between two runs' rows, a conflict just waits for the next commit
            self._retrying(lambda c: self._commit_meta(c, tables, left), con, attempts=8 if final else 1, what="meta")
        except duckdb.Error as exc:
            if final or not is_conflict(exc):
                raise
            STATS["conflicts"] += 1
            STATS["conflicts_meta"] += 1
        else:
            self._meta_committed(fingerprint, record=True)
            _META_SENT[(self.setting.key(), self.home)] = (shape, time.monotonic())

    def _meta_committed(self, fingerprint: str, record: bool = False) -> bool:
        """Was this spool's metadata (``fingerprint``) already committed to this lake?"""
        import hashlib

        marker = self.home / f".lake-{hashlib.sha256(self.setting.key().encode()).hexdigest()[:12]}"
        if record:
            spool.atomic_write_bytes(marker, fingerprint.encode(), durable=False)
            return True
        if not spool.runs_dir(self.home).is_dir():
            return True  # nothing of this host's to commit
        try:
            return marker.read_text() == fingerprint
        except OSError:
            return False

    def _commit_rows(self, con: duckdb.DuckDBPyConnection, todo: dict[Path, int]) -> tuple[int, int]:
        return lakecommit.commit_rows(con, todo)

    def _commit_meta(self, con: duckdb.DuckDBPyConnection, tables: tuple[pa.Table, ...], left: Backlog) -> None:
        lakecommit.commit_meta(con, tables, self.home, left)

    # -- queries -----------------------------------------------------------------------
    @contextlib.contextmanager
    def reader(self, safe: bool = False, memory_limit: str | None = None,
               snapshot: int | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection to the lake plus this host's spool rows (or snapshot ``N`` alone).

        ``safe`` and ``memory_limit`` as for the local store's reader (user-typed SQL).
        Plain readers share one attached connection per process (attaching costs a few
        hundred ms; each query is its own transaction and sees the newest snapshot);
        ``safe`` and snapshot readers attach their own."""
        with contextlib.ExitStack() as stack:
            if snapshot is None:  # the committer must not remove spool files this reader lists
                stack.enter_context(self._spool_lock(shared=True))
            if snapshot is None and not safe:
                con = stack.enter_context(contextlib.closing(self._shared_cursor()))
            else:
                con = stack.enter_context(contextlib.closing(self.attach(read_only=True, snapshot=snapshot)))
            try:
                if snapshot is None:
                    files = spool.data_files(self.home)
                    self._shadow(con, safe, files, spool.meta_fingerprint(self.home))
                if safe:
                    lock_down(con, memory_limit)
            except duckdb.Error as exc:
                raise self._failed(exc) from None
            yield con

    def _stored_sql(self, db: str, table: str) -> str:
        """The lake's rows of ``table``; a ``running`` run whose heartbeat in the lake
        (``updated_at``) is older than :func:`stale_after_s` reads as ``crashed`` (a host that
        died commits nothing more; a resume commits ``running`` with a new heartbeat)."""
        sql = f'SELECT * FROM "{db}".main.{table}'
        if table != "runs":
            return sql
        cutoff = datetime.fromtimestamp(time.time() - stale_after_s(), tz=timezone.utc).replace(tzinfo=None)
        return (f"SELECT * REPLACE (CASE WHEN status = 'running' AND updated_at < TIMESTAMP '{cutoff.isoformat(' ')}' "
                f"THEN 'crashed' ELSE status END AS status) FROM \"{db}\".main.runs")

    def _shared_cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor on this process's cached read-only attachment of the lake."""
        key = (os.getpid(), self.setting.key())
        with _SHARED_LOCK:
            base = _SHARED.get(key)
            if base is None:
                base = _SHARED[key] = self.attach(read_only=True)
        try:
            con = base.cursor()
            con.execute(f"USE {ALIAS}")
            return con
        except duckdb.Error as exc:
            raise self._failed(exc) from None

    def _failed(self, exc: BaseException) -> StoreError:
        """``classify(exc)``; an unreachable catalog also drops the cached attachment."""
        found = classify(self.setting, exc)
        if isinstance(found, StoreUnavailableError):
            with _SHARED_LOCK:
                base = _SHARED.pop((os.getpid(), self.setting.key()), None)
            if base is not None:
                with contextlib.suppress(duckdb.Error):
                    base.close()
        return found

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None,
              snapshot: int | None = None) -> pl.DataFrame:
        """Run ``sql`` over the lake (and this host's spool); ``snapshot`` reads an older version."""
        sql, params = inline_params(sql, params)
        with self.reader(snapshot=snapshot) as con:
            try:
                return con.execute(sql, params).pl() if params is not None else con.execute(sql).pl()
            except duckdb.Error as exc:
                found = self._failed(exc)
                if isinstance(found, StoreUnavailableError):
                    raise found from None
                raise StoreError(f"query failed: {self.setting.scrub(str(exc)).splitlines()[0]}\n"
                                 f"  in: {sql.strip()[:200]}") from None

    def snapshots(self) -> pl.DataFrame:
        """The lake's snapshots (id, time, changes)."""
        with self.connect() as con:
            return con.execute(
                f"SELECT snapshot_id, CAST(snapshot_time AS VARCHAR) AS snapshot_time, "
                f"CAST(changes AS VARCHAR) AS changes FROM {ALIAS}.snapshots() ORDER BY snapshot_id").pl()

    def push_run(self, source: Path, run_id: str) -> bool:
        """Copy run ``run_id`` from the local DuckDB file ``source``; False when already in the lake."""
        con = self.attach(read_only=False)
        try:
            con.execute(f"ATTACH {sql_text(str(source))} AS src (READ_ONLY)")

            def work(c: duckdb.DuckDBPyConnection) -> bool:
                if c.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]:
                    return False
                refuse_fork_push(c, run_id)
                for table in ("runs", "segments", "classes", "metrics", "class_metrics", "events", "ingested_files"):
                    cols = ", ".join(r[0] for r in c.execute(  # those of the lake's table too (no lineage there)
                        "SELECT column_name FROM information_schema.columns WHERE table_catalog = 'src' "
                        "AND table_name = ? AND column_name IN (SELECT column_name FROM information_schema.columns "
                        f"WHERE table_catalog = '{ALIAS}' AND table_name = ?) ORDER BY ordinal_position",
                        [table, table]).fetchall())
                    c.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM src.main.{table} WHERE run_id = ?",
                              [run_id])
                return True

            return bool(self._retrying(work, con))
        except duckdb.Error as exc:
            raise classify(self.setting, exc) from None
        finally:
            con.close()

    # -- writes ------------------------------------------------------------------------
    def _write(self, work: Any) -> Any:
        con = self.attach(read_only=False)
        try:
            return self._retrying(work, con)
        except duckdb.Error as exc:
            raise classify(self.setting, exc) from None
        finally:
            con.close()

    def prepare_run(self, run_id: str, rank: int, resume: str) -> None:
        """Check the lake and its credentials, and bring run ``run_id``'s lake metadata into this
        host's spool (:func:`tracker.store.lakerun.prepare_run`)."""
        from tracker.store.lakerun import prepare_run

        prepare_run(self, run_id, rank, resume)


def meta_interval_s() -> float:
    """``TRACKER_LAKE_META_INTERVAL``: seconds between two commits of a live run's progress (default 5)."""
    return float(os.environ.get("TRACKER_LAKE_META_INTERVAL", "5"))


def stale_after_s() -> float:
    """Seconds after which a run ``running`` in the lake whose heartbeat (``runs.updated_at``)
    has not moved is dead: two heartbeat intervals (:func:`tracker.store.spoolmeta.stale_after_s`,
    the rule of every host) plus the interval at which the lake receives the heartbeat."""
    return spool_stale_after_s() + meta_interval_s()


@on_release
def release_shared() -> None:
    """Close this process's cached read-only attachments of every lake (and their catalog connections)."""
    with _SHARED_LOCK:
        found = list(_SHARED.values())
        _SHARED.clear()
    for con in found:
        with contextlib.suppress(duckdb.Error):
            con.close()
