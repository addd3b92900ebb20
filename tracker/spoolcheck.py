"""Bad spool files: found and skipped with one warning; the checks the stores use.

Rules (a bad file affects only its own run):

* A run whose ``run.json`` or any of whose segment files is not valid (see
  :func:`tracker.spool.check_run_meta` and :func:`tracker.spool.parse_segment`) is
  left out of every reader and of ingestion: its metadata and its spool chunks stay
  where they are, untouched, and every other run reads normally. A chunk that is not
  a readable Parquet file of its table is left out on its own.
* Each bad file is reported once per process (per version of the file), as one
  warning naming it, however many queries meet it.
* :func:`quarantine` moves one bad file to ``<TRACKER_HOME>/corrupt/<run_id>/``: the
  stores set unreadable chunks aside with it, and ``tracker doctor --fix``
  (:mod:`tracker.doctor`, which sits above the stores) every bad file it finds.

This module sits below the stores (it knows the spool only); :mod:`tracker.doctor`
holds the check and the repair, which open the store.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from tracker import spool
from tracker.errors import DataError
from tracker.spool import SegmentInfo

log = logging.getLogger("tracker.doctor")  # the name its warnings always had

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
