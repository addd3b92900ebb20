"""A run's metadata files in the spool: ``run.json`` and the segment JSON.

They are written by the core whatever loggers are active, since resume depends on
them: ``init`` writes both (rank 0 owns ``run.json``; other ranks write it only when
it is missing), every flush refreshes the segment's last step and heartbeat, and
``finish`` records the segment's end and the run's status.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tracker.spool import SegmentInfo, atomic_write_json, read_json, run_dir

if TYPE_CHECKING:  # pragma: no cover
    from tracker.run import Run


class RunMeta:
    def __init__(self, run: "Run"):
        self.run = run
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
        self.data = {**(read_json(self.path) or self.data), **fields, "updated_at": time.time()}
        atomic_write_json(self.path, self.data)

    def flushed(self, last_step: int | None) -> None:
        self.segment.last_step = last_step
        self.segment.heartbeat = time.time()
        self.segment.save(self.run.home)

    def ended(self, status: str) -> None:
        self.segment.ended_at = time.time()
        self.segment.heartbeat = self.segment.ended_at
        self.segment.save(self.run.home)
        if self.run.rank == 0:
            self.update(status=status)
