"""Running the epoch judges on a stored run (``tracker analyze``): the histories per rank.

See :mod:`tracker.analysis.epochs` for what a history holds and
:mod:`tracker.analysis.epoch_judges` for the judges.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from tracker.analysis.detectors import StreamContext
from tracker.analysis.epochs import MAX_POINTS, History
from tracker.analysis.report import EventRecord

ENVIRONMENT_KEYS = ("host", "gpus", "python", "packages", "git_commit", "imported_from")


def histories(store: Any, run: Mapping[str, Any], environment: Mapping[str, Any]) -> dict[int, History]:
    """One :class:`History` per rank: the run's keys with at most ``MAX_POINTS`` visible points."""
    counts = store.query(
        "SELECT rank, key, count(*) AS n FROM curves WHERE run_id = ? GROUP BY rank, key", [run["run_id"]]
    )
    small = counts.filter(counts["n"] <= MAX_POINTS)
    if small.height == 0:
        return {}
    keys = sorted(set(small["key"].to_list()))
    df = store.query(
        "SELECT rank, key, step, value FROM curves WHERE run_id = ? AND list_contains(?, key) "
        "ORDER BY rank, key, step",
        [run["run_id"], keys],
    )
    wanted = {(int(r), str(k)) for r, k in zip(small["rank"].to_list(), small["key"].to_list())}
    tags = run.get("tags") or []
    imported = any(str(t).startswith("import:") for t in tags)
    out: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for (rank, key), part in df.group_by(["rank", "key"], maintain_order=True):
        if (int(rank), str(key)) in wanted:
            out.setdefault(int(rank), {})[str(key)] = (
                part["step"].to_numpy().astype(np.int64), part["value"].to_numpy().astype(np.float64)
            )
    return {
        rank: History(series, dict(run.get("config") or {}), dict(environment), run.get("status"), imported)
        for rank, series in out.items()
    }


def epoch_findings(store: Any, run: Mapping[str, Any], probe: Any, environment: Mapping[str, Any]) -> list[EventRecord]:
    """The events of every enabled epoch judge, on every rank's history."""
    judges = [(name, spec, params) for name, (spec, params) in probe.detectors.items() if spec.scope == "epochs"]
    if not judges:
        return []
    records: list[EventRecord] = []
    for rank, history in sorted(histories(store, run, environment).items()):
        for _, spec, params in judges:
            judge = spec.factory(
                StreamContext(key="", params=dict(params), config=probe.config, environment=dict(environment))
            )
            records.extend(EventRecord(rank, e) for e in judge.judge(history))
    return records
