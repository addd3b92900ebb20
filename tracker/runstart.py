"""Starting a run: :func:`init` (``tracker.init``, also ``tracker.run.init``).

It checks the arguments, lets the store's backend prepare the run
(:func:`tracker.store.prepare_run`: the lake brings a run's segments from another
host), plans the segment and first step (:mod:`tracker.runplan`: the resume rule),
opens the loggers and the online analyzer, writes the run's metadata files and starts
the run's flusher (:class:`tracker.run.Run`).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Iterable, Mapping, Sequence

from tracker.dist import rank_world
from tracker.errors import ConfigError, RunError
from tracker.loggers import DEFAULT_LOGGERS
from tracker.run import _LIVE, Run
from tracker.runmeta import RunMeta
from tracker.runplan import environment, plan_segment, shared_run_id
from tracker.spool import check_run_id, home_dir, read_run_meta, run_dir
from tracker.system import system_options

log = logging.getLogger("tracker.run")


def _resolve_loggers(loggers: Iterable[str] | None) -> list[str]:
    if loggers is None:
        raw = os.environ.get("TRACKER_LOGGERS")
        loggers = [x.strip() for x in raw.split(",") if x.strip()] if raw else list(DEFAULT_LOGGERS)
    return list(dict.fromkeys(loggers))


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
    system: bool | float | None = None,
    store: str | None = None,
    data_path: str | None = None,
    notify: Iterable[Any] | None = None,
    fork_from: str | None = None,
) -> Run:
    """Start (or resume) a run and return it.

    ``resume``: ``"never"`` (default; an existing ``run_id`` is an error), ``"allow"``
    (resume when it exists), ``"must"`` (fail when it does not). ``resume_step`` defaults
    to the last visible step + 1. ``loggers`` defaults to ``$TRACKER_LOGGERS`` or ``store``.
    ``system``: the system sampler, on by default (False: off; seconds: its interval;
    see :mod:`tracker.system`).
    ``notify``: alert targets and rules (default ``$TRACKER_NOTIFY`` or pyproject.toml's
    ``[tool.tracker.notify]``; see docs/alerts.md).
    ``store``/``data_path`` select a DuckLake (``"ducklake:postgres:..."``, as ``TRACKER_STORE``
    and ``TRACKER_DATA_PATH``) for this process.
    ``fork_from="RUN@STEP"``: a fork sharing RUN's visible rows up to STEP (:mod:`tracker.fork`).
    """
    if not isinstance(project, str) or not project:
        raise ConfigError(f"project must be a non-empty str, got {project!r}")
    cfg = dict(config or {})
    try:
        json.dumps(cfg, default=str)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config is not JSON-serialisable: {exc}") from None
    system_opts = system_options(system)
    from tracker.notify.dispatch import attach, configure

    alerts = configure(notify)  # a bad target fails here, before any file is written
    rank, world = rank_world()
    root = home_dir(home)
    run_id = check_run_id(run_id) if run_id is not None else shared_run_id(world)
    from tracker.store import prepare_run
    from tracker.store.settings import use as use_store

    if store is not None or data_path is not None:
        use_store(store, data_path)
    prepare_run(root, run_id, rank, resume)  # the backend's (the lake: credentials checked, its segments here)
    segment, start, reason = plan_segment(root, run_id, rank, resume, resume_step)
    from tracker.fork import plan_fork

    start, cfg, lineage = plan_fork(root, fork_from, run_id, reason, start, cfg)
    if reason == "resume":
        old = read_run_meta(run_dir(root, run_id) / "run.json") or {}
        project = old.get("project", project)
        name = name or old.get("name")
        cfg = {**old.get("config", {}), **cfg}
        tags = list(dict.fromkeys([*old.get("tags", []), *tags]))
    run = Run(
        project=project, name=name, run_id=run_id, config=cfg, tags=tags, home=root,
        rank=rank, world_size=world, segment=segment, start_step=start, reason=reason,
        loggers=_resolve_loggers(loggers),
    )
    run.system = system_opts
    run.meta = {**environment(seed, cfg), **lineage}
    _open_sessions(run)  # before any file is written: a failure here leaves nothing behind
    try:
        run._meta = RunMeta(run)
    except BaseException:
        _close_sessions(run, "crashed")
        raise
    attach(run, alerts)
    _LIVE.add(run)
    run._start()
    from tracker.host import call_hook

    call_hook("tracker_run_start", run=run)
    return run


def _open_sessions(run: Run) -> None:
    """Open the run's loggers. An unknown name is a ConfigError; a logger whose ``open``
    raises is left out with a warning naming it; when none of them opens, RunError."""
    from tracker.host import get_host

    host = get_host()
    available = host.items("loggers")
    for name in run._logger_names:
        if name not in available:
            raise ConfigError(
                f"Unknown logger {name!r}; available: {', '.join(sorted(available)) or 'none'}"
            )
    failed: list[str] = []
    for name in run._logger_names:
        try:
            run._sessions.append((name, available[name].open(run)))
        except Exception as exc:
            failed.append(f"{name!r} ({type(exc).__name__}: {exc})")
            log.warning("tracker: logger %r failed to open run %s and is left out: %s", name, run.run_id, exc)
    if failed and not run._sessions:
        folder = run_dir(run.home, run.run_id)
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        raise RunError(
            f"no logger could open run {run.run_id!r}: {', '.join(failed)}; fix the logger or "
            "choose others (loggers=[...] or TRACKER_LOGGERS)"
        )
    if run.config.get("analysis") is False:
        return
    try:
        from tracker.analysis.online import make_online_analyzer
    except ImportError:
        return
    detectors = host.items("detectors")
    if detectors:
        run._analyzer = make_online_analyzer(run_id=run.run_id, config=run.config, detectors=detectors, run=run)


def _close_sessions(run: Run, status: str) -> None:
    for name, session in run._sessions:
        try:
            session.close(status)
        except Exception as exc:
            log.warning("tracker: logger %r failed to close run %s: %s", name, run.run_id, exc)
