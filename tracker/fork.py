"""Forks: a new run that shares a parent's history up to a step without copying it.

``tracker.init(project, fork_from="RUN@STEP")`` (and ``tracker runs fork RUN@STEP``)
start a run whose ``run.json`` records ``parent_run_id`` and ``fork_step`` and whose
first segment starts at ``STEP + 1``. Nothing is copied: the store's ``curves`` and
``class_curves`` views show, for a fork, the parent's *visible* rows (as the parent's
resume rule shows them, spool rows included, so a running parent can be forked) with
``step <= STEP``, then the fork's own rows (see :mod:`tracker.schema`). A fork of a
fork inherits recursively. ``fork_from="RUN"`` forks at the parent's last visible step.
The lake store refuses forks (its catalog has no lineage columns). See
docs/compare-and-fork.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracker.errors import ConfigError, RunError


@dataclass(frozen=True)
class ForkPoint:
    """A parsed ``RUN@STEP``; ``step`` is None for a bare ``RUN`` (its last visible step)."""

    run_id: str
    step: int | None


def parse_fork_from(text: Any) -> ForkPoint:
    """``"RUN@STEP"`` or ``"RUN"`` as a :class:`ForkPoint`; ConfigError naming the value otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"fork_from must be 'RUN@STEP' (e.g. '20260101-120000-abc123@500'), got {text!r}")
    run_id, sep, step_text = text.strip().rpartition("@")
    if not sep:
        return ForkPoint(step_text, None)
    if not run_id or not step_text.isdigit():
        raise ConfigError(
            f"fork_from={text!r} is not 'RUN@STEP' with a non-negative integer STEP "
            "(e.g. 'my-run@500'); leave out '@STEP' to fork at the parent's last step"
        )
    return ForkPoint(run_id, int(step_text))


def parent_state(home: Path, parent: str) -> tuple[dict[str, Any], int | None]:
    """(the parent's ``runs`` row as a dict, its last visible step) from the store, spool included."""
    from tracker.store.local import Store

    store = Store(home)
    rows = store.query("SELECT run_id, project, name, config, tags FROM runs WHERE run_id = ?", [parent])
    if rows.height == 0:
        raise RunError(
            f"cannot fork run {parent!r}: no such run under {home}; "
            "check the run id (`tracker runs list`) and TRACKER_HOME"
        )
    last = store.query("SELECT max(step) AS s FROM curves WHERE run_id = ?", [parent])["s"][0]
    return rows.row(0, named=True), None if last is None else int(last)


def _refuse_lake() -> None:
    from tracker.store.settings import current

    setting = current()
    if setting is not None:
        raise ConfigError(
            f"fork_from is not supported by the lake store ({setting.masked()}): its catalog has no "
            "lineage; fork in a local store (unset TRACKER_STORE, or pass store=None with a local home)"
        )


def plan_fork(
    home: Path, fork_from: str | None, run_id: str, reason: str, start: int, config: dict[str, Any]
) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(start step, config, ``run.json`` lineage fields) of a run started with ``fork_from``.

    Without ``fork_from`` everything is returned unchanged. A new fork starts at the
    fork step + 1 with the parent's config under its own (``config`` wins). Resuming a
    fork keeps its lineage; ``fork_from`` then must name the same parent and step.
    """
    if fork_from is None:
        return start, config, {}
    point = parse_fork_from(fork_from)
    _refuse_lake()
    if point.run_id == run_id:
        raise ConfigError(f"fork_from={fork_from!r}: a run cannot fork from itself; name another parent")
    if reason == "resume":
        from tracker.spool import read_run_meta, run_dir

        old = read_run_meta(run_dir(home, run_id) / "run.json") or {}
        if old.get("parent_run_id") != point.run_id or (point.step is not None and old.get("fork_step") != point.step):
            raise ConfigError(
                f"run {run_id!r} exists and is not a fork of {fork_from!r} "
                f"(its parent: {old.get('parent_run_id')!r} at {old.get('fork_step')!r}); "
                "resume it without fork_from, or fork into a new run id"
            )
        return start, config, {}
    row, last = parent_state(home, point.run_id)
    step = point.step if point.step is not None else last
    if step is None:
        raise RunError(f"cannot fork run {point.run_id!r}: it has logged no rows yet; name a step (RUN@STEP)")
    if last is None or step > last:
        raise RunError(
            f"cannot fork run {point.run_id!r} at step {step}: its last visible step is {last}; "
            "fork at a step it has logged (a running parent: wait until it gets there)"
        )
    import json

    parent_config = json.loads(row["config"]) if row.get("config") else {}
    merged = {**(parent_config if isinstance(parent_config, dict) else {}), **config}
    return step + 1, merged, {"parent_run_id": point.run_id, "fork_step": step}


def fork_name(parent: dict[str, Any], step: int) -> str:
    """The default name of a fork: the parent's name (or id) and ``@STEP``."""
    return f"{parent.get('name') or parent['run_id']}@{step}"


def refuse_fork_push(con: Any, run_id: str) -> None:
    """StoreError when run ``run_id`` of the attached local file ``src`` is a fork: the lake
    has no lineage, so its inherited rows would be lost (``tracker lake push``)."""
    from tracker.errors import StoreError

    has = con.execute("SELECT count(*) FROM information_schema.columns WHERE table_catalog = 'src' "
                      "AND table_name = 'runs' AND column_name = 'parent_run_id'").fetchone()[0]
    row = con.execute("SELECT parent_run_id, fork_step FROM src.main.runs WHERE run_id = ?",
                      [run_id]).fetchone() if has else None
    if row is not None and row[0] is not None:
        raise StoreError(
            f"run {run_id!r} is a fork of {row[0]}@{row[1]} and the lake has no lineage (its inherited rows "
            "would be lost); `tracker lake push --from` leaves forks out: keep it in the local store"
        )
