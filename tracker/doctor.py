"""``tracker doctor``: every bad file in the store listed, and set aside on request.

The rules for bad spool files (a bad file affects only its own run; readers and
ingestion leave it out with one warning) are :mod:`tracker.spoolcheck`'s, which the
stores use; this module sits above the stores:

* :func:`check` lists every problem: bad JSON files, unreadable chunks (read in
  full) and a database that cannot be read.
* :func:`fix` (``tracker doctor --fix``) moves bad files to
  ``<TRACKER_HOME>/corrupt/<run_id>/``. A bad segment file is replaced by a
  placeholder (the store's own record of that segment when it has one, else a segment
  that claims no rows) so the segment's number is never reused by a resume.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable

from tracker import spool
from tracker.spool import SegmentInfo
from tracker.spoolcheck import (  # noqa: F401  (re-exported: tracker.doctor's names before the split)
    QUARANTINE,
    Problem,
    SpoolScan,
    chunk_problem,
    good_chunks,
    quarantine,
    scan,
    warn_once,
)
from tracker.spoolcheck import _chunk_message


def check(home: Path) -> list[Problem]:
    """Every problem in the store under ``home``: bad JSON files, unreadable chunks, the database."""
    from tracker.errors import TrackerError
    from tracker.store import open_store

    found = scan(home, warn=False).problems
    for path in spool.data_files(home):
        why = chunk_problem(path, deep=True)
        if why is not None:
            found.append(Problem(path, path.parent.name, "chunk", _chunk_message(path, why)))
    store = open_store(home)
    if store.path.exists():
        try:
            store.query("SELECT count(*) FROM runs")
        except TrackerError as exc:
            found.append(Problem(store.path, "", "store", str(exc).splitlines()[0]))
    return found


def _placeholder(path: Path, known: dict[tuple[int, int], SegmentInfo]) -> SegmentInfo:
    m = spool.SEG_RE.match(path.name)
    assert m is not None
    rank, segment = int(m.group("rank")), int(m.group("segment"))
    if (rank, segment) in known:
        return known[(rank, segment)]
    now = time.time()
    return SegmentInfo(run_id=path.parent.name, rank=rank, segment=segment, start_step=2**63 - 1,
                       reason="quarantined", started_at=now, ended_at=now, heartbeat=now, pid=0)


def fix(home: Path, problems: Iterable[Problem]) -> list[tuple[Problem, Path]]:
    """Set aside the files of ``problems`` (see module doc); returns (problem, new place) pairs."""
    from tracker.store import open_store

    moved = []
    for problem in problems:
        if problem.kind == "store" or not problem.path.exists():
            continue
        known: dict[tuple[int, int], SegmentInfo] = {}
        if problem.kind == "segment":
            known = _stored_segments(open_store(home), problem.run_id)
        dest = quarantine(home, problem.path)
        if problem.kind == "segment":
            seg = _placeholder(problem.path, known)
            spool.atomic_write_json(problem.path, asdict(seg))
        moved.append((problem, dest))
    return moved


def _stored_segments(store: Any, run_id: str) -> dict[tuple[int, int], SegmentInfo]:
    """The segments of ``run_id`` recorded in the database (already ingested), by (rank, segment)."""
    from tracker.errors import TrackerError

    if not store.path.exists():
        return {}
    try:
        with store.connect() as con:
            rows = con.execute(
                "SELECT rank, segment, start_step, reason, epoch(started_at), end_step, epoch(ended_at) "
                "FROM main.segments WHERE run_id = ?", [run_id]
            ).fetchall()
    except TrackerError:
        return {}
    now = time.time()
    return {
        (r[0], r[1]): SegmentInfo(run_id=run_id, rank=r[0], segment=r[1], start_step=r[2], reason=r[3],
                                  started_at=r[4] or now, last_step=r[5], ended_at=r[6] or now,
                                  heartbeat=now, pid=0)
        for r in rows
    }
