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
  within two windows per key. Rows with NaN or inf are left out (counted).
* The keys' settings (``dim``, ``window``, ``gamma``, ``every``) are recorded in
  the run's config under ``tracker_embeddings`` (the web UI and the offline
  analysis read ``dim`` from there).
* After each evaluation the ``collapse`` detector (registered like every detector,
  :mod:`tracker.analysis.collapse`; ``config["analysis"]["collapse"]`` tunes or
  turns it off) judges the new points; its events are recorded with the run's.
* ``finish()`` drains the queue and logs the last statistics before the last flush.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracker.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 25_600
DEFAULT_GAMMA = 1.0
RANKME_EPS = 1e-7
CONFIG_KEY = "tracker_embeddings"
STATISTICS = ("rankme", "std", "dead_dims")
_CHUNK_ROWS = 4096


def host_copy(z: Any) -> np.ndarray | Any:
    """``z`` copied to host memory: a numpy array, or a detached CPU torch tensor (bfloat16 stays a tensor)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(z, torch.Tensor):
        t = z.detach()
        return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
    return np.array(z, copy=True)


def _as_matrix(z: Any) -> np.ndarray:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(z, torch.Tensor):
        z = z.float().numpy() if z.dtype not in (torch.float32, torch.float64) else z.numpy()
    array = np.asarray(z)
    return array.reshape(-1, array.shape[-1])


def rankme(singular: np.ndarray) -> float:
    """RankMe of singular values ``singular`` (any order)."""
    s = np.asarray(singular, dtype=np.float64)
    total = s.sum()
    if not total > 0:
        return 1.0
    p = s / total + RANKME_EPS
    return float(np.exp(-(p * np.log(p)).sum()))


def _chunks(blocks: list[np.ndarray]) -> Any:
    for block in blocks:
        for a in range(0, block.shape[0], _CHUNK_ROWS):
            yield np.asarray(block[a : a + _CHUNK_ROWS], dtype=np.float32)


def statistics(z: np.ndarray | list[np.ndarray], gamma: float = DEFAULT_GAMMA) -> dict[str, float]:
    """RankMe, std of the L2-normalised rows and share of dims with std < ``gamma``, of ``z`` (W, D).

    ``z`` may be a list of row blocks of one width (a ring buffer's two halves): the
    statistics do not depend on the order of the rows. Row chunks keep the
    temporaries small; sums and the Gram matrix accumulate in float64.
    """
    blocks = list(z) if isinstance(z, (list, tuple)) else [z]
    w, d = sum(b.shape[0] for b in blocks), blocks[0].shape[1]
    if w < 2:
        raise ConfigError(f"statistics need at least 2 samples; got {w}")
    s1, s2, n1, n2 = (np.zeros(d) for _ in range(4))
    gram = np.zeros((d, d) if w >= d else (0, 0))
    for chunk in _chunks(blocks):
        s1 += chunk.sum(axis=0, dtype=np.float64)
        s2 += np.square(chunk, dtype=np.float64).sum(axis=0)
        norms = np.sqrt(np.einsum("ij,ij->i", chunk, chunk, dtype=np.float64))
        u = chunk / np.maximum(norms, 1e-12).astype(np.float32)[:, None]
        n1 += u.sum(axis=0, dtype=np.float64)
        n2 += np.square(u, dtype=np.float64).sum(axis=0)
        if w >= d:  # in float64: a float32 Gram matrix blurs singular values below ~3e-4 of the largest
            wide = chunk.astype(np.float64)
            gram += wide.T @ wide
    if w < d:
        small = np.concatenate(blocks).astype(np.float64)
        gram = small @ small.T
    eig = np.linalg.eigvalsh(gram)
    raw_std = np.sqrt(np.maximum(s2 - s1 * s1 / w, 0.0) / (w - 1))
    unit_std = np.sqrt(np.maximum(n2 - n1 * n1 / w, 0.0) / (w - 1))
    return {
        "rankme": rankme(np.sqrt(np.maximum(eig, 0.0))),
        "std": float(unit_std.mean()),
        "dead_dims": float(np.mean(raw_std < gamma)),
    }


@dataclass
class KeyState:
    """The rolling window and settings of one embedding key."""

    key: str
    dim: int
    window: int
    gamma: float
    every: int
    rows: np.ndarray = field(init=False, repr=False)
    filled: int = 0
    head: int = 0
    since: int = 0
    dropped: int = 0
    non_finite: int = 0
    streams: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.rows = np.zeros((self.window, self.dim), dtype=np.float32)

    @property
    def min_samples(self) -> int:
        """Samples the window must hold before the first evaluation."""
        return min(self.window, max(2 * self.dim, 256))

    def add(self, z: np.ndarray) -> None:
        """Put the rows of ``z`` into the ring (the newest ``window`` of them at most)."""
        good = np.isfinite(z).all(axis=1)
        if not good.all():
            self.non_finite += int((~good).sum())
            z = z[good]
        z = z[-self.window :]
        n = z.shape[0]
        end = self.head + n
        if end <= self.window:
            self.rows[self.head : end] = z
        else:
            cut = self.window - self.head
            self.rows[self.head :] = z[:cut]
            self.rows[: n - cut] = z[cut:]
        self.head = end % self.window
        self.filled = min(self.window, self.filled + n)
        self.since += n

    def skip(self, rows: int) -> None:
        """Forget the ``rows`` oldest samples: that many newer ones were dropped unread."""
        self.filled = max(0, min(self.filled, self.window - rows))
        self.dropped += rows

    def blocks(self) -> list[np.ndarray]:
        """The samples in the window: the ``filled`` rows that end at ``head`` (one or two slices)."""
        if self.head >= self.filled:
            return [self.rows[self.head - self.filled : self.head]]
        return [self.rows[self.window - (self.filled - self.head) :], self.rows[: self.head]]

    def due(self) -> bool:
        """Whether an evaluation is due."""
        return self.filled >= self.min_samples and self.since >= self.every

    def evaluate(self) -> dict[str, float]:
        """The statistics of the samples in the window."""
        self.since = 0
        return statistics(self.blocks(), self.gamma)

    def settings(self) -> dict[str, Any]:
        """What the run's config records of this key."""
        return {"dim": self.dim, "window": self.window, "gamma": self.gamma, "every": self.every}


def _option(value: Any, default: Any, name: str, minimum: float, kind: type) -> Any:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and int(value) != value):
        raise ConfigError(f"run.log_embeddings: {name} is {value!r}; expected {'an int' if kind is int else 'a number'}")
    if not value >= minimum:
        raise ConfigError(f"run.log_embeddings: {name} is {value!r}; expected a value >= {minimum}")
    return kind(value)


class EmbeddingMonitor:
    """The queue of one run's embedding copies and the worker thread that turns them into statistics."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.keys: dict[str, KeyState] = {}
        self._queues: dict[str, deque[tuple[int, Any]]] = {}
        self._queued_rows: dict[str, int] = {}
        self._skipped: dict[str, int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._done = threading.Condition(self._lock)
        self._submitted = 0  # batches queued (training thread)
        self._handled = 0  # batches processed or dropped
        self._closed = False
        self._thread: threading.Thread | None = None
        self.evaluations = 0
        self.dropped_rows = 0
        self._detectors: dict[str, dict[str, Any]] | None = None

    # -- the training thread -------------------------------------------------------
    def submit(self, key: str, z: Any, step: int, window: Any = None, gamma: Any = None, every: Any = None) -> None:
        """Copy ``z`` to host memory and queue it (the only work done on the caller's thread)."""
        shape = tuple(getattr(z, "shape", np.shape(z)))
        if len(shape) < 2 or shape[-1] < 1:
            raise ConfigError(f"run.log_embeddings: {key!r} has shape {shape}; expected (N, D) embeddings")
        state = self.keys.get(key)
        if state is None:
            state = self._declare(key, shape[-1], window, gamma, every)
        elif shape[-1] != state.dim:
            raise ConfigError(f"run.log_embeddings: {key!r} has dimension {shape[-1]}; earlier calls had {state.dim}")
        else:
            for name, value in (("window", window), ("gamma", gamma), ("every", every)):
                if value is not None and value != getattr(state, name):
                    raise ConfigError(f"run.log_embeddings: {name}={value!r} for {key!r}, whose settings its first "
                                      f"call fixed: {state.settings()}")
        copy = host_copy(z)
        rows = int(np.prod(shape[:-1]))
        with self._lock:
            if self._closed:
                return
            queue = self._queues[key]
            queue.append((step, copy))
            self._submitted += 1
            self._queued_rows[key] += rows
            while len(queue) > 1 and self._queued_rows[key] - _rows(queue[0][1]) >= state.window:
                dropped = _rows(queue.popleft()[1])
                self._handled += 1
                self._queued_rows[key] -= dropped
                self._skipped[key] = self._skipped.get(key, 0) + dropped
                self.dropped_rows += dropped
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"tracker-embeddings-{self.run.run_id}",
                                            daemon=True)
            self._thread.start()
        self._wake.set()

    def _declare(self, key: str, dim: int, window: Any, gamma: Any, every: Any) -> KeyState:
        w = _option(window, DEFAULT_WINDOW, "window", 2, int)
        state = KeyState(key=key, dim=int(dim), window=w, gamma=_option(gamma, DEFAULT_GAMMA, "gamma", 0.0, float),
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
    def _take(self) -> list[tuple[KeyState, list[tuple[int, Any]]]]:
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
        recorded: set[str] = set()
        while True:
            self._wake.wait()
            self._wake.clear()
            work = self._take()
            for state, items in work:
                try:
                    if state.key not in recorded:
                        recorded.add(state.key)
                        self._record_config()
                    self._process(state, items)
                except Exception:  # the worker must survive anything
                    log.exception("tracker: embedding statistics of %s in run %s failed", state.key, self.run.run_id)
                with self._lock:
                    self._handled += len(items)
                    self._done.notify_all()
            with self._lock:
                if self._closed and not any(self._queues.values()):
                    return

    def _process(self, state: KeyState, items: list[tuple[int, Any]]) -> None:
        for step, copy in items:
            state.add(_as_matrix(copy))
            if not state.due():
                continue
            stats = state.evaluate()
            self.evaluations += 1
            self.run.log({f"{state.key}/{name}": value for name, value in stats.items()}, step=step)
            for event in self._detect(state, step, stats):
                self.run._add_event(event)

    def _record_config(self) -> None:
        meta = getattr(self.run, "_meta", None)
        if meta is not None and self.run.rank == 0:
            meta.update(config=self.run.config)

    def _detect(self, state: KeyState, step: int, stats: dict[str, float]) -> list[Any]:
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
        """Process what is queued, log the last statistics, stop the worker (safe to call twice)."""
        with self._lock:
            self._closed = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("tracker: run %s: the embedding statistics did not finish within %g s; the last "
                            "ones are left out", self.run.run_id, timeout)


def _rows(copy: Any) -> int:
    shape = tuple(copy.shape)
    return int(np.prod(shape[:-1]))


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
