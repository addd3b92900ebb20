"""Collapse statistics of embeddings: ``run.log_embeddings(key, z, step=...)``.

Rules:

* The training thread at most copies ``z`` to host memory and queues it: the shape,
  dtype and options of a key are checked once (again when the input's kind, shape,
  dtype or device changes), which binds the key's fast path
  (:func:`tracker.embedding_slot.fast_path`); then a call is one copy into a
  recycled buffer of that shape (pinned for a CUDA tensor) and a deque append, with
  no lock and no wake-up, and it never waits for the worker. A torch tensor already
  in host memory is not even copied there: it is queued as is, with its version
  counter, and the worker copies it (one written in place before that is left out,
  and the key copies at the call from then on; see :mod:`tracker.embedding_slot`).
  :mod:`bench.embeddings` measures the cost against the copy alone, inside a
  training loop. Everything else happens on one worker thread per run.
* Per key, the worker keeps a rolling window of the last ``window`` samples
  (default 25,600, RankMe's estimate; ``window * D * 4`` bytes) and logs, at the
  step of the newest sample in it:

  ``key/rankme``
      RankMe (Garrido et al., ICML 2023): ``exp(-sum_k p_k log p_k)`` with
      ``p_k = s_k / sum(s) + 1e-7`` over the singular values ``s`` of the window's
      embedding matrix; between 1 (collapse to a line) and ``min(W, D)``;
  ``key/std``
      the mean over dimensions of the std of the L2-normalised embeddings
      (SimSiam's collapse monitor): about ``1/sqrt(D)`` when healthy, 0 when
      every embedding is the same point;
  ``key/dead_dims``
      the share of dimensions whose std (of the raw embeddings) is below
      ``gamma`` (default 1.0, VICReg's variance target).

* The cadence. The worker looks at the queues every 20 ms while copies come
  (:data:`POLL_S`; 0.32 s once they stop) and leaves a key's copies queued until they
  hold the samples of its next evaluation (a window's worth at most): ``every`` new
  samples (default ``window // 25`` = 1,024; samples dropped unread count too; the
  first once the window holds ``min(window, max(2 * D, 256))``). Then it takes them
  (a window at most), puts
  them into the window in a few large numpy calls (batches regrouped into blocks
  of 256 to 4,096 rows, at most about 50 ms of work each, fewer as D grows; numpy
  releases the GIL inside each; once ``finish()`` began the worker stops after the
  group of batches it is on and puts the rest back at the queue's head) and evaluates
  once, at
  the newest batch's step: at most one evaluation per look and per ``every``
  samples, so a fast loop or a worker that fell behind gets fewer evaluations,
  each on the window that ends at the step it is logged at. A look that finds
  nothing due holds the GIL for a few microseconds. ``wait(run)`` makes the worker
  take whatever is queued (tests, benchmarks: the evaluations then fall each
  ``every`` samples whatever the pace).
* Bounded memory: a worker that falls behind by more than 1.5 windows has its
  oldest queued samples dropped (they would leave the window unread) down to one
  window, by the training thread (no lock: each batch is popped once, by one of the
  two), and the worker takes at most a window at a time, so the copies queued and
  held stay within 2.5 windows per key (plus a batch), the window itself beside
  them; the buffers go back to a bounded pool. Rows with NaN or inf are left out
  (counted). The worker holds the window's sums up to date as rows come and go
  (:mod:`tracker.embedding_window`), runs numpy's BLAS on a quarter of the cores
  (one on 4 or fewer) and on Linux at nice +10, so where cores are short the
  training thread gets them first.
* The keys' settings (``dim``, ``window``, ``gamma``, ``every``) are recorded in
  the run's config under ``tracker_embeddings`` (the web UI and the offline
  analysis read ``dim`` from there).
* After each evaluation the ``collapse`` detector (registered like every detector,
  :mod:`tracker.analysis.collapse`; ``config["analysis"]["collapse"]`` tunes or
  turns it off) judges the new points; its events are recorded with the run's.
* ``finish()`` logs the last statistics before the last flush: it stops the worker
  (which finishes the group of batches it is on, within half the logger timeout
  ``tracker_logger_timeout``; past it the worker's results are dropped) and, on its
  own thread, puts the newest ``max(every, min samples)`` rows still queued into
  the window and evaluates it once.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from collections import deque
from typing import Any, Callable

import numpy as np

from tracker.embedding_slot import Slot, dispatcher, fast_path
from tracker.embedding_window import CHUNK_ROWS, Window
from tracker.embedding_window import rankme, statistics  # noqa: F401  (public here)
from tracker.errors import ConfigError, RunError

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 25_600
DEFAULT_GAMMA = 1.0
CONFIG_KEY = "tracker_embeddings"
STATISTICS = ("rankme", "std", "dead_dims")
WORKER_NICE = 10  # the worker thread's niceness on Linux: the training thread comes first
POLL_S = 0.02  # the worker looks for new copies this often while they come (no wake-up per call)
IDLE_POLL_S = 0.32  # ... and backs off to this while none come


def _blocks(matrices: list[np.ndarray], rows: int) -> list[np.ndarray]:
    """``matrices`` regrouped in order into blocks of about ``rows`` rows: small ones concatenated,
    large ones cut."""
    out: list[np.ndarray] = []
    small: list[np.ndarray] = []
    held = 0
    for m in matrices:
        for a in range(0, m.shape[0], rows):
            piece = m[a : a + rows]
            small.append(piece)
            held += piece.shape[0]
            if held >= rows:
                out.append(small[0] if len(small) == 1 else np.concatenate(small))
                small, held = [], 0
    if small:
        out.append(small[0] if len(small) == 1 else np.concatenate(small))
    return out


def _as_matrix(z: Any) -> np.ndarray | None:
    """The (rows, D) matrix of a queued batch: a recycled buffer as is, or a copy of a shared host
    tensor, ``(tensor, version when queued)``; None for a shared one written in place since."""
    if type(z) is tuple:
        tensor, version = z
        if tensor._version != version:
            return None
        torch = sys.modules["torch"]
        array = tensor.float().numpy() if tensor.dtype not in (torch.float32, torch.float64) else \
            np.array(tensor.numpy(), copy=True)
        return None if tensor._version != version else array.reshape(-1, array.shape[-1])
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(z, torch.Tensor):
        z = z.float().numpy() if z.dtype not in (torch.float32, torch.float64) else z.numpy()
    array = np.asarray(z)
    return array.reshape(-1, array.shape[-1])


def _option(value: Any, default: Any, name: str, minimum: float, kind: type) -> Any:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and int(value) != value):
        expected = "an int" if kind is int else "a number"
        raise ConfigError(f"run.log_embeddings: {name} is {value!r}; expected {expected}")
    if not value >= minimum:
        raise ConfigError(f"run.log_embeddings: {name} is {value!r}; expected a value >= {minimum}")
    return kind(value)


class EmbeddingMonitor:
    """The queue of one run's embedding copies and the worker thread that turns them into statistics."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.keys: dict[str, Window] = {}
        self._slots: dict[str, Slot] = {}
        self.fast: dict[str, Callable[[Any, Any], bool]] = {}  # key -> its bound fast path (run.log_embeddings)
        self._lock = threading.Lock()  # never taken by the training thread's fast path
        self._wake = threading.Event()  # set by wait() and close(), never by a call: the worker polls
        self._done = threading.Condition(self._lock)
        self._waiting = 0  # wait() calls in progress: the worker takes whatever is queued, due or not
        self._closed = False
        self._abandoned = False
        self._emit = threading.Lock()  # a worker's statistics and events reach the run together
        self._recorded: set[str] = set()  # keys whose settings went into run.json
        self._thread: threading.Thread | None = None
        self.evaluations = 0

    @property
    def dropped_rows(self) -> int:
        """Samples dropped unread because the worker fell behind (all keys)."""
        return sum(slot.dropped for slot in list(self._slots.values()))

    # -- the training thread -------------------------------------------------------
    def submit(self, key: str, z: Any, step: int, window: Any = None, gamma: Any = None, every: Any = None) -> None:
        """Copy ``z`` to host memory and queue it (the only work done on the caller's thread).

        ``run.log_embeddings`` calls the key's :func:`fast_path` first; this is the full path: it
        checks the call, makes ``z`` the key's current input (binding a new fast path) and queues it."""
        slot, z = self._prepare(key, z, window, gamma, every)
        if not self._closed:
            self.fast[key](z, step)

    def _prepare(self, key: str, z: Any, window: Any, gamma: Any, every: Any) -> tuple[Slot, Any]:
        """Check a call the fast path does not take (first of a key, new shape, dtype or device,
        options) and make its input the key's current one; ``z`` as the copy will read it."""
        torch = sys.modules.get("torch")
        if not (torch is not None and isinstance(z, torch.Tensor)):
            z = np.asarray(z)
            if z.dtype.kind not in "fiub":
                raise ConfigError(f"run.log_embeddings: {key!r} has dtype {z.dtype}; expected real numbers "
                                  "(a float tensor or array)")
        elif z.is_complex():
            raise ConfigError(f"run.log_embeddings: {key!r} has dtype {z.dtype}; expected a real float tensor")
        shape = tuple(z.shape)
        if len(shape) < 2 or shape[-1] < 1:
            raise ConfigError(f"run.log_embeddings: {key!r} has shape {shape}; expected (N, D) embeddings")
        slot = self._slots.get(key)
        if slot is None:
            slot = self._declare(key, shape[-1], window, gamma, every)
        elif shape[-1] != slot.state.dim:
            raise ConfigError(f"run.log_embeddings: {key!r} has dimension {shape[-1]}; earlier calls had "
                              f"{slot.state.dim}")
        else:
            for name, value in (("window", window), ("gamma", gamma), ("every", every)):
                if value is not None and value != getattr(slot.state, name):
                    raise ConfigError(f"run.log_embeddings: {name}={value!r} for {key!r}, whose settings its first "
                                      f"call fixed: {slot.state.settings()}")
        slot.use(z, torch)
        self.fast[key] = fast_path(self, slot)
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._loop, name=f"tracker-embeddings-{self.run.run_id}",
                                            daemon=True)
            self._thread.start()
        return slot, z

    def _declare(self, key: str, dim: int, window: Any, gamma: Any, every: Any) -> Slot:
        w = _option(window, DEFAULT_WINDOW, "window", 2, int)
        state = Window(key=key, dim=int(dim), window=w, gamma=_option(gamma, DEFAULT_GAMMA, "gamma", 0.0, float),
                       every=_option(every, max(1, w // 25), "every", 1, int))
        slot = Slot(state)
        with self._lock:
            self.keys[key] = state
            self._slots[key] = slot
        recorded = dict(self.run.config.get(CONFIG_KEY) or {})
        recorded[key] = state.settings()
        self.run.config[CONFIG_KEY] = recorded
        return slot

    # -- the worker ---------------------------------------------------------------------
    def _take(self, everything: bool) -> list[tuple[Slot, list[tuple[int, Any, int, deque[Any]]]]]:
        """Per key, the queued batches (a window of rows at most) once they hold the rows of its
        next evaluation, or whatever is queued when ``everything`` (wait(), close()); none of a
        key whose next evaluation is not due yet, so the worker holds the GIL only to evaluate."""
        out = []
        for slot in list(self._slots.values()):
            state, queue = slot.state, slot.queue
            if slot.dropped > slot.skipped:
                dropped, slot.skipped = slot.dropped - slot.skipped, slot.dropped
                state.skip(dropped)
                slot.done += dropped
            # the rows of its next evaluation, a window at most (``every`` may exceed what the queue holds)
            need = min(max(state.every - state.since, state.min_samples - state.filled, 1), state.window)
            if not queue or (not everything and slot.queued() < need):
                continue
            items, rows, limit = [], 0, math.inf if self._closed else state.window
            try:
                while rows < limit:  # appends may go on at the right, drops at the left
                    item = queue.popleft()
                    items.append(item)
                    rows += item[2]
            except IndexError:
                pass
            slot.taken += rows
            if items:
                out.append((slot, items))
        return out

    def _loop(self) -> None:
        _lower_priority()
        pause = POLL_S
        while True:
            self._wake.wait(pause)
            self._wake.clear()
            if self._closed:  # close() takes what is left, on its own thread (this one runs at nice +10)
                return
            if self._work(self._waiting > 0):
                pause = POLL_S
            elif not any(slot.queue for slot in list(self._slots.values())):
                pause = min(IDLE_POLL_S, pause * 2)

    def _work(self, everything: bool = True) -> bool:
        """Process the batches :meth:`_take` gives (the worker's loop, or close() at the end);
        False when there were none."""
        taken = self._take(everything)
        for slot, items in taken:
            state, left = slot.state, []
            try:
                if state.key not in self._recorded:
                    self._recorded.add(state.key)
                    self._record_config()
                with _one_blas_thread():
                    left = self._process(slot, items)
            except Exception:  # the worker must survive anything
                log.exception("tracker: embedding statistics of %s in run %s failed", state.key, self.run.run_id)
            if left:  # back at the queue's head, in order, for close()
                slot.queue.extendleft(reversed(left))
                slot.taken -= sum(item[2] for item in left)
            slot.done += sum(item[2] for item in items) - sum(item[2] for item in left)
            with self._lock:
                self._done.notify_all()
        if not taken and everything:
            with self._lock:
                self._done.notify_all()
        return bool(taken)

    def _process(self, slot: Slot, items: list[tuple[int, Any, int, deque[Any]]]) -> list[Any]:
        """Add ``items`` to the window in a few large numpy calls (small batches concatenated into
        blocks of 256 to CHUNK_ROWS rows, fewer as D grows: the worker holds the GIL only between
        them, and once finish() began it stops after the group of batches it is on), then
        evaluate once, at the newest batch's step, if ``every`` samples came since the last
        evaluation: at most one evaluation per take, so a worker behind evaluates as often as it
        can, never more than every ``every`` samples. Returns the batches it left for close()
        (finish() began while it worked), oldest first. A shared tensor written in place since it
        was queued is left out (``slot.changed``) and the key copies at the call from then on."""
        state = slot.state
        if self._abandoned:
            return []
        if self._closed:  # finishing: only the newest go in
            keep, rows = max(state.every, state.min_samples), 0
            for i in range(len(items) - 1, -1, -1):
                rows += items[i][2]
                if rows >= keep:
                    break
            state.skip(sum(item[2] for item in items[:i]))
            for _, buf, _, free in items[:i]:
                free.append(buf)
            items = items[i:]
        size = max(256, min(CHUNK_ROWS, 2**28 // state.dim**2))
        groups: list[list[tuple[int, Any, int, deque[Any]]]] = [[]]
        held = 0
        for item in items:  # whole batches per group of about ``size`` rows
            groups[-1].append(item)
            held += item[2]
            if held >= size:
                groups.append([])
                held = 0
        stopping = threading.current_thread() is self._thread
        for g, group in enumerate(groups):
            if stopping and self._closed:  # finish() began: the rest goes back, close() takes the newest
                return [item for rest in groups[g:] for item in rest]
            matrices = []
            for item in group:
                matrix = _as_matrix(item[1])
                if matrix is None:
                    self._changed(slot, item[2])
                else:
                    matrices.append(matrix)
            for block in _blocks(matrices, size):
                state.add(block)
            for _, buf, _, free in group:  # their rows are in the window now
                free.append(buf)
        if state.due() and not (stopping and self._closed):
            self._evaluate(state, items[-1][0])
        return []

    def _changed(self, slot: Slot, rows: int) -> None:
        """``rows`` of a shared tensor were written in place before the worker copied them: left out,
        and the key's next call binds the copying fast path (warned once per key)."""
        if slot.share:
            log.warning("tracker: run %s: embeddings %r were written in place after log_embeddings and before "
                        "their statistics read them; %d rows left out, and from now on the call copies them "
                        "(log a tensor that is not modified afterwards, or z.clone(), to avoid it)",
                        self.run.run_id, slot.state.key, rows)
        slot.share = False
        slot.changed += rows

    def _evaluate(self, state: Window, step: int) -> bool:
        """Evaluate the window and log the statistics at ``step``; False once the run is finished.

        The statistics and their events go out together, under ``_emit``: once close() gave up
        on a worker, nothing of it reaches the run."""
        stats = state.evaluate()
        events = self._detect(state, step, stats)
        with self._emit:
            if self._abandoned:
                return False
            try:
                self.run.log({f"{state.key}/{name}": value for name, value in stats.items()}, step=step)
            except RunError:  # the run finished without waiting for this evaluation
                self._abandoned = True
                return False
            self.evaluations += 1
            for event in events:
                self.run._add_event(event)
        return True

    def _record_config(self) -> None:
        meta = getattr(self.run, "_meta", None)
        if meta is not None and self.run.rank == 0:
            meta.update(config=self.run.config)

    def _detect(self, state: Window, step: int, stats: dict[str, float]) -> list[Any]:
        if state.streams is None:
            state.streams = collapse_streams(state.key, self.run.config)
        from tracker.analysis.detectors import Chunk

        events = []
        for name, stream in state.streams.items():
            events.extend(stream.feed(Chunk(np.array([step], dtype=np.int64), np.array([stats[name]]))))
        return events

    def wait(self, timeout: float) -> bool:
        """Wait until every batch queued so far is processed; False past ``timeout`` seconds."""
        targets = [(slot, slot.submitted) for slot in list(self._slots.values())]
        with self._lock:
            self._waiting += 1
        try:
            self._wake.set()
            with self._lock:
                return self._done.wait_for(lambda: all(s.done >= t for s, t in targets), timeout)
        finally:
            with self._lock:
                self._waiting -= 1

    def close(self, timeout: float) -> None:
        """Stop the worker (it finishes the batch it is on, at most ``timeout`` seconds), then, on
        this thread, put the newest ``max(every, min samples)`` rows still queued into the windows
        and log their last statistics. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            with self._emit:
                self._abandoned = self._thread.is_alive()
            if self._abandoned:
                log.warning("tracker: run %s: the embedding statistics did not finish within %g s; the last "
                            "ones are left out", self.run.run_id, timeout)
                return
        for slot in list(self._slots.values()):
            slot.trim()  # a window of the newest rows at most, all of it taken at once
        self._work()


_BLAS: list[Any] = []  # threadpoolctl's controller of the BLAS libraries loaded, found once


def blas_threads() -> int:
    """The BLAS threads the worker computes with: a quarter of this process's cores, at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // 4)


def _one_blas_thread() -> Any:
    """Run numpy's BLAS on :func:`blas_threads` threads while the worker computes (threadpoolctl;
    the limit is the process's for that time): OpenBLAS's own threads are not niced, and they
    spin after each call, so on a machine with few cores a BLAS pool working beside the training
    thread took its cores (10 ms lost per 5 ms training step on 2 cores, 0.8 ms with one thread)."""
    if not _BLAS:
        from threadpoolctl import ThreadpoolController

        _BLAS.append(ThreadpoolController())
    return _BLAS[0].limit(limits=blas_threads(), user_api="blas")


def _lower_priority() -> None:
    """Make this thread yield the CPU to the training thread (Linux: per-thread nice +10)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)
    except (AttributeError, OSError):  # not Linux, or not allowed: the thread keeps the process's priority
        pass


def collapse_streams(key: str, config: dict[str, Any]) -> dict[str, Any]:
    """The collapse detector's streams for the statistics of embedding ``key`` (empty when it is off)."""
    from tracker.analysis.detectors import StreamContext
    from tracker.analysis.params import analysis_section, resolve
    from tracker.host import get_host

    section = config.get("analysis")
    spec = get_host().items("detectors").get("collapse")
    if spec is None or section is False or (isinstance(section, dict) and section.get("enabled", True) is False):
        return {}
    params = resolve("collapse", spec.params, analysis_section(config).get("collapse"))
    if params is None:
        return {}
    from tracker.analysis.collapse import FEED_FLAG

    fed = {**config, FEED_FLAG: True}
    return {name: spec.factory(StreamContext(key=f"{key}/{name}", params=dict(params), config=fed))
            for name in STATISTICS}


def wait(run: Any, timeout: float = 30.0) -> bool:
    """Wait until the statistics of every embedding ``run`` queued so far are computed and logged.

    Logging never needs this; it makes the points deterministic where a loop outruns the
    worker (tests, benchmarks). Returns False past ``timeout`` seconds.
    """
    found = run.__dict__.get("_embeddings")
    return True if found is None else found.wait(timeout)


def monitor(run: Any) -> EmbeddingMonitor:
    """The run's monitor (created on first use)."""
    found = run.__dict__.get("_embeddings")
    if found is None:
        found = run.__dict__["_embeddings"] = EmbeddingMonitor(run)
        run.__dict__["log_embeddings"] = dispatcher(run, found)  # warm calls one frame shorter
    return found
