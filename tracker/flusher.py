"""The flusher of a run: buffered rows to Arrow batches, handed to the loggers' lanes.

Mixed into :class:`tracker.run.Run` (it uses the run's buffers and counters); the
policy it implements (write first, analyse after, the buffer bound and what happens
when the disk cannot keep up) is stated in :mod:`tracker.run`.
"""

from __future__ import annotations

import logging
import numbers
import threading
import time
from collections import deque
from typing import Any

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from tracker.errors import ConfigError
from tracker.events import Event
from tracker.loggers import Batch, Lane
from tracker.runtables import class_table, events_table, metrics_table, salvage

log = logging.getLogger("tracker.run")

FLUSH_INTERVAL_S = 1.0
FLUSH_ROWS = 100_000
MAX_BUFFERED_ROWS = 4 * FLUSH_ROWS
LANE_BOUND_ROWS = 2 * MAX_BUFFERED_ROWS
MAX_HELD_ROWS = MAX_BUFFERED_ROWS + LANE_BOUND_ROWS + 2 * FLUSH_ROWS  # values in memory, at most
BACKPRESSURE_WAIT_S = 1.0


def check_timeout(timeout: Any) -> float:
    """``timeout`` of :meth:`Run.flush` as seconds, or a ConfigError naming it."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0 <= float(timeout) < float("inf"):
        raise ConfigError(
            f"run.flush: timeout is {timeout!r}; expected seconds >= 0 (a finite number), "
            "or None for the logger timeout (tracker_logger_timeout, default 30 s)"
        )
    return float(timeout)


class Flusher:
    """The background half of :class:`tracker.run.Run` (see the module doc)."""

    # attributes set by Run.__init__
    run_id: str
    rank: int
    segment: int
    status: str
    flush_interval: float
    logger_timeout: float
    _buf: deque[Any]
    _cbuf: deque[Any]
    _ebuf: deque[Any]
    _logged: int
    _released: int
    _handed: int
    _degraded: bool
    _warned_behind: bool
    backpressure_s: float
    _sessions: list[tuple[str, Any]]
    _lanes: list[Lane]
    _analysis: Lane | None
    _analyzer: Any
    _meta: Any
    _seq: int
    _status_flushed: str
    _reported_drops: dict[str, int]
    _lock: threading.Lock
    _done_lock: threading.Lock
    _done_cv: threading.Condition
    _open: dict[int, Batch]
    _lost_seqs: deque[int]
    _barrier_seq: int
    _wake: threading.Event
    _stop: threading.Event
    _thread: threading.Thread | None
    _last_step: int | None
    start_step: int
    _written_step: int | None

    def _add_event(self, ev: Event) -> None:
        raise NotImplementedError

    @property
    def dropped_rows(self) -> dict[str, int]:
        """Values each logger had to drop (disk full past the bound, disabled); empty when none."""
        return {lane.name: lane.dropped_rows for lane in self._lanes if lane.dropped_rows}

    def _backpressure(self) -> None:
        """Wait (bounded) for the flusher and the loggers to catch up; see the module doc."""
        start = time.monotonic()
        try:
            self._wait_for_loggers(start + BACKPRESSURE_WAIT_S)
        finally:
            self.backpressure_s += time.monotonic() - start

    def _wait_for_loggers(self, deadline: float) -> None:
        while True:
            over = not self._degraded and self._logged - self._released > MAX_BUFFERED_ROWS
            if not over and self._logged - self._handed <= MAX_BUFFERED_ROWS:
                return
            if time.monotonic() > deadline:
                if not over:
                    return
                self._degraded = True
                if self._warned_behind:
                    return
                self._warned_behind = True
                log.warning(
                    "tracker: run %s: the loggers are more than %d values behind; logging goes on, "
                    "and a logger that stays stuck drops its oldest rows past %d (counted in run.json)",
                    self.run_id, MAX_BUFFERED_ROWS, LANE_BOUND_ROWS,
                )
                return
            self._wake.set()
            time.sleep(0.002)


    # -- the flusher -----------------------------------------------------------------
    def _start(self) -> None:
        for name, session in self._sessions:
            self._lanes.append(
                Lane(name, session, run_id=self.run_id, bound_rows=LANE_BOUND_ROWS, done=self._lane_done)
            )
        if self._analyzer is not None:
            self._analysis = Lane(
                "online analysis", _Analysis(self), run_id=self.run_id, bound_rows=MAX_BUFFERED_ROWS,
                done=lambda lane, batch, written: None, kind="analysis",
            )
        self._thread = threading.Thread(target=self._loop, name=f"tracker-flush-{self.run_id}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from tracker.store.spoolmeta import heartbeat_s

        try:  # TRACKER_HEARTBEAT_S (checked by init): refreshed at least this often, even when idle
            beat = heartbeat_s()
        except Exception:
            beat = 60.0
        while not self._stop.is_set():
            self._wake.wait(min(self.flush_interval, beat / 2))
            self._wake.clear()
            try:
                self._flush()
                if self._meta is not None and time.time() - self._meta.segment.heartbeat >= beat / 2:
                    self._meta.flushed(None)
            except Exception:  # the flusher must survive anything
                log.exception("tracker: flush of run %s failed", self.run_id)

    def _flush(self) -> int:
        """Hand what is buffered to the lanes; returns the sequence number of the last batch
        handed off so far (-1 when none): every row logged before the call is in it or before."""
        with self._lock:
            for lane in self._lanes:
                lane.check_hung(self.logger_timeout)
            if self._analysis is not None:
                self._analysis.check_hung(self.logger_timeout)
            self._report_drops()
            buf, cbuf, ebuf = _drain(self._buf), _drain(self._cbuf), _drain(self._ebuf)
            if ebuf and self.__dict__.get("_notify") is not None:  # alerts and on_event (tracker.notify)
                self.__dict__["_notify"].submit(ebuf)
            if not (buf or cbuf or ebuf):
                return self._seq - 1
            ident = (self.run_id, self.rank, self.segment)
            metrics = self._table(metrics_table, ident, buf, lambda r: len(r[3]))
            classes = self._table(class_table, ident, cbuf, lambda r: r[3].size)
            events = self._table(events_table, ident, ebuf, lambda r: 0)
            self._handed += (metrics.num_rows if metrics is not None else 0) + (
                classes.num_rows if classes is not None else 0
            )
            changed = self.status if self.status != self._status_flushed else None
            self._status_flushed = self.status
            batch = Batch(self._seq, metrics, classes, events, self._flushed_step(metrics, classes), changed)
            self._seq += 1
            if self._meta is not None and changed and self.rank == 0:
                self._meta.update(status=changed)
            self._hand_off(batch)
            if self._analysis is not None and (metrics is not None or classes is not None):
                self._analysis.put(Batch(batch.seq, metrics, classes, None, batch.last_step))
            return batch.seq

    # -- the durability barrier (Run.flush) -----------------------------------------
    def _barrier(self, limit: float) -> bool:
        """Flush, then wait up to ``limit`` s until every lane is done with the batches
        handed off so far; True when the durable record holds all of them."""
        deadline = time.monotonic() + limit
        since = self._barrier_seq
        target = self._flush()
        with self._done_cv:
            self._done_cv.wait_for(lambda: not any(s <= target for s in self._open),
                                   max(deadline - time.monotonic(), 0.0))
            behind = [b for s, b in self._open.items() if s <= target and b.durable_pending]
            lost = sum(1 for s in self._lost_seqs if since < s <= target)
        if behind:
            names = sorted({n for b in behind for n in b.durable_pending})
            return self._barrier_missed(limit, f"logger {', '.join(map(repr, names))} has not written them yet")
        self._barrier_seq = max(self._barrier_seq, target)
        if lost:
            log.warning(
                "tracker: run %s: flush(): %d of the batches logged before it could not be written by the "
                "store (a logger was disabled or dropped rows; see the warnings above and run.json)",
                self.run_id, lost,
            )
            return False
        return True

    def _barrier_missed(self, limit: float, why: str) -> bool:
        log.warning(
            "tracker: run %s: flush() gave up after %g s: rows logged before it are not all durable yet (%s); "
            "training goes on and they are written as soon as the logger can",
            self.run_id, limit, why,
        )
        return False

    def _table(self, build: Any, ident: tuple[str, int, int], rows: list[Any], size: Any) -> pa.Table | None:
        if not rows:
            return None
        table, bad = salvage(build, ident, rows)
        if bad:
            n = sum(size(r) for r in bad)
            self._handed += n
            with self._done_lock:
                self._released += n
            log.error("tracker: run %s: %d rows could not be stored and were left out", self.run_id, len(bad))
        return table

    def _hand_off(self, batch: Batch) -> None:
        lanes = [lane for lane in self._lanes if not lane.disabled]
        batch.pending = {lane.name for lane in lanes}
        if any(lane.durable for lane in self._lanes):  # the store (disabled: nothing is durable)
            batch.durable_pending = {lane.name for lane in lanes if lane.durable}
            batch.durable_ok = bool(batch.durable_pending)
        else:  # no durable logger at all: the others are the run's record
            batch.durable_pending = set(batch.pending)
        with self._done_lock:
            if not batch.durable_pending:
                self._lost_seqs.append(batch.seq)  # no logger left to make these rows durable
            if batch.pending:
                self._open[batch.seq] = batch
        if not lanes:
            with self._done_lock:
                self._released += batch.rows
            if self._meta is not None and not self._lanes:
                self._meta.flushed(batch.last_step, batch.seq)
            return
        for lane in lanes:
            for old in lane.put(batch):
                if lane.durable and old.events is not None and old is not batch:
                    self._ebuf.extend(tuple(r.values())[3:] for r in old.events.to_pylist())  # keep events
                self._lane_done(lane, old, False)

    def _lane_done(self, lane: Lane, batch: Batch, written: bool) -> None:
        """A lane is done with ``batch``: release its rows once every lane is, and record
        the rows as durable once every durable lane wrote them."""
        record = finished = False
        with self._done_lock:
            if lane.name not in batch.pending:
                return
            batch.pending.discard(lane.name)
            if lane.name in batch.durable_pending:
                batch.durable_pending.discard(lane.name)
                batch.durable_ok = batch.durable_ok and written
                record = not batch.durable_pending and batch.durable_ok
                if not batch.durable_pending and not batch.durable_ok:
                    self._lost_seqs.append(batch.seq)
            if not batch.pending:
                self._released += batch.rows
                finished = True
        if record and self._meta is not None:
            self._meta.flushed(batch.last_step, batch.seq)
        if finished:  # after the segment JSON: a flush() that returns finds the spool claiming the rows
            with self._done_cv:
                self._open.pop(batch.seq, None)
                self._done_cv.notify_all()

    def _report_drops(self) -> None:
        """An event and run.json fields for values a logger dropped since the last report."""
        for lane in self._lanes:
            n = lane.dropped_rows - self._reported_drops.get(lane.name, 0)
            if n <= 0:
                continue
            self._reported_drops[lane.name] = lane.dropped_rows
            msg = f"logger {lane.name!r} dropped {n} values ({lane.dropped_rows} in all): it could not write them"
            log.error("tracker: run %s: %s", self.run_id, msg)
            self._add_event(
                Event(step=self._last_step or self.start_step, kind="rows_dropped", message=msg, key=None,
                      severity="error", data={"logger": lane.name, "rows": n, "total": lane.dropped_rows})
            )
            if self._meta is not None and self.rank == 0:
                drops = self.dropped_rows
                self._meta.update(dropped_rows=sum(drops.values()), dropped_by_logger=drops)

    def _flushed_step(self, metrics: pa.Table | None, classes: pa.Table | None) -> int | None:
        """The last step written so far (from the rows themselves: log() may run concurrently)."""
        for table in (metrics, classes):
            if table is not None and table.num_rows:
                top = pa.compute.max(table.column("step")).as_py()
                self._written_step = top if self._written_step is None else max(self._written_step, top)
        return self._written_step

    def _analyze(self, metrics: pa.Table | None, classes: pa.Table | None) -> None:
        """Run the online detectors on one batch (on the analysis thread); their events
        go out with the next flush."""
        if self._analyzer is None:
            return
        try:
            found = self._analyzer.observe(metrics, classes)
        except Exception:
            log.exception("tracker: online analysis of run %s failed; it is switched off", self.run_id)
            self._analyzer = None
            return
        for ev in found or ():
            if ev.status:
                self.status = ev.status
            self._add_event(ev)
        if found:
            self._wake.set()


class _Analysis:
    """The online analyzer as a lane's session (it writes nothing itself)."""

    def __init__(self, run: Flusher) -> None:
        self.run = run

    def write(self, batch: Batch) -> None:
        self.run._analyze(batch.metrics, batch.class_metrics)

    def close(self, status: str) -> None:
        return None


def _drain(queue: deque[Any]) -> list[Any]:
    """Pop what ``queue`` holds now, oldest first (appends racing with this stay queued)."""
    pop = queue.popleft
    return [pop() for _ in range(len(queue))]
