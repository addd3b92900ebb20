"""A run's notifications and event callbacks, off the training thread.

:class:`RunNotifier` receives the run's events from the flusher (every event: a
detector's, ``run.event()``'s, ``rows_dropped``), calls the ``run.on_event``
callbacks, picks what the rules send, applies the rate limit (one message per rule
and target per ``TRACKER_NOTIFY_RATE_S``, default 600 s; the next message sent
says how many were held back) and delivers from the outbox on its own thread. The
flusher only appends to a deque: a slow or dead endpoint costs the training loop
nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

from tracker.events import Event
from tracker.notify import outbox
from tracker.notify.config import NotifyConfig, Rule, Target, mask, to_json

if TYPE_CHECKING:  # pragma: no cover
    from tracker.protocols import RunLike

    class Run(RunLike, Protocol):
        """What the notifier reads from a run: the common fields, and whether it finished."""

        _finished: bool

log = logging.getLogger(__name__)

Callback = Callable[[Event], Any]
CLOSE_WAIT_S = 5.0  # finish() waits this long for queued messages; the rest stay in the outbox
LIVE: set[tuple[Path, str]] = set()  # (home, run_id) of the runs this process delivers for now


def event_of(row: tuple[Any, ...]) -> Event:
    """An :class:`Event` from a row of the flusher's event buffer."""
    step, key, kind, severity, message, data, _when = row
    try:
        payload = json.loads(data) if isinstance(data, str) else dict(data or {})
    except ValueError:
        payload = {}
    return Event(step=int(step), kind=str(kind), message=str(message), key=key, severity=severity, data=payload)


def compose(run_info: dict[str, Any], ev: Event, rule: Rule, held_back: int = 0) -> dict[str, Any]:
    """The message of ``ev``: what every notifier formats."""
    where = f" on {ev.key}" if ev.key else ""
    return {
        **run_info,
        "title": f"[{ev.severity}] {ev.kind}{where} in run {run_info.get('name') or run_info['run_id']}",
        "kind": ev.kind, "severity": ev.severity, "key": ev.key, "step": ev.step,
        "text": mask(ev.message), "data": {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
                                           for k, v in ev.data.items() if isinstance(v, (int, float, str, bool))},
        "rule": rule.name, "held_back": held_back, "time": time.time(),
    }


class RunNotifier:
    """Rules, rate limit, callbacks and delivery of one run's events (one thread)."""

    def __init__(self, home: Path, run_id: str, info: dict[str, Any], cfg: NotifyConfig,
                 notifiers: dict[str, Any], identity: tuple[int, int]) -> None:
        self.home, self.run_id, self.info, self.cfg = home, run_id, info, cfg
        self.notifiers, self.identity = notifiers, identity
        self.callbacks: list[Callback] = []
        self._queue: deque[tuple[Any, ...]] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._last_sent: dict[tuple[str, str], float] = {}
        self._held: dict[tuple[str, str], int] = {}
        self._thread: threading.Thread | None = None
        if cfg.targets:
            outbox.save_config(home, run_id, to_json(cfg))

    def start(self) -> None:
        LIVE.add((Path(self.home), self.run_id))
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"tracker-notify-{self.run_id}", daemon=True)
            self._thread.start()

    def submit(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Hand event rows over (from the flusher; never blocks)."""
        self._queue.extend(rows)
        self._idle.clear()
        self._wake.set()

    def close(self, timeout: float | None = None) -> None:
        """Handle what was submitted, try to deliver it for up to ``timeout`` s (default
        ``TRACKER_NOTIFY_CLOSE_S``, 5), stop the thread; what is left stays in the outbox."""
        if self._thread is None:
            return
        if timeout is None:
            timeout = outbox._env_float("TRACKER_NOTIFY_CLOSE_S", CLOSE_WAIT_S)
        deadline = time.monotonic() + timeout
        self._idle.clear()  # set again after a whole pass: events routed, one delivery attempt each
        self._wake.set()
        self._idle.wait(timeout)
        self._stop.set()
        self._wake.set()
        self._thread.join(max(deadline - time.monotonic(), 0.1))
        LIVE.discard((Path(self.home), self.run_id))

    # -- the thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._handle(self._take())
                wait = self._deliver_due()
            except Exception:  # the notifier thread must survive anything
                log.exception("tracker: notifications of run %s failed", self.run_id)
                wait = 1.0
            if not self._queue:
                self._idle.set()
            self._wake.wait(wait)
            self._wake.clear()

    def _take(self) -> list[Event]:
        rows = [self._queue.popleft() for _ in range(len(self._queue))]
        return [event_of(r) for r in rows]

    def _handle(self, events: list[Event]) -> None:
        for ev in events:
            for cb in list(self.callbacks):
                try:
                    cb(ev)
                except Exception as exc:
                    log.warning("tracker: run %s: on_event callback %r raised %s: %s", self.run_id,
                                getattr(cb, "__name__", cb), type(exc).__name__, exc)
            self._route(ev)

    def _route(self, ev: Event) -> None:
        rank, segment = self.identity
        key = outbox.idempotency_key(self.run_id, rank, segment, ev.step, ev.kind, ev.key, ev.message)
        for target in self.cfg.targets:
            rule = next((r for r in self.cfg.rules if r.sends_to(target) and r.matches(ev.kind, ev.severity, ev.key)),
                        None)
            if rule is None:
                continue
            slot = (rule.name, target.spec)
            now = time.monotonic()
            last = self._last_sent.get(slot)
            if last is not None and now - last < self.cfg.rate_s:
                self._held[slot] = self._held.get(slot, 0) + 1
                continue
            self._last_sent[slot] = now
            message = compose(self.info, ev, rule, self._held.pop(slot, 0))
            outbox.enqueue(self.home, self.run_id, key, target, message)

    def _deliver_due(self) -> float:
        """Send what is due; seconds until the next retry (at most 1)."""
        wait = 1.0
        for path in outbox.pending(self.home, self.run_id):
            if self._stop.is_set():
                break
            if outbox.deliver(path, self.notifiers) is False:
                try:
                    nxt = json.loads(path.read_text(encoding="utf-8"))["next_at"]
                    wait = min(wait, max(nxt - time.time(), 0.05))
                except (OSError, ValueError, KeyError):
                    pass
        return wait


def run_info(run: "Run") -> dict[str, Any]:
    return {"run_id": run.run_id, "project": run.project, "name": run.name, "rank": run.rank,
            "host": socket.gethostname(), "pid": os.getpid()}


def configure(notify: Iterable[Any] | None) -> tuple[NotifyConfig, dict[str, Any]]:
    """The run's notify configuration and the registered notifiers, checked (ConfigError)."""
    from tracker.host import get_host
    from tracker.notify import config as nconfig

    from tracker.store.spoolmeta import heartbeat_s

    heartbeat_s()  # a bad TRACKER_HEARTBEAT_S fails init, not the flusher
    cfg = nconfig.load(notify)
    notifiers = get_host().items("notifiers") if cfg.targets else {}
    nconfig.check_targets(cfg.targets, notifiers)
    return cfg, notifiers


def attach(run: "Run", alerts: tuple[NotifyConfig, dict[str, Any]]) -> RunNotifier | None:
    """Give ``run`` its notifier (None when nothing is configured: a later ``run.on_event``
    makes one), after sending what dead runs left in this store's outboxes."""
    from tracker.notify.recovery import recover_soon

    recover_soon(run.home)
    cfg, notifiers = alerts
    if not cfg.targets:
        return None
    return _make(run, cfg, notifiers)


def _make(run: "Run", cfg: NotifyConfig, notifiers: dict[str, Any]) -> RunNotifier:
    notifier = RunNotifier(run.home, run.run_id, run_info(run), cfg, notifiers, (run.rank, run.segment))
    notifier.start()
    run.__dict__["_notify"] = notifier
    return notifier


def on_event(run: "Run", callback: Callback) -> None:
    """Call ``callback(event)`` for each event of ``run``, on the notifier thread (not training's)."""
    if not callable(callback):
        from tracker.errors import ConfigError

        raise ConfigError(f"run.on_event: callback {callback!r} is not callable; pass a function of one event")
    if run._finished:
        from tracker.errors import RunError

        raise RunError(f"run {run.run_id!r} is finished; call on_event before finish()")
    notifier = run.__dict__.get("_notify")
    if notifier is None:
        from tracker.host import get_host

        notifier = _make(run, NotifyConfig(), get_host().items("notifiers"))
    notifier.callbacks.append(callback)


def describe(targets: Iterable[Target]) -> list[str]:
    return [t.shown for t in targets]
