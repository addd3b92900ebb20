"""The built-in detectors plugin, and a third-party detector through the same hook."""

from __future__ import annotations

import types
from typing import Any, Iterator

import numpy as np
import pytest

import tracker
from tracker import hookimpl
from tracker.analysis import DetectorSpec, analyze
from tracker.analysis.detectors import Chunk, StreamContext
from tracker.analysis.online import make_online_analyzer
from tracker.analysis.params import Param
from tracker.events import Event
from tracker.host import Host, get_host, make_plugin_manager, set_host

BUILTIN = {
    "non_finite", "divergence", "spike", "plateau", "stagnant_classes", "rank_disagreement",
    "identical_batches", "twin_zero_loss", "class_zero_loss", "twin_overfitting", "memory_growth", "fragmentation", "step_time_regression", "data_stall", "collapse",
    "overfitting", "metric_collapse", "head_never_learnt", "zero_loss", "stopped_early", "epoch_divergence",
}


class AboveCeiling:
    """A third-party detector: a value above ``ceiling``, once per key."""

    def __init__(self, ctx: StreamContext) -> None:
        self.key, self.ceiling, self.done = ctx.key, float(ctx.params["ceiling"]), False

    def feed(self, chunk: Chunk) -> list[Event]:
        hits = np.flatnonzero(chunk.values > self.ceiling)
        if self.done or not hits.size:
            return []
        self.done = True
        step = int(chunk.steps[hits[0]])
        return [Event(step=step, kind="above_ceiling", key=self.key, message=f"{self.key} above {self.ceiling}")]

    def summary(self) -> dict[str, Any]:
        return {"above_ceiling": self.done}


CEILING = DetectorSpec("above_ceiling", "scalar", AboveCeiling, (Param("ceiling", 10.0, "the ceiling"),), "demo")


@pytest.fixture
def with_third_party() -> Iterator[Host]:
    @hookimpl
    def tracker_register_detectors(register: Any) -> None:
        register(CEILING)

    plugin = types.ModuleType("ceiling_plugin")
    plugin.tracker_register_detectors = tracker_register_detectors  # type: ignore[attr-defined]
    pm = make_plugin_manager(default_plugins=("plugins.store_logger", "plugins.detectors"), entry_points=False)
    pm.register(plugin, name="ceiling_plugin")
    host = Host(pm)
    old = set_host(host)
    yield host
    set_host(old)


def test_builtin_detectors_are_registered_by_the_plugin(host: Host) -> None:
    detectors = host.items("detectors")
    assert BUILTIN <= set(detectors)
    assert all(host.registry("detectors").owners[name] == "detectors" for name in BUILTIN)
    assert all(isinstance(detectors[name], DetectorSpec) for name in BUILTIN)
    assert host.status("detectors") is None


def test_plugins_listing_shows_the_detectors(host: Host) -> None:
    (entry,) = [d for d in host.describe() if d["name"] == "detectors"]
    assert set(entry["registered"]["detectors"]) == BUILTIN


def test_disabling_the_plugin_turns_online_analysis_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_DISABLE_PLUGINS", "detectors")
    set_host(None)
    assert get_host().items("detectors") == {}
    run = tracker.init("p")
    run.log({"loss": float("nan")}, step=0)
    run.finish()
    assert tracker.query("SELECT count(*) AS n FROM events")["n"][0] == 0
    assert make_online_analyzer(run_id="r", config={}, detectors={}) is None


def test_a_third_party_detector_runs_online_and_offline(with_third_party: Host) -> None:
    assert set(with_third_party.items("detectors")) == BUILTIN | {"above_ceiling"}
    assert with_third_party.registry("detectors").owners["above_ceiling"] == "ceiling_plugin"
    run = tracker.init("p", config={"analysis": {"above_ceiling": {"ceiling": 5.0}}})
    for step in range(300):
        run.log({"loss": 1.0 + (step == 123) * 10.0}, step=step)
    run.finish()
    events = tracker.query("SELECT step, kind FROM events WHERE kind = 'above_ceiling'")
    assert events.rows() == [(123, "above_ceiling")]
    result = analyze(run.run_id)
    found = [(r.event.step, r.event.kind) for r in result.events if r.event.kind == "above_ceiling"]
    assert found == [(123, "above_ceiling")]
    assert result.keys[0].detectors["above_ceiling"] is True
    assert not [r for r in analyze(run.run_id, above_ceiling={"ceiling": 50}).events if r.event.kind == "above_ceiling"]
