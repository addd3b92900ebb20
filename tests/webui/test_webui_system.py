"""The System page: its queries on a real store, and the page under AppTest (two runs, two ranks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import tracker
from tracker.analysis.system_corpus import system_cases
from tracker.store import Store
from webui import system_charts
from webui.system_queries import GiB, group_of, system_view


def _log_case(series: dict[str, tuple[np.ndarray, np.ndarray]], **init: Any) -> str:
    run = tracker.init("sys", system=False, **init)
    rows: dict[int, dict[str, float]] = {}
    for key, (steps, values) in series.items():
        if key == "sys/data_time":
            continue
        for s, v in zip(steps.tolist(), values.tolist()):
            rows.setdefault(s, {})[key] = v
    for step in sorted(rows):
        run.log({"loss": 1.0 / (1 + step), **rows[step]}, step=step)
    run.finish()
    return run.run_id


@pytest.fixture(scope="module")
def system_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Two runs: a leak on two ranks (a memory_growth event each) and a healthy one."""
    home = tmp_path_factory.mktemp("system") / "home"
    mp = pytest.MonkeyPatch()
    mp.setenv("TRACKER_HOME", str(home))
    mp.setenv("TRACKER_SYSTEM", "0")
    cases = {c.kind: c for c in system_cases(1, seed=11)}
    for rank in (0, 1):
        mp.setenv("RANK", str(rank))
        mp.setenv("WORLD_SIZE", "2")
        _log_case(cases["leak"].series, name="leaky", run_id="leaky", config=cases["leak"].config)
    mp.delenv("RANK")
    mp.delenv("WORLD_SIZE")
    _log_case(cases["healthy"].series, name="healthy", run_id="healthy")
    mp.undo()
    yield home


@pytest.fixture
def home_env(system_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRACKER_HOME", str(system_home))
    return system_home


def test_keys_are_grouped_for_the_charts() -> None:
    assert group_of("sys/gpu0/reserved") == "memory" and group_of("sys/gpu12/allocated") == "memory"
    assert group_of("sys/gpu0/total") == "limit" and group_of("sys/host/mem_total") == "limit"
    assert group_of("sys/step_time") == "time" and group_of("sys/gpu3/util") == "utilisation"
    assert group_of("sys/pool/allocations") == "other"


def test_system_view_reads_curves_limits_and_events(home_env: Path) -> None:
    view = system_view(Store(home_env), ["leaky", "healthy"])
    keys = dict(zip(view.keys["key"].to_list(), view.keys["ranks"].to_list()))
    assert keys["sys/gpu0/reserved"] == 2 and "sys/step_time" in keys
    leaky = view.limits.filter(view.limits["run_id"] == "leaky")
    assert sorted(leaky["rank"].to_list()) == [0, 0, 1, 1]
    gpu = leaky.filter(leaky["key"] == "sys/gpu0/total")
    assert gpu["limit_gib"].n_unique() == 1 and gpu["limit_gib"][0] in (16.0, 24.0, 40.0, 80.0)
    growth = view.events.filter(view.events["kind"] == "memory_growth")
    assert growth["run_id"].to_list() == ["leaky", "leaky"] and sorted(growth["rank"].to_list()) == [0, 1]
    assert view.events.filter(view.events["run_id"] == "healthy").is_empty()
    memory = view.points.filter((view.points["key"] == "sys/gpu0/reserved") & (view.points["run_id"] == "healthy"))
    assert memory["y"].max() == pytest.approx(memory["mean"].max() / GiB)
    assert "sys/gpu0/total" not in view.points["key"].to_list()  # limits are rules, not lines
    lines, rules, marks = system_charts.chart_frames(view.points, view.limits, view.events,
                                                     {"leaky": "leaky", "healthy": "healthy"}, "memory")
    assert "leaky · rank 1 · gpu0/reserved" in lines["series"].to_list()
    assert rules.height == view.limits.height and set(marks["kind"].to_list()) == {"memory_growth"}
    _, _, time_marks = system_charts.chart_frames(view.points, view.limits, view.events, {}, "time")
    assert time_marks.is_empty()


def test_system_page_draws_memory_with_the_limit_and_the_events(home_env: Path, app_page: Any,
                                                                charts_of: Any) -> None:
    at = app_page("system", run=["leaky", "healthy"])
    assert [t.value for t in at.title] == ["System"]
    assert [s.value for s in at.subheader][:3] == ["Memory", "Step and data time", "Events"]
    ranks = at.multiselect(key="system.ranks")
    assert ranks.value == [0, 1]
    specs = charts_of(at)
    assert len(specs) == 2
    memory = specs[0]
    rows = memory["_rows"]
    limits = {r["limit_gib"] for r in rows if "limit_gib" in r}
    assert limits and all(v in (16.0, 24.0, 40.0, 64.0, 80.0) for v in limits)
    kinds = {r["kind"] for r in rows if "kind" in r}
    assert kinds == {"memory_growth"}
    series = {r["series"] for r in rows if "y" in r}
    assert "leaky · rank 1 · gpu0/reserved" in series and "healthy · rank 0 · proc/rss" in series
    # one rank only: its lines and none of the other's
    ranks.set_value([1]).run()
    assert not at.exception
    series = {r["series"] for r in charts_of(at)[0]["_rows"] if "y" in r}
    assert series and all("rank 1" in s for s in series)


def test_system_page_without_system_metrics(home_env: Path, plain_run: str, app_page: Any) -> None:
    at = app_page("system", run=[plain_run])
    assert any("No system metrics" in i.value for i in at.info)
