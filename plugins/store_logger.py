"""The default logger: writes the run's crash-safe spool (see :mod:`tracker.spool`).

``open`` writes ``run.json`` (rank 0 owns it; other ranks write it only when it is
missing) and the segment's JSON. Each ``write`` adds immutable Parquet chunks and
refreshes the segment's last step and heartbeat. ``close`` records the end and the
status, then ingests into DuckDB when the store is free within a short wait
(``TRACKER_INGEST_TIMEOUT``, default 2 s); otherwise the rows stay in the spool,
where queries see them, until the next ingestion.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tracker import hookimpl
from tracker.loggers import Batch
from tracker.spool import SegmentInfo, atomic_write_json, atomic_write_table, read_json, run_dir

if TYPE_CHECKING:  # pragma: no cover
    from tracker.run import Run

log = logging.getLogger(__name__)


class StoreSession:
    def __init__(self, run: "Run"):
        self.run = run
        self.folder = run_dir(run.home, run.run_id)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.meta_path = self.folder / "run.json"
        now = time.time()
        self.segment = SegmentInfo(
            run_id=run.run_id, rank=run.rank, segment=run.segment, start_step=run.start_step,
            reason=run.reason, started_at=now,
        )
        existing = read_json(self.meta_path)
        if run.rank == 0 or existing is None:
            self.meta: dict[str, Any] = {
                **(existing or {}),
                "run_id": run.run_id, "project": run.project, "name": run.name,
                "status": "running", "config": run.config, "tags": run.tags,
                "world_size": run.world_size, "updated_at": now, **run.meta,
            }
            self.meta.setdefault("created_at", now)
            if run.classes:
                self.meta["classes"] = run.classes
            atomic_write_json(self.meta_path, self.meta)
        else:
            self.meta = existing
        self.segment.save(run.home)

    def set_classes(self, names: list[str]) -> None:
        self.meta = read_json(self.meta_path) or self.meta
        self.meta["classes"] = names
        atomic_write_json(self.meta_path, self.meta)

    def write(self, batch: Batch) -> None:
        prefix = f"r{self.run.rank}-s{self.run.segment:04d}-{batch.seq:06d}"
        for table_name, table in (
            ("metrics", batch.metrics), ("class_metrics", batch.class_metrics), ("events", batch.events)
        ):
            if table is not None and table.num_rows:
                atomic_write_table(self.folder / f"{prefix}.{table_name}.parquet", table)
        self.segment.last_step = batch.last_step
        self.segment.heartbeat = time.time()
        self.segment.save(self.run.home)
        if batch.status and self.run.rank == 0:
            self._write_status(batch.status)

    def _write_status(self, status: str) -> None:
        self.meta = read_json(self.meta_path) or self.meta
        self.meta["status"] = status
        self.meta["updated_at"] = time.time()
        atomic_write_json(self.meta_path, self.meta)

    def close(self, status: str) -> None:
        self.segment.ended_at = time.time()
        self.segment.heartbeat = self.segment.ended_at
        self.segment.save(self.run.home)
        if self.run.rank == 0:
            self._write_status(status)
        if os.environ.get("TRACKER_INGEST_ON_FINISH", "1") != "0":
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
