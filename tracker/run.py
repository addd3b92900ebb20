"""Runs: ``tracker.init()`` and :class:`Run`.

The hot path is :meth:`Run.log`: it validates the values and appends one tuple to
an in-memory list. Nothing else happens on the training thread. A background
flusher thread turns the buffered rows into Arrow tables at least once a second
(or as soon as 100k rows are waiting), hands them to the run's loggers (the store
logger writes crash-safe Parquet chunks), and runs the online detectors.
``finish()`` and interpreter exit flush; a ``kill -9`` loses at most the last
flush interval.

Resume (DESIGN.md): resuming run R at step S opens a new segment of R (per rank);
rows of earlier segments with step >= S are hidden by the store's views, never
deleted. ``resume_step`` defaults to the last visible step + 1.
"""

from __future__ import annotations

import atexit
import json
import logging
import numbers
import os
import platform
import secrets
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from tracker.dist import rank_world
from tracker.errors import ConfigError, RunError
from tracker.events import Event
from tracker.loggers import DEFAULT_LOGGERS, Batch
from tracker.runmeta import RunMeta
from tracker.spool import (
    CLASS_SCHEMA,
    EVENTS_SCHEMA,
    METRICS_SCHEMA,
    check_run_id,
    list_segments,
    read_json,
    run_dir,
    visible_last_step,
)

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 1.0
FLUSH_ROWS = 100_000
RESUME_MODES = ("never", "allow", "must")
_PACKAGES = ("tracker", "numpy", "torch", "duckdb", "pyarrow", "polars", "pluggy", "vulkan")


def home_dir(home: str | os.PathLike[str] | None = None) -> Path:
    """The store folder: ``home``, else ``$TRACKER_HOME``, else ``./.tracker``."""
    return Path(home or os.environ.get("TRACKER_HOME") or ".tracker").resolve()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=2, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _package_versions() -> dict[str, str]:
    import importlib.metadata as md

    out: dict[str, str] = {}
    for name in _PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def _new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _shared_run_id(world_size: int) -> str:
    env = os.environ.get("TRACKER_RUN_ID")
    if env:
        return env
    dist = sys.modules.get("torch.distributed")
    if world_size > 1 and dist is not None and dist.is_initialized():
        box = [_new_run_id()]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])
    if world_size > 1:
        raise ConfigError(
            f"world_size={world_size} but no run_id: every rank must log to the same run; "
            "pass run_id=..., set TRACKER_RUN_ID, or initialise torch.distributed first"
        )
    return _new_run_id()


def _coerce(key: Any, value: Any) -> float:
    """A loggable value as float, or a TypeError naming the key."""
    if isinstance(value, (bool, numbers.Real)) and not isinstance(value, str):
        return float(value)
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
    """One training run (one rank of it). Create with :func:`tracker.init`."""

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
        self.status = "running"
        self.classes: list[str] | None = None
        self.meta: dict[str, Any] = {}
        self._next_step = start_step
        self._last_step: int | None = None
        self._written_step: int | None = None
        # deques: log() appends while the flusher pops from the other end; both are atomic,
        # so a row appended during a flush is never lost (a swapped list could lose it)
        self._buf: deque[tuple[int, float, tuple[str, ...], list[float]]] = deque()
        self._cbuf: deque[tuple[int, float, str, np.ndarray]] = deque()
        self._ebuf: deque[tuple[Any, ...]] = deque()
        self._rows = 0
        self._class_len: dict[str, int] = {}
        self._known_keys: set[tuple[str, ...]] = set()
        self._logger_names = list(loggers)
        self._sessions: list[tuple[str, Any]] = []
        self._analyzer: Any = None
        self._meta: RunMeta | None = None
        self._seq = 0
        self._lock = threading.Lock()  # serialises flushes, never held by log()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._finished = False
        self._thread: threading.Thread | None = None
        self.flush_interval = float(config.get("tracker_flush_interval", FLUSH_INTERVAL_S))

    # -- public API ------------------------------------------------------------------
    @property
    def step(self) -> int | None:
        """The last step logged in this process (None before the first log)."""
        return self._last_step

    def log(self, mapping: Mapping[str, Any], step: int | None = None) -> None:
        """Log scalar values at ``step`` (default: last step + 1). Never blocks on I/O."""
        if self._finished:
            raise RunError(f"run {self.run_id!r} is finished; start or resume a run to log more")
        if step is None:
            step = self._next_step
        elif step.__class__ is not int:
            step = self._check_step(step)
        if step < self.start_step:
            self._step_before_segment(step)
        keys = tuple(mapping)
        if keys not in self._known_keys:
            self._check_keys(keys)
        vals = []
        for k, v in mapping.items():
            t = v.__class__
            vals.append(v if (t is float or t is int) else _coerce(k, v))
        self._buf.append((step, time.time(), keys, vals))
        self._after_log(step, len(vals))

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
        except (TypeError, ValueError):
            raise TypeError(
                f"run.log_classes: values of key {key!r} must be a numeric vector, got "
                f"{type(values).__name__}"
            ) from None
        expected = len(self.classes) if self.classes else self._class_len.setdefault(key, arr.size)
        if arr.size != expected:
            raise ConfigError(
                f"run.log_classes: key {key!r} got {arr.size} values, expected {expected} "
                "(one per class, as set_classes or the first call said)"
            )
        if step is None:
            step = self._next_step
        step = self._check_step(step)
        if step < self.start_step:
            self._step_before_segment(step)
        self._cbuf.append((step, time.time(), key, arr))
        self._after_log(step, arr.size)

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
        ev = Event(
            step=self._check_step(step if step is not None else (self._last_step or self.start_step)),
            kind=str(kind),
            message=str(message),
            key=key,
            severity=severity,
            data=dict(data or {}),
        )
        self._ebuf.append(self._event_row(ev))

    def flush(self) -> None:
        """Write everything buffered so far (blocking; the flusher does this on its own)."""
        self._flush()

    def finish(self, status: str = "finished") -> None:
        """Flush, close the loggers and mark the run ``status``. Safe to call twice."""
        if self._finished:
            return
        self._finished = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        self._flush()
        if self.status == "running" or status != "finished":
            self.status = status
        if self._meta is not None:
            self._meta.ended(self.status)
        for name, session in self._sessions:
            try:
                session.close(self.status)
            except Exception as exc:
                log.warning("logger %s failed to close run %s: %s", name, self.run_id, exc)
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
        return int(step)

    def _step_before_segment(self, step: int) -> None:
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
            self._rows = 0
            self._wake.set()

    def _event_row(self, ev: Event) -> tuple[Any, ...]:
        return (
            ev.step,
            ev.key,
            ev.kind,
            ev.severity,
            ev.message,
            json.dumps(ev.data, default=float, allow_nan=True),
            time.time(),
        )

    # -- the flusher -----------------------------------------------------------------
    def _start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"tracker-flush-{self.run_id}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            try:
                self._flush()
            except Exception:  # the flusher must survive anything
                log.exception("tracker: flush of run %s failed", self.run_id)

    def _flush(self) -> None:
        with self._lock:
            buf, cbuf, ebuf = _drain(self._buf), _drain(self._cbuf), _drain(self._ebuf)
            if not (buf or cbuf or ebuf):
                return
            metrics = self._metrics_table(buf) if buf else None
            classes = self._class_table(cbuf) if cbuf else None
            status_before = self.status
            ebuf.extend(self._analyze(metrics, classes))
            events = self._events_table(ebuf) if ebuf else None
            changed = self.status if self.status != status_before else None
            batch = Batch(self._seq, metrics, classes, events, self._flushed_step(metrics, classes), changed)
            self._seq += 1
            if self._meta is not None:
                self._meta.flushed(batch.last_step)
                if changed and self.rank == 0:
                    self._meta.update(status=changed)
            for name, session in list(self._sessions):
                try:
                    session.write(batch)
                except Exception as exc:
                    log.error("logger %s failed on run %s and is dropped: %s", name, self.run_id, exc)
                    self._sessions.remove((name, session))

    def _flushed_step(self, metrics: pa.Table | None, classes: pa.Table | None) -> int | None:
        """The last step written so far (from the rows themselves: log() may run concurrently)."""
        for table in (metrics, classes):
            if table is not None and table.num_rows:
                top = pa.compute.max(table.column("step")).as_py()
                self._written_step = top if self._written_step is None else max(self._written_step, top)
        return self._written_step

    def _const(self, n: int) -> list[pa.Array]:
        return [
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([self.run_id])).cast(pa.string()),
            pa.array(np.full(n, self.rank, np.int32)),
            pa.array(np.full(n, self.segment, np.int32)),
        ]

    def _metrics_table(self, buf: list[tuple[int, float, tuple[str, ...], list[float]]]) -> pa.Table:
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, rec in enumerate(buf):
            groups.setdefault(rec[2], []).append(i)
        parts_step, parts_key, parts_val, parts_wall = [], [], [], []
        key_index: dict[str, int] = {}
        for keys, idx in groups.items():
            k = len(keys)
            if k == 0:
                continue
            rows = [buf[i] for i in idx]
            vals = np.array([r[3] for r in rows], dtype=np.float64).reshape(-1)
            steps = np.repeat(np.fromiter((r[0] for r in rows), np.int64, len(rows)), k)
            walls = np.repeat(np.fromiter((r[1] for r in rows), np.float64, len(rows)), k)
            codes = np.array([key_index.setdefault(key, len(key_index)) for key in keys], np.int32)
            parts_step.append(steps)
            parts_val.append(vals)
            parts_wall.append(walls)
            parts_key.append(np.tile(codes, len(rows)))
        steps = np.concatenate(parts_step) if parts_step else np.zeros(0, np.int64)
        order = np.argsort(steps, kind="stable")
        n = len(steps)
        keys_arr = pa.DictionaryArray.from_arrays(
            pa.array(np.concatenate(parts_key)[order] if n else np.zeros(0, np.int32)),
            pa.array(list(key_index), pa.string()),
        ).cast(pa.string())
        cols = self._const(n) + [
            pa.array(steps[order]),
            keys_arr,
            pa.array(np.concatenate(parts_val)[order] if n else np.zeros(0)),
            pa.array(np.concatenate(parts_wall)[order] if n else np.zeros(0)),
        ]
        return pa.Table.from_arrays(cols, schema=METRICS_SCHEMA)

    def _class_table(self, cbuf: list[tuple[int, float, str, np.ndarray]]) -> pa.Table:
        sizes = np.fromiter((r[3].size for r in cbuf), np.int64, len(cbuf))
        steps = np.repeat(np.fromiter((r[0] for r in cbuf), np.int64, len(cbuf)), sizes)
        walls = np.repeat(np.fromiter((r[1] for r in cbuf), np.float64, len(cbuf)), sizes)
        cls = np.concatenate([np.arange(r[3].size, dtype=np.int32) for r in cbuf])
        vals = np.concatenate([r[3] for r in cbuf])
        keys = pa.array(np.repeat(np.array([r[2] for r in cbuf], dtype=object), sizes), pa.string())
        n = int(sizes.sum())
        cols = self._const(n) + [pa.array(steps), keys, pa.array(cls), pa.array(vals), pa.array(walls)]
        return pa.Table.from_arrays(cols, schema=CLASS_SCHEMA)

    def _events_table(self, ebuf: list[tuple[Any, ...]]) -> pa.Table:
        cols = list(zip(*ebuf))
        n = len(ebuf)
        arrays = self._const(n) + [
            pa.array(cols[0], pa.int64()),
            *(pa.array(c, pa.string()) for c in cols[1:6]),
            pa.array(cols[6], pa.float64()),
        ]
        return pa.Table.from_arrays(arrays, schema=EVENTS_SCHEMA)

    def _analyze(self, metrics: pa.Table | None, classes: pa.Table | None) -> list[tuple[Any, ...]]:
        if self._analyzer is None or (metrics is None and classes is None):
            return []
        try:
            found = self._analyzer.observe(metrics, classes)
        except Exception:
            log.exception("tracker: online analysis of run %s failed; it is switched off", self.run_id)
            self._analyzer = None
            return []
        rows = []
        for ev in found or ():
            if ev.status:
                self.status = ev.status
            rows.append(self._event_row(ev))
        return rows


def _drain(queue: deque[Any]) -> list[Any]:
    """Pop what ``queue`` holds now, oldest first (appends racing with this stay queued)."""
    pop = queue.popleft
    return [pop() for _ in range(len(queue))]


# -- init ----------------------------------------------------------------------------
_LIVE: "weakref.WeakSet[Run]" = weakref.WeakSet()


def _flush_live_runs() -> None:
    for run in list(_LIVE):
        try:
            run.finish("crashed" if _CRASHED.is_set() else "finished")
        except Exception:  # pragma: no cover - interpreter is going away
            log.exception("tracker: final flush of run %s failed", run.run_id)


_CRASHED = threading.Event()
_prev_excepthook = sys.excepthook


def _excepthook(*args: Any) -> None:
    _CRASHED.set()
    _prev_excepthook(*args)


sys.excepthook = _excepthook
atexit.register(_flush_live_runs)


def _resolve_loggers(loggers: Iterable[str] | None) -> list[str]:
    if loggers is None:
        raw = os.environ.get("TRACKER_LOGGERS")
        loggers = [x.strip() for x in raw.split(",") if x.strip()] if raw else list(DEFAULT_LOGGERS)
    return list(dict.fromkeys(loggers))


def _plan_segment(home: Path, run_id: str, rank: int, resume: str, resume_step: int | None) -> tuple[int, int, str]:
    """(segment, start_step, reason) for this process."""
    if resume not in RESUME_MODES:
        raise ConfigError(f"resume={resume!r} is not one of {', '.join(RESUME_MODES)}")
    exists = (run_dir(home, run_id) / "run.json").exists()
    if not exists and resume == "must":
        raise RunError(
            f"cannot resume run {run_id!r}: no such run under {home}; "
            "check the run id (`tracker runs list`) and TRACKER_HOME, or pass resume='allow'"
        )
    segs = [s for s in list_segments(home, run_id) if s.rank == rank]
    if not segs:  # this rank has not logged to the run yet (a new run, or another rank made it)
        if resume_step is not None and not exists:
            raise ConfigError("resume_step is only meaningful when resuming an existing run")
        return 0, resume_step or 0, "start"
    if resume == "never":
        raise RunError(
            f"run {run_id!r} already exists under {home}; pass resume='allow' to continue it "
            "or choose another run_id"
        )
    segment = max(s.segment for s in segs) + 1
    if resume_step is None:
        last = visible_last_step(segs)
        resume_step = 0 if last is None else last + 1
    if isinstance(resume_step, bool) or not isinstance(resume_step, int) or resume_step < 0:
        raise ConfigError(f"resume_step must be a non-negative int, got {resume_step!r}")
    return segment, resume_step, "resume"


def init(
    project: str,
    name: str | None = None,
    config: Mapping[str, Any] | None = None,
    tags: Sequence[str] = (),
    run_id: str | None = None,
    resume: str = "never",
    resume_step: int | None = None,
    *,
    home: str | os.PathLike[str] | None = None,
    loggers: Iterable[str] | None = None,
    seed: int | None = None,
    store: str | None = None,
    data_path: str | None = None,
) -> Run:
    """Start (or resume) a run and return it.

    ``resume``: ``"never"`` (default; an existing ``run_id`` is an error), ``"allow"``
    (resume when it exists), ``"must"`` (fail when it does not). ``resume_step`` defaults
    to the last visible step + 1. ``loggers`` defaults to ``$TRACKER_LOGGERS`` or ``store``.
    ``store``/``data_path`` select a DuckLake (``"ducklake:postgres:..."``, as ``TRACKER_STORE``
    and ``TRACKER_DATA_PATH``) for this process.
    """
    if not isinstance(project, str) or not project:
        raise ConfigError(f"project must be a non-empty str, got {project!r}")
    cfg = dict(config or {})
    try:
        json.dumps(cfg, default=str)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config is not JSON-serialisable: {exc}") from None
    rank, world = rank_world()
    root = home_dir(home)
    run_id = check_run_id(run_id) if run_id is not None else _shared_run_id(world)
    from tracker.store.lakerun import prepare_run
    from tracker.store.settings import use as use_store

    if store is not None or data_path is not None:
        use_store(store, data_path)
    prepare_run(root, run_id, rank, resume)  # lake only: check credentials, bring its segments here
    segment, start, reason = _plan_segment(root, run_id, rank, resume, resume_step)
    if reason == "resume":
        old = read_json(run_dir(root, run_id) / "run.json") or {}
        project = old.get("project", project)
        name = name or old.get("name")
        cfg = {**old.get("config", {}), **cfg}
        tags = list(dict.fromkeys([*old.get("tags", []), *tags]))
    run = Run(
        project=project, name=name, run_id=run_id, config=cfg, tags=tags, home=root,
        rank=rank, world_size=world, segment=segment, start_step=start, reason=reason,
        loggers=_resolve_loggers(loggers),
    )
    run.meta = {
        "host": socket.gethostname(),
        "git_commit": _git_commit(),
        "python": platform.python_version(),
        "packages": _package_versions(),
        "seed": seed if seed is not None else cfg.get("seed"),
        "pid": os.getpid(),
    }
    run._meta = RunMeta(run)
    _open_sessions(run)
    _LIVE.add(run)
    run._start()
    from tracker.host import call_hook

    call_hook("tracker_run_start", run=run)
    return run


def _open_sessions(run: Run) -> None:
    from tracker.host import get_host

    host = get_host()
    available = host.items("loggers")
    for name in run._logger_names:
        if name not in available:
            raise ConfigError(
                f"Unknown logger {name!r}; available: {', '.join(sorted(available)) or 'none'}"
            )
        run._sessions.append((name, available[name].open(run)))
    if run.config.get("analysis") is False:
        return
    try:
        from tracker.analysis.online import make_online_analyzer
    except ImportError:
        return
    detectors = host.items("detectors")
    if detectors:
        run._analyzer = make_online_analyzer(run_id=run.run_id, config=run.config, detectors=detectors, run=run)
