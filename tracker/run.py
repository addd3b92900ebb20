"""Runs: ``tracker.init()`` and :class:`Run`.

The hot path is :meth:`Run.log`: it validates the values (a value or step that
cannot be stored, such as ``10**400`` or ``step=2**63``, is refused there with an
error naming it, so it can never cost a valid row later) and appends one tuple to an
in-memory deque. A background flusher thread turns the buffered rows into Arrow
tables at least once a second (or as soon as 100k values are waiting) and hands them
to the run's loggers, each on its own worker thread (:class:`tracker.loggers.Lane`):
writing comes first; the online detectors run after, on their own thread, and the
events they find go out with the next flush. ``finish()`` and interpreter exit
flush; a ``kill -9`` loses at most the rows not yet written, normally the last flush
interval. :meth:`Run.flush` is a durability barrier for checkpoints: it returns True
once every row logged before it is in the spool, so a kill after a checkpoint saved
after it loses none of them.

Memory is bounded whatever the logging rate (the policy when the disk cannot keep up):

* Values logged but not yet written by every logger are counted. Past
  :data:`MAX_BUFFERED_ROWS` (400,000 values, four flushes' worth), ``log()`` wakes
  the flusher and waits for the loggers to catch up, at most
  :data:`BACKPRESSURE_WAIT_S` (1 s) at a time: a disk slower than the training loop
  slows the loop rather than growing the buffer.
* A logger that makes no progress within that wait (disk full, hung) does not stall
  training: ``log()`` stops waiting until the backlog is below the bound again, and
  that logger keeps at most :data:`LANE_BOUND_ROWS` (800,000 values) queued; past
  it its oldest batches are dropped. Dropped values are counted per logger, recorded
  as a ``rows_dropped`` event and in ``run.json`` (``dropped_rows``), and warned
  about once.
* So a run never holds more than :data:`MAX_HELD_ROWS` (1.4M) values in memory: at
  most 400k (+ one flush) waiting for the flusher, which ``log()`` also waits for,
  and 800k (+ one batch) queued for a stuck logger.
* A disk-full (``ENOSPC``) write is retried with backoff until space returns (see
  :mod:`tracker.loggers`); a hung or failing logger is disabled with one warning
  naming it. ``finish()`` returns within the logger timeout (``tracker_logger_timeout``
  in the config, default 30 s) plus one flush, whatever a plugin does.

Resume (DESIGN.md): resuming run R at step S opens a new segment of R (per rank);
rows of earlier segments with step >= S are hidden by the store's views, never
deleted. ``resume_step`` defaults to the last visible step + 1.
"""

from __future__ import annotations

import atexit
import logging
import numbers
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from tracker.errors import ConfigError, RunError
from tracker.events import Event
from tracker.flusher import (  # noqa: F401  (the limits are part of this module's contract)
    BACKPRESSURE_WAIT_S,
    FLUSH_INTERVAL_S,
    FLUSH_ROWS,
    LANE_BOUND_ROWS,
    MAX_BUFFERED_ROWS,
    MAX_HELD_ROWS,
    Flusher,
    check_timeout,
)
from tracker.loggers import LOGGER_TIMEOUT_S
from tracker.runmeta import RunMeta
from tracker.runplan import RESUME_MODES  # noqa: F401  (public here)
from tracker.spool import home_dir  # noqa: F401  (tracker.run.home_dir is public)

log = logging.getLogger(__name__)

MAX_STEP = 2**63 - 1


def _coerce(key: Any, value: Any) -> float:
    """A loggable value as float, or a TypeError (ValueError when too large) naming the key."""
    if isinstance(value, (bool, numbers.Real)) and not isinstance(value, str):
        try:
            return float(value)
        except OverflowError:
            raise ValueError(
                f"run.log: value of key {key!r} is {value!r:.40} and too large to store as a float64 "
                "(largest about 1.8e308); log it scaled, or as float('inf')"
            ) from None
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", getattr(value, "dim", lambda: 1)) in (0, ()):
        return _coerce(key, item())
    if callable(item) and hasattr(value, "numel") and value.numel() == 1:
        return float(item())
    raise TypeError(
        f"run.log: value of key {key!r} is {type(value).__name__} {value!r:.60}; "
        "expected a number (int, float, numpy scalar or a one-element tensor)"
    )


class Run:
    """One training run (one rank of it). Create with :func:`tracker.init`.

    The training thread's half is here (validate, append to the buffers, count); the
    background half is the run's :class:`tracker.flusher.Flusher`, whose buffers the
    run appends to."""

    def __init__(
        self,
        *,
        project: str,
        name: str | None,
        run_id: str,
        config: dict[str, Any],
        tags: Sequence[str],
        home: Path,
        rank: int,
        world_size: int,
        segment: int,
        start_step: int,
        reason: str,
        loggers: Sequence[str],
    ) -> None:
        self.project, self.name, self.run_id = project, name or run_id, run_id
        self.config, self.tags, self.home = config, list(tags), home
        self.rank, self.world_size = rank, world_size
        self.segment, self.start_step, self.reason = segment, start_step, reason
        self.classes: list[str] | None = None
        self.meta: dict[str, Any] = {}
        self._next_step = start_step
        self._last_step: int | None = None
        self._rows = 0  # values logged since the last count into _logged (training thread)
        self._logged = 0  # values counted as logged (training thread only)
        self._class_len: dict[str, int] = {}
        self._known_keys: set[tuple[str, ...]] = set()
        self._logger_names = list(loggers)
        self._sessions: list[tuple[str, Any]] = []  # (logger name, session), opened by init
        self._analyzer: Any = None  # the online analyzer, made by init (None: analysis off)
        self._meta: RunMeta | None = None
        self._finish_done = threading.Event()
        self._finished = False
        self.flush_interval = float(config.get("tracker_flush_interval", FLUSH_INTERVAL_S))
        self.logger_timeout = float(config.get("tracker_logger_timeout", LOGGER_TIMEOUT_S))
        self.finish_deadline: float | None = None  # set by finish(): loggers must have closed by then
        self._flusher = Flusher(
            run_id=run_id, rank=rank, segment=segment, flush_interval=self.flush_interval,
            logger_timeout=self.logger_timeout, last_step=lambda: self._last_step or self.start_step,
            notifier=lambda: self.__dict__.get("_notify"),
        )
        # the flusher's buffers and wake-up, held here too: log() appends without a lookup more
        self._buf = self._flusher.buf
        self._cbuf = self._flusher.cbuf
        self._wake = self._flusher.wake

    # -- public API ------------------------------------------------------------------
    @property
    def status(self) -> str:
        """``running`` until :meth:`finish` (or a detector's event) says otherwise."""
        return self._flusher.status

    @status.setter
    def status(self, value: str) -> None:
        self._flusher.status = value

    @property
    def dropped_rows(self) -> dict[str, int]:
        """Values each logger had to drop (disk full past the bound, disabled); empty when none."""
        return self._flusher.dropped_rows

    @property
    def backpressure_s(self) -> float:
        """Seconds ``log()`` spent waiting for the flusher and loggers (see the module doc)."""
        return self._flusher.backpressure_s

    @property
    def step(self) -> int | None:
        """The last step logged in this process (None before the first log)."""
        return self._last_step

    def log(self, mapping: Mapping[str, Any], step: int | None = None) -> None:
        """Log scalar values at ``step`` (default: last step + 1). Never blocks on I/O
        (it may wait up to 1 s when the loggers are far behind: see the module doc)."""
        if self._finished:
            raise RunError(f"run {self.run_id!r} is finished; start or resume a run to log more")
        if step is None:
            step = self._next_step
        elif step.__class__ is not int:
            step = self._check_step(step)
        if not self.start_step <= step <= MAX_STEP:
            self._bad_step(step)
        keys = tuple(mapping)
        if keys not in self._known_keys:
            self._check_keys(keys)
        vals = []
        try:
            for k, v in mapping.items():
                t = v.__class__
                vals.append(v if t is float else float(v) if t is int else _coerce(k, v))
        except OverflowError:
            for k, v in mapping.items():
                _coerce(k, v)
            raise
        self._buf.append((step, time.time(), keys, vals))
        self._after_log(step, len(vals))

    def _log_before_start(self, mapping: Mapping[str, Any], step: int) -> None:
        """Log ``mapping`` at a ``step`` before this segment's start: rows an earlier segment
        lost to a kill before they were durable (used by integrations that can read them back,
        such as Ultralytics' ``results.csv``). Only later segments hide rows, so they are
        visible; the caller checks first that no visible row holds them (else a duplicate)."""
        if self._finished:
            raise RunError(f"run {self.run_id!r} is finished; start or resume a run to log more")
        step = self._check_step(step)
        if step >= self.start_step:
            raise RunError(f"step {step} is not before this segment's start step {self.start_step}; use run.log()")
        keys = tuple(mapping)
        self._check_keys(keys)
        self._buf.append((step, time.time(), keys, [_coerce(k, v) for k, v in mapping.items()]))
        self._rows += len(keys)

    def set_classes(self, names: Sequence[str]) -> None:
        """Name the classes of per-class vectors (index i is ``names[i]``)."""
        names = [str(n) for n in names]
        if not names:
            raise ConfigError("run.set_classes: names is empty; pass one name per class")
        self.classes = names
        if self._meta is not None:
            self._meta.update(classes=names)

    def log_classes(self, key: str, values: Any, step: int | None = None) -> None:
        """Log a per-class vector (length C) under ``key`` at ``step``."""
        if self._finished:
            raise RunError(f"run {self.run_id!r} is finished; start or resume a run to log more")
        if not isinstance(key, str) or not key:
            raise TypeError(f"run.log_classes: key must be a non-empty str, got {key!r}")
        if hasattr(values, "detach"):
            values = values.detach().float().cpu().numpy()
        try:
            arr = np.array(values, dtype=np.float64).reshape(-1)
        except OverflowError:
            raise ValueError(
                f"run.log_classes: values of key {key!r} hold a number too large to store as a float64 "
                "(largest about 1.8e308); log them scaled, or as float('inf')"
            ) from None
        except (TypeError, ValueError):
            raise TypeError(
                f"run.log_classes: values of key {key!r} must be a numeric vector, got "
                f"{type(values).__name__}"
            ) from None
        if arr.size == 0:
            raise ValueError(f"run.log_classes: values of key {key!r} are empty; pass one value per class")
        expected = len(self.classes) if self.classes else self._class_len.setdefault(key, arr.size)
        if arr.size != expected:
            raise ConfigError(
                f"run.log_classes: key {key!r} got {arr.size} values, expected {expected} "
                "(one per class, as set_classes or the first call said)"
            )
        step = self._check_step(self._next_step if step is None else step)
        if step < self.start_step:
            self._bad_step(step)
        self._cbuf.append((step, time.time(), key, arr))
        self._after_log(step, arr.size)

    def log_assignments(self, *, gt_labels: Any, gt_mask: Any, fg_mask: Any, matched_gt: Any,
                        step: int | None = None, num_classes: int | None = None, anchor_strides: Any = None,
                        logits: Any = None, targets: Any = None, grad: Any = None,
                        grad_scale: Any = 1.0) -> dict[str, Any]:
        """Log a detector batch's assignment statistics and gradient balance per class (torch tensors).

        ``gt_labels`` ``(B, M)`` class of each ground-truth slot, ``gt_mask`` ``(B, M)`` True for a
        real box, ``fg_mask`` ``(B, A)`` True for a positive anchor, ``matched_gt`` ``(B, A)`` the
        slot it is assigned to. Logs ``assign/gt``, ``assign/pos``, ``assign/gt_no_pos`` per class;
        with ``anchor_strides`` ``(A,)`` also ``assign/pos/P3``... per pyramid level; with
        ``logits`` and ``targets`` ``(B, A, C)`` of a sigmoid BCE (or ``grad=dL/dlogits``), times
        ``grad_scale``, ``grad/pos`` and ``grad/neg``. Returns the logged values. See
        :mod:`tracker.assign` and docs/rare-classes.md.
        """
        from tracker.assign import log_assignments

        return log_assignments(self, gt_labels=gt_labels, gt_mask=gt_mask, fg_mask=fg_mask, matched_gt=matched_gt,
                               num_classes=num_classes, step=step, anchor_strides=anchor_strides, logits=logits,
                               targets=targets, grad=grad, grad_scale=grad_scale)

    def event(
        self,
        kind: str,
        message: str,
        step: int | None = None,
        key: str | None = None,
        severity: str = "warning",
        data: Mapping[str, Any] | None = None,
    ) -> None:
        """Record an event (stored in ``events``) at ``step`` (default: the last step)."""
        if self._finished:
            raise RunError(f"run {self.run_id!r} is finished; start or resume a run to record events")
        self._add_event(
            Event(
                step=self._check_step(step if step is not None else (self._last_step or self.start_step)),
                kind=str(kind), message=str(message), key=key, severity=severity, data=dict(data or {}),
            )
        )

    def log_embeddings(
        self, key: str, z: Any, step: int | None = None, *, window: int | None = None,
        gamma: float | None = None, every: int | None = None,
    ) -> None:
        """Queue embeddings ``z`` (N, D) of ``key`` at ``step`` (default: the last step) for the
        collapse statistics ``key/rankme``, ``key/std`` and ``key/dead_dims``, computed off this
        thread on a rolling window of ``window`` samples (see :mod:`tracker.embeddings`).

        A key's calls after its first, with the same kind, shape, dtype and device of ``z``, no
        options and a plain int step (or none), take its bound fast path: one copy into a
        recycled buffer and a queue append."""
        embeddings = self.__dict__.get("_embeddings")
        if embeddings is not None and type(key) is str and window is None and gamma is None and every is None:
            fast = embeddings.fast.get(key)
            if fast is not None and fast(z, step):
                return
        if self._finished:
            raise RunError(f"run {self.run_id!r} is finished; start or resume a run to log more")
        if not isinstance(key, str) or not key:
            raise TypeError(f"run.log_embeddings: key must be a non-empty str, got {key!r}")
        step = self._check_step((self._last_step or self.start_step) if step is None else step)
        if step < self.start_step:
            self._bad_step(step)
        from tracker.embeddings import monitor

        monitor(self).submit(key, z, step, window, gamma, every)

    def on_event(self, callback: Any) -> None:
        """Call ``callback(event)`` (a :class:`tracker.events.Event`) for every event of this run,
        detectors' included, on the notifier thread, never the training thread (see docs/alerts.md)."""
        from tracker.notify.dispatch import on_event

        on_event(self, callback)

    def flush(self, timeout: float | None = None) -> bool:
        """A durability barrier: hand every row logged so far to the loggers and wait until
        they wrote it; True once all of it is durable in the spool (the store logger's
        chunk files, fsynced and renamed into place, as the background flusher writes
        them), so a checkpoint saved after a True loses no row to a ``kill -9``.

        Waits at most ``timeout`` seconds (default: the logger timeout,
        ``tracker_logger_timeout``, 30 s); past it, or when some of those rows could not
        be written (a logger disabled, rows dropped), it warns and returns False and
        training goes on. A logger whose call runs past the logger timeout is disabled as
        always. Safe from any thread while the flusher runs, cheap when nothing is
        pending, and True at once after :meth:`finish` (which flushes everything).
        """
        limit = self.logger_timeout if timeout is None else check_timeout(timeout)
        if self._finished:  # finish() flushes and closes the loggers; another thread may be in it
            return self._finish_done.wait(limit) or self._flusher.barrier_missed(
                limit, "finish() is still closing the loggers")
        return self._flusher.barrier(limit)

    def finish(self, status: str = "finished") -> None:
        """Flush, close the loggers and mark the run ``status``. Safe to call twice.

        Returns within the logger timeout (``tracker_logger_timeout``, default 30 s) plus
        one flush: a logger still busy then is disabled with a warning naming it."""
        if self._finished:
            return
        embeddings = self.__dict__.get("_embeddings")
        if embeddings is not None:  # its last statistics go out with the last flush
            embeddings.close(self.logger_timeout / 2)
        self._finished = True
        deadline = self.finish_deadline = time.monotonic() + self.logger_timeout
        self._flusher.drain(deadline)
        if self.status == "running" or status != "finished":
            self.status = status
        if self._meta is not None:
            drops = self.dropped_rows
            extra = {"dropped_rows": sum(drops.values()), "dropped_by_logger": drops} if drops else {}
            self._meta.ended(self.status, **extra)
        self._flusher.close(self.status, deadline)
        if self.__dict__.get("_notify") is not None:  # the last events' alerts, then the rest from the spool
            self.__dict__["_notify"].close()
        self._finish_done.set()
        _LIVE.discard(self)
        from tracker.host import call_hook

        call_hook("tracker_run_end", run=self, status=self.status)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is KeyboardInterrupt:
            self.finish("killed")
        elif exc_type is not None:
            self.finish("crashed")
        else:
            self.finish()

    def __repr__(self) -> str:
        return f"Run(run_id={self.run_id!r}, project={self.project!r}, rank={self.rank}, segment={self.segment})"

    # -- helpers ---------------------------------------------------------------------
    def _check_step(self, step: Any) -> int:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise TypeError(f"step must be a non-negative int, got {step!r}")
        if step > MAX_STEP:
            raise ValueError(
                f"step {step} is too large to store (largest is 2**63 - 1 = {MAX_STEP}); "
                "count steps from 0 or log an epoch/step pair as two keys"
            )
        return int(step)

    def _bad_step(self, step: int) -> None:
        self._check_step(step)
        raise RunError(
            f"step {step} is before this segment's start step {self.start_step} (run {self.run_id!r} "
            f"resumed at {self.start_step}); log steps >= {self.start_step} or resume at an earlier step"
        )

    def _check_keys(self, keys: tuple[Any, ...]) -> None:
        for k in keys:
            if not isinstance(k, str) or not k:
                raise TypeError(f"run.log: keys must be non-empty str, got {k!r}")
        self._known_keys.add(keys)

    def _after_log(self, step: int, n: int) -> None:
        if self._last_step is None or step > self._last_step:
            self._last_step = step
            self._next_step = step + 1
        self._rows += n
        if self._rows >= FLUSH_ROWS:
            self._logged += self._rows
            self._rows = 0
            self._wake.set()
            if self._logged - self._flusher.released > MAX_BUFFERED_ROWS:
                self._flusher.backpressure(self._logged)
            else:
                self._flusher.degraded = False

    def _add_event(self, ev: Event) -> None:
        self._flusher.add_event(ev)

    def _start(self) -> None:
        """Start the flusher with the loggers and analyzer that init opened."""
        self._flusher.start(self._sessions, self._analyzer, self._meta)

# -- init ----------------------------------------------------------------------------
_LIVE: "weakref.WeakSet[Run]" = weakref.WeakSet()


def _flush_live_runs() -> None:
    for run in list(_LIVE):
        try:
            run.finish("crashed" if _CRASHED.is_set() else "finished")
        except Exception:  # pragma: no cover - interpreter is going away
            log.exception("tracker: final flush of run %s failed", run.run_id)
    from tracker.store.base import shutdown_all

    shutdown_all()  # no thread of a store may be inside DuckDB when the interpreter goes


_CRASHED = threading.Event()
_prev_excepthook = sys.excepthook


def _excepthook(*args: Any) -> None:
    _CRASHED.set()
    _prev_excepthook(*args)


sys.excepthook = _excepthook
atexit.register(_flush_live_runs)


def __getattr__(name: str) -> Any:
    """``tracker.run.init``: defined in :mod:`tracker.runstart`, which builds on this module."""
    if name == "init":
        from tracker.runstart import init

        return init
    raise AttributeError(f"module 'tracker.run' has no attribute {name!r}")
