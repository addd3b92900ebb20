"""The logger (run sink) interface, and the worker that runs each logger session.

A logger is registered through ``tracker_register_loggers(register)``. It has a
``name`` and ``open(run) -> LoggerSession``; ``open`` is called once per run in
``tracker.init`` (it may do a little I/O, such as writing the run's metadata). A
session whose ``open`` raises is left out of the run with one warning naming it.
Every other call happens on the session's own worker thread (a :class:`Lane`), never
on the training thread nor on the flusher:

* ``write(batch)`` with the rows logged since the previous flush, in order, and
* ``close(status)`` once, after the last ``write``.

Isolation rules (one bad logger never stalls the others or the run):

* A ``write`` or ``close`` that raises disables its session with one warning naming
  it; the other sessions go on.
* A call that runs longer than the run's logger timeout (``tracker_logger_timeout``
  in the run's config, default :data:`LOGGER_TIMEOUT_S`) is abandoned: the session is
  disabled with one warning naming it, its thread is left behind (a daemon thread,
  so interpreter exit never waits for it).
* A ``write`` that fails with ``ENOSPC`` or ``EDQUOT`` (disk full, quota) is retried
  with backoff (0.05 s doubling to 2 s) with one warning, keeping its batches until
  space returns. A lane never holds more than its bound of rows: past it, its oldest
  batches are dropped and counted (the run records the count, see :mod:`tracker.run`).
* A session that sets ``durable = True`` (the store logger) is part of the run's
  record: the segment's ``last_step`` advances only after every durable session
  wrote the rows (see :mod:`tracker.runmeta`).
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

import pyarrow as pa

if TYPE_CHECKING:  # pragma: no cover
    from tracker.protocols import RunLike

log = logging.getLogger(__name__)

DEFAULT_LOGGERS = ("store",)
LOGGER_TIMEOUT_S = 30.0
RETRY_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_BACKOFF = (0.05, 2.0)


@dataclass
class Batch:
    """Rows logged since the previous flush (Arrow tables in the spool's schemas)."""

    seq: int
    metrics: pa.Table | None
    class_metrics: pa.Table | None
    events: pa.Table | None
    last_step: int | None
    status: str | None = None  # set when the run's status changed in this flush
    pending: set[str] = field(default_factory=set, repr=False)  # lanes still to finish it
    durable_pending: set[str] = field(default_factory=set, repr=False)
    durable_ok: bool = field(default=True, repr=False)  # every durable lane wrote it so far

    @property
    def empty(self) -> bool:
        return self.metrics is None and self.class_metrics is None and self.events is None

    @property
    def rows(self) -> int:
        """Logged values in this batch (scalar points plus per-class values)."""
        return sum(t.num_rows for t in (self.metrics, self.class_metrics) if t is not None)


class LoggerSession(Protocol):
    def write(self, batch: Batch) -> None: ...

    def close(self, status: str) -> None: ...


class Logger(Protocol):
    name: str

    def open(self, run: "RunLike") -> LoggerSession: ...


class Lane:
    """One session on its own worker thread with a bounded queue (see the module doc).

    ``done(lane, batch, written)`` is called once per batch the lane is finished with
    (``written`` False when it was dropped or the lane was disabled first).
    """

    def __init__(
        self,
        name: str,
        session: Any,
        *,
        run_id: str,
        bound_rows: int,
        done: Callable[["Lane", Batch, bool], None],
        kind: str = "logger",
    ) -> None:
        self.name, self.session, self.run_id, self.kind = name, session, run_id, kind
        self.durable = bool(getattr(session, "durable", False))
        self.bound_rows = bound_rows
        self.dropped_rows = 0
        self.disabled = False
        self.busy_since: float | None = None  # monotonic start of the call in progress
        self._done = done
        self._q: deque[Batch] = deque()
        self._queued = 0
        self._current: Batch | None = None
        self._close_status: str | None = None
        self._cv = threading.Condition()
        self._idle = threading.Event()
        self._idle.set()
        self._closed = threading.Event()
        self._warned_full = False
        self._thread = threading.Thread(target=self._loop, name=f"tracker-{kind}-{name}-{run_id}", daemon=True)
        self._thread.start()

    # -- called by the run ----------------------------------------------------------
    def put(self, batch: Batch) -> list[Batch]:
        """Queue ``batch``; returns the oldest batches dropped to stay within the bound."""
        dropped: list[Batch] = []
        with self._cv:
            if self.disabled or self._close_status is not None:
                return [batch]
            self._q.append(batch)
            self._queued += batch.rows
            self._idle.clear()
            while self._queued > self.bound_rows and len(self._q) > 1:
                old = self._q.popleft()
                self._queued -= old.rows
                self.dropped_rows += old.rows
                dropped.append(old)
            self._cv.notify()
        return dropped

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every queued batch is written (or the lane is disabled)."""
        return self._idle.wait(max(timeout, 0.0))

    def request_close(self, status: str) -> None:
        """Ask for ``close(status)`` once the queued writes are done."""
        with self._cv:
            if not self.disabled:
                self._close_status = status
                self._cv.notify()

    def wait_closed(self, timeout: float) -> bool:
        """Wait for ``close`` to return; past ``timeout`` the lane is disabled (warning)."""
        if self._closed.wait(max(timeout, 0.0)):
            return True
        self.disable("it did not close in time (tracker_logger_timeout)")
        return False

    def check_hung(self, timeout: float) -> bool:
        """Disable the lane when its current call has run past ``timeout``; True if it did."""
        since = self.busy_since
        if since is not None and not self.disabled and time.monotonic() - since > timeout:
            self.disable(f"a call took longer than {timeout:g} s (tracker_logger_timeout)")
            return True
        return False

    def disable(self, why: str) -> None:
        """Stop using the session (one warning naming it); its batches count as not written
        (and, for a durable session, as dropped)."""
        with self._cv:
            if self.disabled:
                return
            self.disabled = True
            left = list(self._q)
            if self._current is not None:
                left.insert(0, self._current)
                self._current = None
            self._q.clear()
            self._queued = 0
            self._cv.notify()
        if self.durable:  # the run's record loses these rows; other loggers' rows are in the store
            self.dropped_rows += sum(b.rows for b in left)
        log.warning("tracker: %s %r of run %s is disabled: %s", self.kind, self.name, self.run_id, why)
        for b in left:
            self._done(self, b, False)
        self._idle.set()
        self._closed.set()

    # -- the worker -----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._q and self._close_status is None and not self.disabled:
                    self._idle.set()
                    self._cv.wait()
                if self.disabled:
                    return
                if not self._q:
                    status = self._close_status
                    break
                batch = self._current = self._q.popleft()
            if self._write(batch):
                with self._cv:
                    if self._current is not batch:  # disabled meanwhile: already accounted for
                        return
                    self._current = None
                    self._queued -= batch.rows
                self._done(self, batch, True)
        self._call(lambda: self.session.close(status))
        self._closed.set()

    def _call(self, fn: Callable[[], None]) -> bool:
        self.busy_since = time.monotonic()
        try:
            fn()
            return True
        except Exception as exc:
            if not self.disabled:
                self.disable(f"{type(exc).__name__}: {exc}")
            return False
        finally:
            self.busy_since = None

    def _write(self, batch: Batch) -> bool:
        delay = _BACKOFF[0]
        while not self.disabled:
            self.busy_since = time.monotonic()
            try:
                self.session.write(batch)
                if self._warned_full:
                    log.warning("tracker: %s %r of run %s writes again", self.kind, self.name, self.run_id)
                    self._warned_full = False
                return True
            except OSError as exc:
                if exc.errno not in RETRY_ERRNOS:
                    self.disable(f"{type(exc).__name__}: {exc}")
                    return False
                if not self._warned_full:
                    self._warned_full = True
                    log.warning(
                        "tracker: %s %r of run %s: %s; retrying with backoff, keeping up to %d rows",
                        self.kind, self.name, self.run_id, exc, self.bound_rows,
                    )
            except Exception as exc:
                self.disable(f"{type(exc).__name__}: {exc}")
                return False
            finally:
                self.busy_since = None
            with self._cv:
                self._cv.wait(delay)
            delay = min(delay * 2, _BACKOFF[1])
        return False
