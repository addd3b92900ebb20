"""The flusher of a run: buffered rows to Arrow batches, handed to the loggers' lanes.

A component that :class:`tracker.run.Run` owns. The run's training thread appends to
the flusher's buffers (:attr:`Flusher.buf`, :attr:`Flusher.cbuf`, the same deques the
run holds) and counts what it logged; everything else happens here, on the flusher's
own thread: batches built, handed to each logger's lane, the analysis fed, the run's
metadata advanced once the rows are durable. What it needs of the run is passed in:
its identity, the flush interval and logger timeout, and, when it starts, the logger
sessions, the online analyzer and the metadata writer (:class:`tracker.runmeta.RunMeta`).
The policy it implements (write first, analyse after, the buffer bound and what
happens when the disk cannot keep up) is stated in :mod:`tracker.run`.
"""

from __future__ import annotations

import json
import logging
import numbers
import threading
import time
from collections import deque
from typing import Any, Callable, Sequence

import numpy as np
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
    """The background half of a run (see the module doc).

    ``last_step()`` gives the run's last logged step (for the events the flusher adds);
    ``notifier()`` the run's alert dispatcher, or None (:mod:`tracker.notify`).
    """

    def __init__(
        self, *, run_id: str, rank: int, segment: int, flush_interval: float, logger_timeout: float,
        last_step: Callable[[], int], notifier: Callable[[], Any],
    ) -> None:
        self.run_id, self.rank, self.segment = run_id, rank, segment
        self.flush_interval, self.logger_timeout = flush_interval, logger_timeout
        self._last_step, self._notifier = last_step, notifier
        self.status = "running"
        # deques: log() appends while the flusher pops from the other end; both are atomic,
        # so a row appended during a flush is never lost (a swapped list could lose it)
        self.buf: deque[tuple[int, float, tuple[str, ...], list[float]]] = deque()
        self.cbuf: deque[tuple[int, float, str, np.ndarray]] = deque()
        self.ebuf: deque[tuple[Any, ...]] = deque()
        self.wake = threading.Event()
        self.released = 0  # values every logger is done with (under _done_lock)
        self.degraded = False  # log() stopped waiting: a logger is stuck (training thread)
        self.backpressure_s = 0.0  # seconds log() spent waiting for the flusher and loggers
        self._handed = 0  # values the flusher took out of the buffers (flusher only)
        self._warned_behind = False
        self.lanes: list[Lane] = []
        self.analysis: Lane | None = None
        self._analyzer: Any = None
        self._meta: Any = None
        self._seq = 0
        self._status_flushed = "running"
        self._reported_drops: dict[str, int] = {}
        self._written_step: int | None = None
        self._lock = threading.Lock()  # serialises flushes, never held by log()
        self._done_lock = threading.Lock()
        self._done_cv = threading.Condition(self._done_lock)  # barrier(): a batch left _open
        self._open: dict[int, Batch] = {}  # seq -> Batch that some logger has not finished (under _done_lock)
        self._lost_seqs: deque[int] = deque(maxlen=1024)  # batches the durable record lacks (under _done_lock)
        self._barrier_seq = -1  # the last batch a barrier() has accounted for
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the run calls ------------------------------------------------------------
    def add_event(self, ev: Event) -> None:
        """Queue ``ev`` for the next flush (any thread)."""
        self.ebuf.append(
            (ev.step, ev.key, ev.kind, ev.severity, ev.message,
             json.dumps(ev.data, default=float, allow_nan=True), time.time())
        )

    @property
    def dropped_rows(self) -> dict[str, int]:
        """Values each logger had to drop (disk full past the bound, disabled); empty when none."""
        return {lane.name: lane.dropped_rows for lane in self.lanes if lane.dropped_rows}

    def backpressure(self, logged: int) -> None:
        """Wait (bounded) until the flusher and the loggers caught up with the ``logged``
        values (training thread); see :mod:`tracker.run`."""
        start = time.monotonic()
        try:
            self._wait_for_loggers(logged, start + BACKPRESSURE_WAIT_S)
        finally:
            self.backpressure_s += time.monotonic() - start

    def _wait_for_loggers(self, logged: int, deadline: float) -> None:
        while True:
            over = not self.degraded and logged - self.released > MAX_BUFFERED_ROWS
            if not over and logged - self._handed <= MAX_BUFFERED_ROWS:
                return
            if time.monotonic() > deadline:
                if not over:
                    return
                self.degraded = True
                if self._warned_behind:
                    return
                self._warned_behind = True
                log.warning(
                    "tracker: run %s: the loggers are more than %d values behind; logging goes on, "
                    "and a logger that stays stuck drops its oldest rows past %d (counted in run.json)",
                    self.run_id, MAX_BUFFERED_ROWS, LANE_BOUND_ROWS,
                )
                return
            self.wake.set()
            time.sleep(0.002)

    def start(self, sessions: Sequence[tuple[str, Any]], analyzer: Any, meta: Any) -> None:
        """One lane per logger session (and one for ``analyzer``), then the flusher thread.
        ``meta``: the run's metadata writer (:class:`tracker.runmeta.RunMeta`), or None."""
        self._analyzer, self._meta = analyzer, meta
        for name, session in sessions:
            self.lanes.append(
                Lane(name, session, run_id=self.run_id, bound_rows=LANE_BOUND_ROWS, done=self._lane_done)
            )
        if analyzer is not None:
            self.analysis = Lane(
                "online analysis", _Analysis(self), run_id=self.run_id, bound_rows=MAX_BUFFERED_ROWS,
                done=lambda lane, batch, written: None, kind="analysis",
            )
        self._thread = threading.Thread(target=self._loop, name=f"tracker-flush-{self.run_id}", daemon=True)
        self._thread.start()

    def drain(self, deadline: float) -> None:
        """Stop the thread and hand every buffered row to the lanes (the analysis' last events
        too), each lane given until ``deadline`` (monotonic) to write them, else disabled."""
        self._stop.set()
        self.wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.logger_timeout)
        self.flush()
        if self.analysis is not None:  # events found in the last rows go out too
            if not self.analysis.wait_idle(min(deadline - time.monotonic(), self.logger_timeout / 2)):
                self.analysis.disable("it did not finish the last rows in time")
            self.flush()
        for lane in self.lanes:
            if not lane.wait_idle(deadline - time.monotonic()):
                lane.disable(f"it did not write its last rows within {self.logger_timeout:g} s")
        self._report_drops()

    def close(self, status: str, deadline: float) -> None:
        """Close every lane's session with ``status``, waiting until ``deadline`` at most."""
        lanes = [*self.lanes, *([self.analysis] if self.analysis is not None else [])]
        for lane in lanes:
            lane.request_close(status)
        for lane in lanes:
            lane.wait_closed(deadline - time.monotonic())

    # -- the flusher -----------------------------------------------------------------
    def _loop(self) -> None:
        from tracker.store.spoolmeta import heartbeat_s

        try:  # TRACKER_HEARTBEAT_S (checked by init): refreshed at least this often, even when idle
            beat = heartbeat_s()
        except Exception:
            beat = 60.0
        while not self._stop.is_set():
            self.wake.wait(min(self.flush_interval, beat / 2))
            self.wake.clear()
            try:
                self.flush()
                if self._meta is not None and time.time() - self._meta.segment.heartbeat >= beat / 2:
                    self._meta.flushed(None)
            except Exception:  # the flusher must survive anything
                log.exception("tracker: flush of run %s failed", self.run_id)

    def flush(self) -> int:
        """Hand what is buffered to the lanes; returns the sequence number of the last batch
        handed off so far (-1 when none): every row logged before the call is in it or before."""
        with self._lock:
            for lane in self.lanes:
                lane.check_hung(self.logger_timeout)
            if self.analysis is not None:
                self.analysis.check_hung(self.logger_timeout)
            self._report_drops()
            buf, cbuf, ebuf = _drain(self.buf), _drain(self.cbuf), _drain(self.ebuf)
            notify = self._notifier() if ebuf else None
            if notify is not None:  # alerts and on_event (tracker.notify)
                notify.submit(ebuf)
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
            if self.analysis is not None and (metrics is not None or classes is not None):
                self.analysis.put(Batch(batch.seq, metrics, classes, None, batch.last_step))
            return batch.seq

    # -- the durability barrier (Run.flush) -----------------------------------------
    def barrier(self, limit: float) -> bool:
        """Flush, then wait up to ``limit`` s until every lane is done with the batches
        handed off so far; True when the durable record holds all of them."""
        deadline = time.monotonic() + limit
        since = self._barrier_seq
        target = self.flush()
        with self._done_cv:
            self._done_cv.wait_for(lambda: not any(s <= target for s in self._open),
                                   max(deadline - time.monotonic(), 0.0))
            behind = [b for s, b in self._open.items() if s <= target and b.durable_pending]
            lost = sum(1 for s in self._lost_seqs if since < s <= target)
        if behind:
            names = sorted({n for b in behind for n in b.durable_pending})
            return self.barrier_missed(limit, f"logger {', '.join(map(repr, names))} has not written them yet")
        self._barrier_seq = max(self._barrier_seq, target)
        if lost:
            log.warning(
                "tracker: run %s: flush(): %d of the batches logged before it could not be written by the "
                "store (a logger was disabled or dropped rows; see the warnings above and run.json)",
                self.run_id, lost,
            )
            return False
        return True

    def barrier_missed(self, limit: float, why: str) -> bool:
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
                self.released += n
            log.error("tracker: run %s: %d rows could not be stored and were left out", self.run_id, len(bad))
        return table

    def _hand_off(self, batch: Batch) -> None:
        lanes = [lane for lane in self.lanes if not lane.disabled]
        batch.pending = {lane.name for lane in lanes}
        if any(lane.durable for lane in self.lanes):  # the store (disabled: nothing is durable)
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
                self.released += batch.rows
            if self._meta is not None and not self.lanes:
                self._meta.flushed(batch.last_step, batch.seq)
            return
        for lane in lanes:
            for old in lane.put(batch):
                if lane.durable and old.events is not None and old is not batch:
                    self.ebuf.extend(tuple(r.values())[3:] for r in old.events.to_pylist())  # keep events
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
                self.released += batch.rows
                finished = True
        if record and self._meta is not None:
            self._meta.flushed(batch.last_step, batch.seq)
        if finished:  # after the segment JSON: a flush() that returns finds the spool claiming the rows
            with self._done_cv:
                self._open.pop(batch.seq, None)
                self._done_cv.notify_all()

    def _report_drops(self) -> None:
        """An event and run.json fields for values a logger dropped since the last report."""
        for lane in self.lanes:
            n = lane.dropped_rows - self._reported_drops.get(lane.name, 0)
            if n <= 0:
                continue
            self._reported_drops[lane.name] = lane.dropped_rows
            msg = f"logger {lane.name!r} dropped {n} values ({lane.dropped_rows} in all): it could not write them"
            log.error("tracker: run %s: %s", self.run_id, msg)
            self.add_event(
                Event(step=self._last_step(), kind="rows_dropped", message=msg, key=None,
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
            self.add_event(ev)
        if found:
            self.wake.set()


class _Analysis:
    """The online analyzer as a lane's session (it writes nothing itself)."""

    def __init__(self, flusher: Flusher) -> None:
        self.flusher = flusher

    def write(self, batch: Batch) -> None:
        self.flusher._analyze(batch.metrics, batch.class_metrics)

    def close(self, status: str) -> None:
        return None


def _drain(queue: deque[Any]) -> list[Any]:
    """Pop what ``queue`` holds now, oldest first (appends racing with this stay queued)."""
    pop = queue.popleft
    return [pop() for _ in range(len(queue))]
