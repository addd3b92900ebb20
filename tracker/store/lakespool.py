"""This host's spool seen from the lake: what is still to commit, and the chunks of
writers that died.

* :func:`claim_orphans`: a process killed between renaming a chunk into place and
  updating its segment file leaves chunks that the segment file does not claim; the
  spool holds them back from ingestion while the segment may still be written
  (:func:`tracker.spool.data_files`). Once that writer is gone (this host, its pid not
  alive), its segment file is brought up to what is durable (the same steps a resume
  here would count), so ``tracker lake push`` sends every durable row to the lake.
* :func:`backlog`: rows waiting in the spool and how old the oldest is.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from tracker import spool


def claim_orphans(home: Path) -> int:
    """Bring the segment files of dead writers on this host up to their durable chunks; returns how many."""
    root = spool.runs_dir(home)
    if not root.is_dir():
        return 0
    claimed = 0
    for entry in os.scandir(root):
        if not entry.is_dir():
            continue
        meta = spool.read_json(Path(entry.path) / "run.json") or {}
        if meta.get("host") not in (None, socket.gethostname()):
            continue  # a spool folder shared with another host: its pids mean nothing here
        try:
            segs = spool.durable_segments(home, entry.name)
        except Exception:  # a bad segment file: `tracker doctor` reports it, its run waits
            continue
        newest: dict[int, int] = {}
        for seg in segs:
            newest[seg.rank] = max(newest.get(seg.rank, -1), seg.segment)
        for seg in segs:
            if seg.segment != newest[seg.rank] or seg.ended_at is not None or not seg.pid:
                continue
            if seg.pid == os.getpid() or spool.pid_alive(seg.pid):
                continue
            top = _last_seq(Path(entry.path), seg)
            if top is None or (seg.last_seq is not None and top <= seg.last_seq):
                continue
            seg.last_seq = top
            seg.save(home)
            claimed += 1
    return claimed


def _last_seq(folder: Path, seg: spool.SegmentInfo) -> int | None:
    prefix = f"r{seg.rank}-s{seg.segment:04d}-"
    seqs = [int(m.group("seq")) for e in os.scandir(folder)
            if e.name.startswith(prefix) and (m := spool.DATA_RE.match(e.name))]
    return max(seqs, default=None)


@dataclass
class Backlog:
    """What this host's spool holds that the lake does not have yet."""

    chunks: int
    rows: int
    oldest_s: float  # seconds since the oldest pending chunk was written (0 when none)


def backlog(home: Path) -> Backlog:
    """The chunks and rows pending in ``home``'s spool, and the age of the oldest (from the Parquet footers)."""
    files = spool.data_files(home)
    if not files:
        return Backlog(0, 0, 0.0)
    import pyarrow.parquet as pq

    rows, oldest = 0, time.time()
    for path in files:
        try:
            rows += pq.read_metadata(path).num_rows
            oldest = min(oldest, path.stat().st_mtime)
        except (OSError, ValueError):
            continue
    return Backlog(len(files), rows, max(time.time() - oldest, 0.0))
