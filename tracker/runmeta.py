"""A run's metadata files in the spool: ``run.json`` and the segment JSON.

They are written by the core whatever loggers are active, since resume depends on
them: ``init`` writes both (rank 0 owns ``run.json``; other ranks write it only when
it is missing), every flush refreshes the segment's last step and heartbeat, and
``finish`` records the segment's end and the run's status.

The segment's ``last_step`` never claims rows that are not durable: it is advanced
only after every durable logger (the store logger) has written the chunk holding
those rows (fsynced and renamed into place), so a ``kill -9`` between the two leaves
the segment JSON behind the chunks, never ahead of them. ``last_seq`` is the flush
sequence number of that chunk: a resume also counts chunks of the segment with a
higher number (written, then killed before the JSON caught up). A failed write of
these files (disk full) is logged once and retried at the next flush; a stale
segment JSON only makes a resume start earlier, which hides no durable row.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from tracker.spool import SegmentInfo, atomic_write_json, read_json, run_dir

if TYPE_CHECKING:  # pragma: no cover
    from tracker.protocols import RunLike

log = logging.getLogger(__name__)


class RunMeta:
    """Writes ``run.json`` and this process's segment JSON (thread-safe)."""

    def __init__(self, run: "RunLike"):
        self.run = run
        self._lock = threading.Lock()
        self._failed = False
        folder = run_dir(run.home, run.run_id)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "run.json"
        now = time.time()
        self.segment = SegmentInfo(
            run_id=run.run_id, rank=run.rank, segment=run.segment, start_step=run.start_step,
            reason=run.reason, started_at=now,
        )
        existing = read_json(self.path)
        self.owner = run.rank == 0 or existing is None
        if self.owner:
            self.data: dict[str, Any] = {
                **(existing or {}),
                "run_id": run.run_id, "project": run.project, "name": run.name,
                "status": "running", "config": run.config, "tags": run.tags,
                "world_size": run.world_size, "updated_at": now, **run.meta,
            }
            self.data.setdefault("created_at", now)
            atomic_write_json(self.path, self.data)
        else:
            self.data = existing or {}
        self.segment.save(run.home)

    def update(self, **fields: Any) -> None:
        """Merge ``fields`` into run.json (re-read first: another rank may have written it)."""
        with self._lock:
            self.data = {**(read_json(self.path) or self.data), **fields, "updated_at": time.time()}
            self._save(lambda: atomic_write_json(self.path, self.data))

    def flushed(self, last_step: int | None, seq: int | None = None) -> None:
        """Record that every row up to ``last_step`` (flush ``seq``) is durable."""
        with self._lock:
            if last_step is not None and (self.segment.last_step is None or last_step > self.segment.last_step):
                self.segment.last_step = last_step
            if seq is not None:
                self.segment.last_seq = max(seq, self.segment.last_seq if self.segment.last_seq is not None else -1)
            self.segment.heartbeat = time.time()
            self._save(lambda: self.segment.save(self.run.home))

    def ended(self, status: str, **fields: Any) -> None:
        """The segment's end, and (rank 0) the run's final status plus ``fields``."""
        with self._lock:
            self.segment.ended_at = time.time()
            self.segment.heartbeat = self.segment.ended_at
            self._save(lambda: self.segment.save(self.run.home))
        if self.run.rank == 0:
            self.update(status=status, **fields)
        elif fields:
            log.warning("tracker: run %s rank %d: %s", self.run.run_id, self.run.rank, fields)

    def _save(self, write: Any) -> None:
        try:
            write()
        except OSError as exc:  # disk full: retried at the next flush; stale is safe (module doc)
            if not self._failed:
                log.warning("tracker: metadata of run %s not written (%s); retrying at the next flush",
                            self.run.run_id, exc)
            self._failed = True
        else:
            self._failed = False
