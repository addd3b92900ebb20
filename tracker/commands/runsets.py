"""The bodies of ``tracker runs fork``, ``tracker runs compare`` and ``tracker runs groups``
(loaded only when one of them runs: the CLI start stays light)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Sequence

from tracker.commands._output import print_frame

if TYPE_CHECKING:  # pragma: no cover
    from tracker.store import Store


def fork_command(point: str, home: str | None, run_id: str | None, name: str | None,
                 project: str | None, fmt: str) -> None:
    """Start a fork of ``point`` (RUN@STEP) with no rows of its own and finish it at once."""
    import polars as pl

    import tracker
    from tracker.fork import fork_name, parent_state, parse_fork_from
    from tracker.spool import home_dir

    parsed = parse_fork_from(point)
    root = home_dir(home)
    parent, last = parent_state(root, parsed.run_id)
    step = parsed.step if parsed.step is not None else last
    run = tracker.init(project or parent["project"] or "default", name=name or fork_name(parent, step if step is not None else 0),
                       run_id=run_id, home=root, system=False, loggers=["store"], fork_from=point, tags=parent["tags"] or ())
    run.finish()
    made = {"run_id": run.run_id, "name": run.name, "project": run.project, "parent_run_id": parsed.run_id,
            "fork_step": run.start_step - 1, "start_step": run.start_step}
    if fmt == "json":
        sys.stdout.write(json.dumps(made) + "\n")
        return
    print_frame(pl.DataFrame([made]), fmt, title="fork", keys=("run_id",))
    if fmt == "table":
        sys.stderr.write(f"continue it with tracker.init({run.project!r}, run_id={run.run_id!r}, resume='must')\n")


def compare_command(store: Store, run_ids: Sequence[str], keys: Sequence[str], all_config: bool, fmt: str,
                    class_key: str = "val/AP50-95") -> None:
    """Config differences, summary metrics and the per-class difference of ``run_ids``."""
    from tracker import runsets
    from tracker.errors import RunError

    diff = runsets.config_diff(store, run_ids, only_differences=not all_config)
    summary = runsets.summary_side_by_side(store, run_ids, keys or None)
    try:
        classes = runsets.class_diff(store, run_ids, class_key)
    except RunError:
        classes = None  # no per-class rows of that key: nothing to compare
    if fmt == "json":
        out = {"config": diff.to_dicts(), "metrics": summary.to_dicts(),
               "classes": None if classes is None else classes.to_dicts()}
        sys.stdout.write(json.dumps(out, default=str) + "\n")
        return
    print_frame(diff, fmt, title="config (differences)" if not all_config else "config", keys=("key",))
    print_frame(summary, fmt, title="metrics", keys=("key", "stat"))
    if classes is not None:
        print_frame(classes, fmt, title=f"{class_key} per class, rarest first", keys=("class_name",))


def groups_command(store: Store, config_keys: Sequence[str], key: str, project: str | None, fmt: str) -> None:
    """Per group of runs sharing ``config_keys``: its runs and the statistics of ``key``."""
    from tracker import runsets

    df = runsets.group_summary(store, config_keys, key, project=project)
    if fmt == "json":
        sys.stdout.write(json.dumps(df.to_dicts(), default=str) + "\n")
        return
    print_frame(df, fmt, title=f"{key} by {', '.join(config_keys)}", keys=("group",), shrink=("runs",))
