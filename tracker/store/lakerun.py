"""What a training process does for the lake, always off its training thread.

* :func:`prepare_run` (called once by ``tracker.init``, as the lake store's
  ``prepare_run``): checks the lake setting and
  its credentials at once (a rejected password fails ``init``; an unreachable server
  only warns, training goes on), and copies a run's metadata and this rank's segments
  from the lake into the local spool when this host has not seen them, so a run
  preempted on host A resumes on host B with the right segment and step.
* :class:`Committer`: one thread per (process, spool) while runs are live, starting a
  commit of every pending chunk of the spool (one transaction) every
  ``TRACKER_COMMIT_INTERVAL`` seconds (default 1); a commit that takes longer is
  followed by the next at once, which then takes all that came meanwhile: the slower
  the commits, the fewer and larger they are. While the catalog is out of reach it
  logs ONE warning, keeps the rows in the spool and retries with backoff; it logs once
  more when commits resume.
* Backpressure (the spool's rule, :mod:`tracker.run`: a store slower than the training
  loop slows the loop rather than growing without bound): while more than
  ``TRACKER_LAKE_BACKLOG_ROWS`` rows (default 1,000,000) that the store logger spooled
  wait for a commit, the logger waits for the next commit before it spools more, at
  most :data:`ADMIT_WAIT_S` per batch (so it never stalls long enough for ``log()`` to
  give up waiting and a logger to drop rows), and ``log()`` waits for it in turn. One
  warning says so. An unreachable catalog applies no backpressure: the spool keeps the
  rows and training goes on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import threading
import time
import weakref
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracker import spool
from tracker.errors import ConfigError, StoreError, StoreUnavailableError
from tracker.store.base import on_shutdown
from tracker.store.settings import current

if TYPE_CHECKING:  # pragma: no cover
    from tracker.store.lake import LakeStore

log = logging.getLogger("tracker.store.lake")

_COMMITTERS: dict[Path, "Committer"] = {}
_STARTED: "weakref.WeakSet[Committer]" = weakref.WeakSet()
_HANDOFF: dict[Path, Any] = {}  # connections attached by init, for the committer to start with
_LOCK = threading.Lock()
MAX_BACKOFF_S = 8.0
BACKLOG_ROWS = 1_000_000  # rows waiting for a commit past which the store logger waits (TRACKER_LAKE_BACKLOG_ROWS)
ADMIT_WAIT_S = 0.4  # at most per batch: well within log()'s 1 s wait for its loggers
MIN_GAP_S = 0.05  # between two commits when the last one took the whole interval


def _epoch(ts: Any) -> float | None:
    if ts is None:
        return None
    return ts.replace(tzinfo=timezone.utc).timestamp() if isinstance(ts, datetime) else float(ts)


def prepare_run(store: LakeStore, run_id: str, rank: int, resume: str) -> None:
    """Check ``store``'s lake and bring run ``run_id``'s lake metadata into its spool
    (:meth:`LakeStore.prepare_run`, called through the store interface by ``tracker.init``)."""
    home = store.home
    try:
        con = store.attach(read_only=False, timeout=3)
    except StoreUnavailableError as exc:
        log.warning("tracker: %s; training goes on", exc)
        return
    try:
        if any(s.rank == rank for s in spool.list_segments(home, run_id)):
            return
        runs = con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id]).fetchall()
        cols = [d[0] for d in con.description]
        segs = lake_segments(con, run_id, rank)
    finally:
        _hand_over(home, con)
    if not runs and not segs:
        return
    folder = spool.run_dir(home, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    if runs and rank == 0 and not (folder / "run.json").exists():
        row = dict(zip(cols, runs[0]))
        meta = {k: row[k] for k in ("run_id", "project", "name", "status", "host", "git_commit", "python",
                                    "seed", "world_size")}
        meta.update(config=json.loads(row["config"] or "{}"), tags=list(row["tags"] or []),
                    packages=json.loads(row["packages"] or "{}"), created_at=_epoch(row["created_at"]),
                    updated_at=_epoch(row["updated_at"]))
        spool.atomic_write_json(folder / "run.json", meta)
    for seg in segs:
        seg.save(home)
    log.info("tracker: run %s rank %d: %d segment(s) found in the lake", run_id, rank, len(segs))


_ROWS = ("SELECT segment, min(step), max(step), min(wall_time), max(wall_time) FROM ("
         "SELECT segment, step, wall_time FROM metrics WHERE run_id = $run AND rank = $rank AND {cond} UNION ALL "
         "SELECT segment, step, wall_time FROM class_metrics WHERE run_id = $run AND rank = $rank AND {cond}) "
         "GROUP BY segment")


def lake_segments(con: Any, run_id: str, rank: int) -> list[spool.SegmentInfo]:
    """Rank ``rank``'s segments of run ``run_id`` as the lake's ROWS say (``con``: attached).

    A segment's ``last_step`` is the last step of its rows in the lake, whatever its
    ``end_step`` says (the metadata may lag the rows by a commit interval, and a lake
    written by an older release may have it ahead of them); a segment whose rows are in
    the lake and whose metadata is not yet is taken from its rows, so a resume never
    reuses its number. The ``end_step`` bounds the scan: only files with later steps are read.
    """
    known = con.execute(
        "SELECT segment, start_step, end_step, epoch(started_at), epoch(ended_at), reason FROM segments "
        "WHERE run_id = ? AND rank = ? ORDER BY segment", [run_id, rank]).fetchall()
    args = {"run": run_id, "rank": rank}
    out = []
    for segment, start, end, started, ended, reason in known:
        found = None
        if end is not None:
            found = con.execute(_ROWS.format(cond=f"segment = {int(segment)} AND step >= {int(end)}"), args).fetchone()
        if found is None:  # no metadata of its progress, or rows behind it: read the segment's rows
            found = con.execute(_ROWS.format(cond=f"segment = {int(segment)}"), args).fetchone()
        when = ended or started or time.time()
        out.append(spool.SegmentInfo(run_id=run_id, rank=rank, segment=segment, start_step=start, reason=reason,
                                     started_at=started or when, last_step=found[2] if found else None,
                                     ended_at=ended, heartbeat=when, pid=0))
    after = max((s.segment for s in out), default=-1)
    for segment, low, high, first, last in con.execute(
            _ROWS.format(cond=f"segment > {after}") + " ORDER BY segment", args).fetchall():
        out.append(spool.SegmentInfo(run_id=run_id, rank=rank, segment=segment, start_step=low,
                                     reason="resume" if segment else "start", started_at=first, last_step=high,
                                     heartbeat=last, pid=0))
    return out


def _hand_over(home: Path, con: Any) -> None:
    """Keep ``init``'s attached connection for this spool's committer thread, else close it.

    Loading the extensions and attaching hold the interpreter lock for a good part of a
    second; done once in ``init``, the committer thread never does it while training runs.
    """
    with _LOCK:
        old = _HANDOFF.pop(home, None)
        if os.environ.get("TRACKER_LAKE_COMMITTER", "thread") == "thread" and home not in _COMMITTERS:
            _HANDOFF[home] = con
            con = None
    for c in (old, con):
        if c is not None:
            c.close()


def _backlog_rows() -> int:
    raw = os.environ.get("TRACKER_LAKE_BACKLOG_ROWS", "").strip()
    if not raw:
        return BACKLOG_ROWS
    try:
        rows = int(raw.replace("_", ""))
    except ValueError:
        rows = 0
    if rows <= 0:
        raise ConfigError(f"TRACKER_LAKE_BACKLOG_ROWS={raw!r} is not a positive whole number of rows; "
                          f"set e.g. 1000000, or unset it for the default ({BACKLOG_ROWS:,})")
    return rows


class Committer:
    """Commits one spool into the lake every interval, on its own thread (see module doc)."""

    def __init__(self, home: Path, interval: float | None = None) -> None:
        self.home = home
        self.interval = interval if interval is not None else float(os.environ.get("TRACKER_COMMIT_INTERVAL", "1"))
        self.users = 0
        self.down_since: float | None = None
        self.failed_with: str | None = None
        self._con: Any = None
        self._stop = threading.Event()
        self._deadline = 0.0
        self._abandoned = False
        self._thread = threading.Thread(target=self._loop, name=f"tracker-lake-commit-{home.name}", daemon=True)
        self.max_backlog = _backlog_rows()
        self.waited_s = 0.0  # seconds the store logger waited for commits (backpressure)
        self._spooled = 0  # rows the store logger announced (admit), and of those ...
        self._committed = 0  # ... the rows announced before a commit that then succeeded began
        self._progress = threading.Condition()
        self._warned_behind = False

    def behind(self) -> int:
        """Rows spooled through :meth:`admit` that no finished commit has taken yet (about)."""
        return self._spooled - self._committed

    def admit(self, rows: int) -> None:
        """Called by the store logger's lane before it spools ``rows`` rows: the backpressure
        of the module doc (wait for a commit while too far behind, bounded)."""
        with self._progress:
            if self.behind() > self.max_backlog and not self._exempt():
                start = time.monotonic()
                if not self._warned_behind:
                    self._warned_behind = True
                    log.warning("tracker: commits of %s into the lake are more than %d rows behind the training "
                                "process; logging slows to their pace until they catch up (backpressure; "
                                "this warning is not repeated)", self.home, self.max_backlog)
                self._progress.wait_for(lambda: self.behind() <= self.max_backlog or self._exempt(), ADMIT_WAIT_S)
                self.waited_s += time.monotonic() - start
            self._spooled += rows

    def _exempt(self) -> bool:
        """No backpressure while the catalog is out of reach, commits fail, or the committer stops."""
        return self.down_since is not None or self.failed_with is not None or self._stop.is_set()

    def start(self) -> None:
        _STARTED.add(self)
        self._thread.start()

    def stop(self, timeout: float = 120.0) -> None:
        """Stop the thread after a last commit, retried until it succeeds or ``timeout`` passes."""
        from tracker.store.lake import STATS

        start = time.monotonic()
        self._deadline = start + timeout
        self._stop.set()
        self._thread.join(timeout)
        STATS["final_commit_s"] = time.monotonic() - start
        if self._thread.is_alive():
            self.abandon(wait=0.3)
            log.warning("tracker: the last commit of %s into the lake is still running after %.0f s; "
                        "uncommitted rows stay in the spool for the next commit", self.home, timeout)

    def abandon(self, wait: float = 5.0) -> None:
        """Interrupt a commit still running (its rows stay spooled) and wait for the thread.

        A thread inside DuckDB when the interpreter exits brings the process down with
        it; ``tracker`` calls this at exit for every committer still alive."""
        self._stop.set()
        self._deadline = 0.0
        self._abandoned = True
        con = self._con
        if con is not None:
            with contextlib.suppress(Exception):
                con.interrupt()
        self._thread.join(wait)

    def _loop(self) -> None:
        wait = self.interval
        while True:
            stopping = self._stop.wait(wait)
            started = time.monotonic()
            ok = self.commit_once(final=stopping)
            if stopping:
                # the last rows: retry conflicts; an unreachable catalog leaves them spooled at once
                while not ok and self.down_since is None and time.monotonic() < self._deadline:
                    time.sleep(min(1.0, max(self._deadline - time.monotonic(), 0.0)) * random.random())
                    ok = self.commit_once(final=True)
                self._close()
                return
            if ok:  # the next commit starts one interval after this one started, or at once
                wait = max(self.interval - (time.monotonic() - started), MIN_GAP_S)
            else:
                wait = min(max(wait, self.interval) * 2, MAX_BACKOFF_S) * (0.5 + random.random())

    def _close(self) -> None:
        if self._con is not None:
            with contextlib.suppress(Exception):
                self._con.close()
            self._con = None

    def _commit(self, final: bool) -> None:
        from tracker.store.lake import LakeStore

        setting = current()
        if setting is None or self._abandoned:  # interrupted at exit: no new commit
            return
        store = LakeStore(self.home, setting)
        try:
            if self._con is None:  # kept between commits; dropped on any failure
                with _LOCK:
                    self._con = _HANDOFF.pop(self.home, None) or store.attach(read_only=False)
                self._con.execute("SET threads = 1")  # leave the other cores to training
            if not self._abandoned:  # abandon() may have come while attaching
                mark = self._spooled  # rows announced before the chunks are listed
                store.ingest(con=self._con, final=final)
                with self._progress:
                    self._committed = max(self._committed, mark)
                    self._progress.notify_all()
        except StoreError:
            self._close()
            raise

    def commit_once(self, final: bool = True) -> bool:
        """One commit; returns False while the catalog is unreachable or the commit failed."""
        from tracker.store.lake import STATS

        try:
            self._commit(final)
        except StoreUnavailableError as exc:
            STATS["unavailable"] += 1
            if self.down_since is None:
                self.down_since = time.time()
                log.warning("tracker: %s; retrying with backoff (this warning is not repeated)", exc)
            self._wake_waiters()
            return False
        except StoreError as exc:
            if self._abandoned:  # interrupted at exit: stop() already said the rows stay spooled
                return False
            if str(exc) != self.failed_with:
                self.failed_with = str(exc)
                log.warning("tracker: committing %s into the lake failed: %s; retrying", self.home, exc)
            self._wake_waiters()
            return False
        if self.down_since is not None:
            log.warning("tracker: the lake's catalog is reachable again after %.0f s; spooled rows committed",
                        time.time() - self.down_since)
            self.down_since = None
        self.failed_with = None
        return True


    def _wake_waiters(self) -> None:
        with self._progress:
            self._progress.notify_all()


class _Follower:
    """Stands for the ``tracker lake follow`` process that commits this spool instead
    (no backpressure: that process is not told what this one spools)."""

    users = 0

    def admit(self, rows: int) -> None:
        """No backpressure across processes."""


def acquire(home: Path) -> Committer | _Follower | None:
    """Start (or share) the committer of ``home``'s spool when a lake is selected.

    ``TRACKER_LAKE_COMMITTER=follow`` leaves commits to a ``tracker lake follow``
    process on this host: the training process then never connects to the catalog
    after ``init``.
    """
    if current() is None:
        return None
    if os.environ.get("TRACKER_LAKE_COMMITTER", "thread") == "follow":
        return _Follower()
    with _LOCK:
        committer = _COMMITTERS.get(home)
        if committer is None:
            committer = _COMMITTERS[home] = Committer(home)
            committer.start()
        committer.users += 1
        return committer


def release(committer: Committer | _Follower | None, timeout: float = 120.0) -> None:
    """Drop one user of ``committer``; the last one stops it after a final commit
    (retried for at most ``timeout`` seconds; then the rows stay spooled)."""
    if not isinstance(committer, Committer):
        return
    with _LOCK:
        committer.users -= 1
        if committer.users > 0:
            return
        _COMMITTERS.pop(committer.home, None)
    committer.stop(timeout)


@on_shutdown
def shutdown() -> None:
    """At interpreter exit: interrupt every commit still running (their rows stay spooled)."""
    for committer in list(_STARTED):
        if committer._thread.is_alive():
            committer.abandon()


def follow(home: Path, interval: float = 1.0, stop: threading.Event | None = None) -> None:
    """Commit ``home``'s spool into the lake every ``interval`` seconds until ``stop`` is set."""
    committer = Committer(home, interval)
    stop = stop or threading.Event()
    wait = interval
    while not stop.wait(wait):
        ok = committer.commit_once(final=False)
        wait = interval if ok else min(max(wait, interval) * 2, MAX_BACKOFF_S) * (0.5 + random.random())
    committer._stop.set()
    committer.commit_once()
    committer._close()
