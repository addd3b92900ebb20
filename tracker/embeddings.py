"""Collapse statistics of embeddings: ``run.log_embeddings(key, z, step=...)``.

Rules:

* The training thread only copies ``z`` to host memory (a numpy array or a CPU
  tensor: the copy is the whole cost, :mod:`bench.embeddings` measures it) and
  queues it. Everything else happens on one worker thread per run.
* Per key, the worker keeps a rolling window of the last ``window`` samples
  (default 25,600, RankMe's estimate; ``window * D * 4`` bytes) and, once it
  holds ``min(window, max(2 * D, 256))`` samples, evaluates at most every
  ``every`` new samples (default ``window // 25``), at the step of the newest
  sample, and logs:

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

  Batches are taken in order; evaluations fall where ``every`` says, whatever the
  worker's pace. A worker that falls behind by more than a window drops queued
  samples oldest first (they would leave the window unread), so memory stays
  within two windows per key. Rows with NaN or inf are left out (counted). The
  worker holds the window's sums up to date as rows come and go
  (:mod:`tracker.embedding_window`), and on Linux runs at nice +10, so where cores
  are short the training thread gets them first. ``wait(run)`` waits for it (tests,
  benchmarks: a loop that does nothing but log outruns any worker).
* The keys' settings (``dim``, ``window``, ``gamma``, ``every``) are recorded in
  the run's config under ``tracker_embeddings`` (the web UI and the offline
  analysis read ``dim`` from there).
* After each evaluation the ``collapse`` detector (registered like every detector,
  :mod:`tracker.analysis.collapse`; ``config["analysis"]["collapse"]`` tunes or
  turns it off) judges the new points; its events are recorded with the run's.
* ``finish()`` logs the last statistics before the last flush: it stops the worker
  (which finishes the batch it is on, within half the logger timeout
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
from typing import Any

import numpy as np

from tracker.embedding_window import Window, rankme, statistics  # noqa: F401  (rankme, statistics: public here)
from tracker.errors import ConfigError, RunError

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 25_600
DEFAULT_GAMMA = 1.0
CONFIG_KEY = "tracker_embeddings"
STATISTICS = ("rankme", "std", "dead_dims")
WORKER_NICE = 10  # the worker thread's niceness on Linux: the training thread comes first


class HostBuffers:
    """Recycled host buffers for the copies of ``z``: a call allocates nothing (no page faults) once warm.

    A copy goes into a free buffer of its shape and dtype (a numpy array, or a CPU
    torch tensor, pinned when ``z`` is on a CUDA device: the fastest device-to-host
    copy); the worker gives it back once the rows are in the window.
    """

    LIMIT = 8  # free buffers kept per shape and dtype

    def __init__(self) -> None:
        self._free: dict[tuple[Any, ...], list[Any]] = {}
        self._lock = threading.Lock()

    def _take(self, key: tuple[Any, ...]) -> Any:
        with self._lock:
            free = self._free.get(key)
            return free.pop() if free else None

    def copy(self, z: Any) -> tuple[tuple[Any, ...], Any]:
        """``(pool key, host copy of z)``."""
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(z, torch.Tensor):
            t = z.detach()
            key: tuple[Any, ...] = ("torch", tuple(t.shape), t.dtype, t.device.type)
            buf = self._take(key)
            if buf is None:
                buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
            buf.copy_(t)
            return key, buf
        a = np.asarray(z)
        key = ("numpy", a.shape, a.dtype.str)
        buf = self._take(key)
        if buf is None:
            buf = np.empty(a.shape, dtype=a.dtype)
        np.copyto(buf, a)
        return key, buf

    def give(self, key: tuple[Any, ...], buf: Any) -> None:
        """Return a buffer whose rows the worker no longer needs."""
        with self._lock:
            free = self._free.setdefault(key, [])
            if len(free) < self.LIMIT:
                free.append(buf)


def _as_matrix(z: Any) -> np.ndarray:
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
        self._queues: dict[str, deque[tuple[int, Any, int, Any]]] = {}
        self._queued_rows: dict[str, int] = {}
        self._skipped: dict[str, int] = {}
        self.buffers = HostBuffers()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._done = threading.Condition(self._lock)
        self._submitted = 0  # batches queued (training thread)
        self._handled = 0  # batches processed or dropped
        self._closed = False
        self._abandoned = False
        self._emit = threading.Lock()  # a worker's statistics and events reach the run together
        self._recorded: set[str] = set()  # keys whose settings went into run.json
        self._thread: threading.Thread | None = None
        self.evaluations = 0
        self.dropped_rows = 0

    # -- the training thread -------------------------------------------------------
    def submit(self, key: str, z: Any, step: int, window: Any = None, gamma: Any = None, every: Any = None) -> None:
        """Copy ``z`` to host memory and queue it (the only work done on the caller's thread)."""
        shape = getattr(z, "shape", None)
        shape = tuple(np.shape(z) if shape is None else shape)
        if len(shape) < 2 or shape[-1] < 1:
            raise ConfigError(f"run.log_embeddings: {key!r} has shape {shape}; expected (N, D) embeddings")
        state = self.keys.get(key)
        if state is None:
            state = self._declare(key, shape[-1], window, gamma, every)
        elif shape[-1] != state.dim:
            raise ConfigError(f"run.log_embeddings: {key!r} has dimension {shape[-1]}; earlier calls had {state.dim}")
        elif window is not None or gamma is not None or every is not None:
            for name, value in (("window", window), ("gamma", gamma), ("every", every)):
                if value is not None and value != getattr(state, name):
                    raise ConfigError(f"run.log_embeddings: {name}={value!r} for {key!r}, whose settings its first "
                                      f"call fixed: {state.settings()}")
        pool_key, copy = self.buffers.copy(z)
        rows = math.prod(shape[:-1])
        with self._lock:
            if self._closed:
                return
            queue = self._queues[key]
            queue.append((step, copy, rows, pool_key))
            self._submitted += 1
            self._queued_rows[key] += rows
            while len(queue) > 1 and self._queued_rows[key] - queue[0][2] >= state.window:
                _, old, dropped, old_key = queue.popleft()
                self.buffers.give(old_key, old)
                self._handled += 1
                self._queued_rows[key] -= dropped
                self._skipped[key] = self._skipped.get(key, 0) + dropped
                self.dropped_rows += dropped
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"tracker-embeddings-{self.run.run_id}",
                                            daemon=True)
            self._thread.start()
        self._wake.set()

    def _declare(self, key: str, dim: int, window: Any, gamma: Any, every: Any) -> Window:
        w = _option(window, DEFAULT_WINDOW, "window", 2, int)
        state = Window(key=key, dim=int(dim), window=w, gamma=_option(gamma, DEFAULT_GAMMA, "gamma", 0.0, float),
                         every=_option(every, max(1, w // 25), "every", 1, int))
        with self._lock:
            self.keys[key] = state
            self._queues[key] = deque()
            self._queued_rows[key] = 0
        recorded = dict(self.run.config.get(CONFIG_KEY) or {})
        recorded[key] = state.settings()
        self.run.config[CONFIG_KEY] = recorded
        return state

    # -- the worker ---------------------------------------------------------------------
    def _take(self) -> list[tuple[Window, list[tuple[int, Any, int, Any]]]]:
        with self._lock:
            out = []
            for key, queue in self._queues.items():
                skipped = self._skipped.pop(key, 0)
                if skipped:
                    self.keys[key].skip(skipped)
                if queue:
                    out.append((self.keys[key], list(queue)))
                    queue.clear()
                    self._queued_rows[key] = 0
            return out

    def _loop(self) -> None:
        _lower_priority()
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:  # close() takes what is left, on its own thread (this one runs at nice +10)
                return
            self._work()

    def _work(self) -> None:
        """Process every queued batch (the worker's loop, or close() at the end)."""
        for state, items in self._take():
            try:
                if state.key not in self._recorded:
                    self._recorded.add(state.key)
                    self._record_config()
                self._process(state, items)
            except Exception:  # the worker must survive anything
                log.exception("tracker: embedding statistics of %s in run %s failed", state.key, self.run.run_id)
            with self._lock:
                self._handled += len(items)
                self._done.notify_all()

    def _process(self, state: Window, items: list[tuple[int, Any, int, Any]]) -> None:
        """Add ``items`` to the window, evaluating where ``every`` falls; the batches between two
        evaluations go in as one block (fewer, larger numpy calls: less time holding the GIL)."""
        later = sum(item[2] for item in items)
        block: list[np.ndarray] = []
        block_rows = 0
        held: list[tuple[tuple[Any, ...], Any]] = []
        for i, (step, copy, rows, pool_key) in enumerate(items):
            later -= rows
            if self._abandoned:
                return
            held.append((pool_key, copy))
            if self._closed and later >= max(state.every, state.min_samples):  # finishing: only the newest go in
                state.skip(rows)
                continue
            block.append(_as_matrix(copy))
            block_rows += rows
            last = i == len(items) - 1
            filled = min(state.window, state.filled + block_rows)
            if not last and (filled < state.min_samples or state.since + block_rows < state.every):
                continue
            state.add(block[0] if len(block) == 1 else np.concatenate(block))
            block, block_rows = [], 0
            for pool_key_, buf in held:  # their rows are in the window now
                self.buffers.give(pool_key_, buf)
            held = []
            if not state.due() or (self._closed and not last):
                continue
            if not self._evaluate(state, step):
                return

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
        with self._lock:
            target = self._submitted
            return self._done.wait_for(lambda: self._handled >= target, timeout)

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
        self._work()


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
    return found
