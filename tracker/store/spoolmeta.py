"""The spool's run metadata (``run.json`` and segment files) as Arrow tables in the
shape of the store's ``runs``, ``segments`` and ``classes`` tables. Shared by both
store backends: readers shadow the stored tables with them, ingestion upserts them."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracker import spool, spoolcheck
from tracker.spool import SegmentInfo

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

HEARTBEAT_S = 60.0  # default of TRACKER_HEARTBEAT_S: a live run refreshes its heartbeat at least this often
STALE_HEARTBEAT_S = 2 * HEARTBEAT_S  # default: a segment whose heartbeat is older than two intervals is dead


def heartbeat_s() -> float:
    """The heartbeat interval, ``TRACKER_HEARTBEAT_S`` seconds (default 60)."""
    from tracker.errors import ConfigError

    raw = os.environ.get("TRACKER_HEARTBEAT_S", "")
    if not raw:
        return HEARTBEAT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ConfigError(f"TRACKER_HEARTBEAT_S={raw!r} is not a positive number of seconds; "
                          "e.g. TRACKER_HEARTBEAT_S=60")
    return value


def stale_after_s() -> float:
    """Seconds without a heartbeat after which a segment not ended is dead: two intervals."""
    return 2 * heartbeat_s()

LINEAGE_COLUMNS = ("parent_run_id", "fork_step")  # runs columns of a fork (local store only)

# the spool's metadata tables (in spool_meta's order) and their primary keys
META_TABLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("runs", ("run_id",)),
    ("segments", ("run_id", "rank", "segment")),
    ("classes", ("run_id", "class_index")),
)


def _ts(x: float | None) -> datetime | None:
    return None if x is None else datetime.fromtimestamp(float(x), tz=timezone.utc).replace(tzinfo=None)


def spool_meta(home: Path, scan: spoolcheck.SpoolScan | None = None) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Runs, segments and classes as recorded in the spool's valid JSON files (see tracker.spoolcheck)."""
    runs: list[dict[str, Any]] = []
    segs: list[SegmentInfo] = []
    classes: list[tuple[str, int, str]] = []
    for meta, run_segs in (scan or spoolcheck.scan(home)).runs:
        segs.extend(run_segs)
        runs.append(run_row(meta, run_segs))
        classes.extend((meta["run_id"], i, n) for i, n in enumerate(meta.get("classes") or []))
    return runs_table(runs), segments_table(segs), classes_table(classes)


def host_meta(home: Path) -> tuple[pa.Table, pa.Table, pa.Table]:
    """What this host's spool says of runs, segments and classes (for the lake).

    Segments of every rank here; a run's row and classes only where this host holds
    rank 0's segments (rank 0 owns ``run.json``; other ranks write one only as a stub).
    """
    root = spool.runs_dir(home)
    runs: list[dict[str, Any]] = []
    segs: list[SegmentInfo] = []
    classes: list[tuple[str, int, str]] = []
    if root.is_dir():
        for entry in os.scandir(root):
            if not entry.is_dir():
                continue
            run_segs = spool.list_segments(home, entry.name)
            segs.extend(run_segs)
            meta = spool.read_json(Path(entry.path) / "run.json")
            if meta and any(s.rank == 0 for s in run_segs):
                runs.append(run_row(meta, run_segs))
                classes.extend((meta["run_id"], i, n) for i, n in enumerate(meta.get("classes") or []))
    lake_runs = runs_table(runs).drop_columns(list(LINEAGE_COLUMNS))  # the lake has no forks
    return lake_runs, segments_table(segs), classes_table(classes)


def run_row(meta: dict[str, Any], segs: list[SegmentInfo]) -> dict[str, Any]:
    """One row of the ``runs`` table from a run's ``run.json`` and its segments."""
    import json

    heartbeat = max((s.heartbeat for s in segs), default=meta.get("created_at", 0.0))
    status = meta.get("status", "running")
    if status == "running" and not any(s.ended_at is None and _alive(s, meta) for s in segs):
        status = "crashed"
    return {
        "run_id": meta["run_id"],
        "project": meta.get("project"),
        "name": meta.get("name"),
        "status": status,
        "created_at": _ts(meta.get("created_at")),
        "updated_at": _ts(max(heartbeat, meta.get("updated_at", 0.0))),
        "config": json.dumps(meta.get("config", {}), default=str),
        "tags": [str(t) for t in meta.get("tags", [])],
        "host": meta.get("host"),
        "git_commit": meta.get("git_commit"),
        "python": meta.get("python"),
        "packages": json.dumps(meta.get("packages", {})),
        "seed": meta.get("seed") if isinstance(meta.get("seed"), int) else None,
        "world_size": meta.get("world_size"),
        "parent_run_id": meta.get("parent_run_id"),
        "fork_step": meta.get("fork_step") if isinstance(meta.get("fork_step"), int) else None,
    }


def _alive(seg: SegmentInfo, meta: dict[str, Any]) -> bool:
    """Is the process writing ``seg`` still there? Its heartbeat is younger than
    :func:`stale_after_s` (the rule on every host and in the lake), and on its own
    host its pid is also alive (a process gone is dead at once)."""
    import socket

    if time.time() - seg.heartbeat >= stale_after_s():
        return False
    return meta.get("host") != socket.gethostname() or spool.pid_alive(seg.pid)


def runs_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The ``runs`` table of ``rows`` (see :func:`run_row`)."""
    import pyarrow as pa  # on first use: a query of a store without live runs never loads it

    schema_ = pa.schema(
        [
            ("run_id", pa.string()), ("project", pa.string()), ("name", pa.string()),
            ("status", pa.string()), ("created_at", pa.timestamp("us")), ("updated_at", pa.timestamp("us")),
            ("config", pa.string()), ("tags", pa.list_(pa.string())), ("host", pa.string()),
            ("git_commit", pa.string()), ("python", pa.string()), ("packages", pa.string()),
            ("seed", pa.int64()), ("world_size", pa.int32()),
            ("parent_run_id", pa.string()), ("fork_step", pa.int64()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema_)


def segments_table(segs: list[SegmentInfo]) -> pa.Table:
    """The ``segments`` table of ``segs``."""
    import pyarrow as pa  # on first use: a query of a store without live runs never loads it

    return pa.table(
        {
            "run_id": pa.array([s.run_id for s in segs], pa.string()),
            "rank": pa.array([s.rank for s in segs], pa.int32()),
            "segment": pa.array([s.segment for s in segs], pa.int32()),
            "start_step": pa.array([s.start_step for s in segs], pa.int64()),
            "end_step": pa.array([s.last_step for s in segs], pa.int64()),
            "started_at": pa.array([_ts(s.started_at) for s in segs], pa.timestamp("us")),
            "ended_at": pa.array([_ts(s.ended_at) for s in segs], pa.timestamp("us")),
            "reason": pa.array([s.reason for s in segs], pa.string()),
        }
    )


def classes_table(classes: list[tuple[str, int, str]]) -> pa.Table:
    """The ``classes`` table of (run_id, class_index, name) triples."""
    import pyarrow as pa  # on first use: a query of a store without live runs never loads it

    return pa.table({
        "run_id": pa.array([c[0] for c in classes], pa.string()),
        "class_index": pa.array([c[1] for c in classes], pa.int32()),
        "name": pa.array([c[2] for c in classes], pa.string()),
    })
