"""Bad spool files: found, skipped with one warning, and set aside on request.

Rules (a bad file affects only its own run):

* A run whose ``run.json`` or any of whose segment files is not valid (see
  :func:`tracker.spool.check_run_meta` and :func:`tracker.spool.parse_segment`) is
  left out of every reader and of ingestion: its metadata and its spool chunks stay
  where they are, untouched, and every other run reads normally. A chunk that is not
  a readable Parquet file of its table is left out on its own.
* Each bad file is reported once per process (per version of the file), as one
  warning naming it, however many queries meet it.
* :func:`fix` (``tracker doctor --fix``) moves bad files to
  ``<TRACKER_HOME>/corrupt/<run_id>/``. A bad segment file is replaced by a
  placeholder (the store's own record of that segment when it has one, else a segment
  that claims no rows) so the segment's number is never reused by a resume.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from tracker import spool
from tracker.errors import DataError
from tracker.spool import SegmentInfo

log = logging.getLogger(__name__)

QUARANTINE = "corrupt"
_WARNED: set[tuple[str, int, int]] = set()
_CHUNKS: dict[tuple[str, int, int], tuple[str | None, bool]] = {}  # version -> (problem, read in full)


@dataclass(frozen=True)
class Problem:
    """One bad file: where, which run, and what is wrong with it."""

    path: Path
    run_id: str
    kind: str  # "run.json", "segment", "chunk" or "store"
    message: str


@dataclass
class SpoolScan:
    """The spool's valid runs (metadata and segments) and the problems found."""

    runs: list[tuple[dict[str, Any], list[SegmentInfo]]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def bad_runs(self) -> set[str]:
        return {p.run_id for p in self.problems if p.kind != "chunk"}


def _version(path: Path) -> tuple[str, int, int]:
    try:
        st = path.stat()
    except OSError:
        return (str(path), -1, -1)
    return (str(path), st.st_size, st.st_mtime_ns)


def warn_once(problem: Problem) -> None:
    """Log ``problem`` as a warning, once per process and version of the file."""
    key = _version(problem.path)
    if key in _WARNED:
        return
    _WARNED.add(key)
    what = "chunk left out" if problem.kind == "chunk" else f"run {problem.run_id!r} left out of the store"
    log.warning("tracker: bad spool file, %s: %s", what, problem.message)


def scan(home: Path, warn: bool = True) -> SpoolScan:
    """Read and validate every ``run.json`` and segment file in the spool under ``home``."""
    out = SpoolScan()
    root = spool.runs_dir(home)
    if not root.is_dir():
        return out
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if not entry.is_dir():
            continue
        folder = Path(entry.path)
        problems: list[Problem] = []
        meta = None
        try:
            meta = spool.read_run_meta(folder / "run.json")
        except DataError as exc:
            problems.append(Problem(folder / "run.json", entry.name, "run.json", str(exc)))
        segs: list[SegmentInfo] = []
        for seg in sorted(os.scandir(folder), key=lambda e: e.name):
            if spool.SEG_RE.match(seg.name):
                path = Path(seg.path)
                try:
                    segs.append(spool.parse_segment(spool.read_json(path), path))
                except DataError as exc:
                    problems.append(Problem(path, entry.name, "segment", str(exc)))
        out.problems.extend(problems)
        if not problems and meta is not None:
            segs.sort(key=lambda s: (s.rank, s.segment))
            out.runs.append((meta, segs))
    if warn:
        for problem in out.problems:
            warn_once(problem)
    return out


def chunk_problem(path: Path, deep: bool = False) -> str | None:
    """Why the data chunk ``path`` cannot be read as its table (None when it can).

    The footer and column names are checked; ``deep`` also reads every row.
    """
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
        names = meta.schema.to_arrow_schema().names
        expected = list(spool.column_names(spool.table_of(path)))
        if names != expected:
            return f"columns {names}, expected {expected}"
        if deep:
            pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - any failure to read makes the chunk bad
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def good_chunks(files: Iterable[Path], bad_runs: set[str], deep: bool = False) -> list[Path]:
    """``files`` without those of ``bad_runs`` and without unreadable chunks (warned once).

    Chunks are immutable once renamed into place, so a check is remembered per version.
    """
    if len(_CHUNKS) > 100_000:  # ingested chunks are gone: forget them now and then
        _CHUNKS.clear()
    out = []
    for path in files:
        if path.parent.name in bad_runs:
            continue
        key = _version(path)
        known = _CHUNKS.get(key)
        if known is None or (deep and known[0] is None and not known[1]):
            known = _CHUNKS[key] = (chunk_problem(path, deep), deep)
        why = known[0]
        if why is None:
            out.append(path)
        else:
            warn_once(Problem(path, path.parent.name, "chunk", _chunk_message(path, why)))
    return out


def _chunk_message(path: Path, why: str) -> str:
    return f"{path}: not a readable chunk ({why}); move it aside with `tracker doctor --fix`"


def check(home: Path) -> list[Problem]:
    """Every problem in the store under ``home``: bad JSON files, unreadable chunks, the database."""
    from tracker.errors import TrackerError
    from tracker.store import Store

    found = scan(home, warn=False).problems
    for path in spool.data_files(home):
        why = chunk_problem(path, deep=True)
        if why is not None:
            found.append(Problem(path, path.parent.name, "chunk", _chunk_message(path, why)))
    store = Store(home)
    if store.path.exists():
        try:
            store.query("SELECT count(*) FROM runs")
        except TrackerError as exc:
            found.append(Problem(store.path, "", "store", str(exc).splitlines()[0]))
    return found


def quarantine(home: Path, path: Path) -> Path:
    """Move ``path`` to ``<home>/corrupt/<run_id>/`` (never over an earlier one); returns where."""
    dest = Path(home) / QUARANTINE / path.parent.name / path.name
    n = 1
    while dest.exists():
        dest = dest.with_name(f"{path.name}.{n}")
        n += 1
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(path), dest)
    return dest


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
    from tracker.store import Store

    moved = []
    for problem in problems:
        if problem.kind == "store" or not problem.path.exists():
            continue
        known: dict[tuple[int, int], SegmentInfo] = {}
        if problem.kind == "segment":
            known = _stored_segments(Store(home), problem.run_id)
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
