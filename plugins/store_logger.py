"""The default logger: the run's rows as crash-safe Parquet chunks in the spool.

Each ``write`` adds immutable chunks (see :mod:`tracker.spool`; the run's metadata
files are the core's). The session is ``durable``: the core advances the segment's
``last_step`` only after ``write`` returned, so the segment JSON never claims rows
whose chunk is not in place. A write that fails (disk full) removes its temp file
and raises; the core retries the same batch, and chunks already in place are not
written twice. ``close`` ingests into DuckDB when the store is free within a
short wait (``TRACKER_INGEST_TIMEOUT``, default 2 s; ``TRACKER_INGEST_ON_FINISH=0``
skips it); otherwise the rows stay in the spool, where queries see them, until the
next ingestion.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tracker import hookimpl
from tracker.loggers import Batch
from tracker.spool import atomic_write_table, run_dir

if TYPE_CHECKING:  # pragma: no cover
    from tracker.run import Run

log = logging.getLogger(__name__)


class StoreSession:
    durable = True

    def __init__(self, run: "Run"):
        self.run = run
        self.folder = run_dir(run.home, run.run_id)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._written: tuple[int, set[str]] = (-1, set())  # (seq, tables in place) of a retried batch
        from tracker.store.lakerun import acquire

        self.committer = acquire(run.home)  # commits into the lake off the training thread; None: local

    def write(self, batch: Batch) -> None:
        prefix = f"r{self.run.rank}-s{self.run.segment:04d}-{batch.seq:06d}"
        if self._written[0] != batch.seq:
            if self.committer is not None:  # the lake's backpressure (see tracker.store.lakerun)
                self.committer.admit(batch.rows)
            self._written = (batch.seq, set())
        done = self._written[1]
        for table_name, table in (
            ("metrics", batch.metrics), ("class_metrics", batch.class_metrics), ("events", batch.events)
        ):
            if table is not None and table.num_rows and table_name not in done:
                atomic_write_table(self.folder / f"{prefix}.{table_name}.parquet", table)
                done.add(table_name)

    def close(self, status: str) -> None:
        if self.committer is not None:
            from tracker.store.lakerun import release

            # a last commit, retried until shortly before finish()'s deadline; then the rows stay spooled
            deadline = getattr(self.run, "finish_deadline", None) or time.monotonic() + self.run.logger_timeout
            left = deadline - time.monotonic()
            release(self.committer, timeout=max(left - 0.5, 0.5))
            return
        if os.environ.get("TRACKER_INGEST_ON_FINISH", "1") == "0":
            return
        from tracker.store import Store

        try:
            Store(self.run.home).ingest(timeout=float(os.environ.get("TRACKER_INGEST_TIMEOUT", "2")))
        except Exception as exc:  # the rows stay in the spool; queries still see them
            log.warning("tracker: ingestion after run %s deferred: %s", self.run.run_id, exc)


@dataclass(frozen=True)
class StoreLogger:
    name: str = "store"
    description: str = "crash-safe Parquet spool ingested into the DuckDB store"

    def open(self, run: "Run") -> StoreSession:
        return StoreSession(run)


@hookimpl
def tracker_register_loggers(register: Any) -> None:
    register(StoreLogger())
