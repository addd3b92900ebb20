"""Each detector on hand-made curves, its parameters, and chunk invariance."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracker.analysis.builtin import builtin_detectors
from tracker.analysis.corpus import analyze_case, scalar_cases
from tracker.analysis.detectors import Chunk, DetectorSpec, RateLimit, StreamContext, clean, run_lengths
from tracker.analysis.online import OnlineAnalyzer, make_online_analyzer
from tracker.analysis.params import Param, parse_assignment, resolve, uses_float16
from tracker.errors import ConfigError, PluginError
from tracker.events import Event


def run_curve(values: np.ndarray, config: dict[str, Any] | None = None, **overrides: Any) -> list[Event]:
    analyzer = OnlineAnalyzer(builtin_detectors(), config=config, overrides=overrides, strict=True)
    return analyzer.feed("loss", np.arange(values.size), values)


def kinds(events: list[Event]) -> list[tuple[str, int]]:
    return [(e.kind, e.step) for e in events]


def decaying(n: int = 3000, sigma: float = 0.05, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 3.0 * (1 + np.arange(n) / 200) ** -0.5 * rng.lognormal(0, sigma, n)


def test_run_lengths_and_rate_limit() -> None:
    assert run_lengths(np.array([1, 1, 0, 1, 1, 1], bool), carry=2).tolist() == [3, 4, 0, 1, 2, 3]
    limit = RateLimit(cooldown=10, budget=3)
    picked, skipped = limit.pick(np.array([0.0, 5, 12, 13, 30, 31, 60]))
    assert picked == [0, 2, 4] and skipped == [0, 1, 1]
    assert limit.pick(np.array([70.0])) == ([], [])
    assert limit.passed == 3


def test_clean_makes_data_json_ready() -> None:
    data = clean({"a": np.float64(np.nan), "b": [np.int64(3), np.inf], "c": np.bool_(True)})
    assert data == {"a": "nan", "b": [3, "inf"], "c": True}
    json.dumps(data, allow_nan=False)


def test_healthy_curve_raises_nothing() -> None:
    assert run_curve(decaying()) == []


def test_non_finite_one_event_per_episode_with_cooldown() -> None:
    values = decaying()
    values[[500, 501, 502]] = np.nan
    values[540] = np.inf
    values[900] = -np.inf
    values[2000:] = np.nan
    events = [e for e in run_curve(values) if e.kind == "non_finite"]
    assert kinds(events) == [("non_finite", 500), ("non_finite", 900), ("non_finite", 2000)]
    assert events[0].severity == "error" and "NaN" in events[0].message and events[0].data["last_finite_step"] == 499
    assert events[1].data["episodes_skipped"] == 1 and events[1].data["value"] == "-inf"
    assert "bfloat16" not in events[0].message


@pytest.mark.parametrize(
    "config",
    [{"amp": True}, {"dtype": "float16"}, {"precision": "16-mixed"}, {"dtype": "torch.float16"}, {"fp16": True}],
)
def test_non_finite_on_float16_runs_suggests_bfloat16_and_loss_scaling(config: dict[str, Any]) -> None:
    values = decaying(600)
    values[400] = np.inf
    (event,) = run_curve(values, config)
    assert "bfloat16" in event.message and "loss scaling" in event.message and event.data["float16"] is True
    assert uses_float16(config) and not uses_float16({"dtype": "bfloat16", "amp": False})


@pytest.mark.parametrize(
    "config",
    [
        {"amp": "float16"},  # amp given as a dtype string
        {"amp": "fp16"},
        {"amp_dtype": "torch.float16"},
        {"precision": "16-mixed"},  # Lightning
        {"precision": 16},
        {"precision": "16-true"},
        {"mixed_precision": "fp16"},  # accelerate
        {"fp16": True},  # Hugging Face TrainingArguments
        {"half": True},
        {"amp": True, "device": "0"},  # Ultralytics on CUDA
        {"amp": True, "device": "cuda:1"},
        {"trainer": {"precision": "16-mixed"}},  # a nested section
    ],
    ids=repr,
)
def test_float16_is_recognised_in_common_spellings(config: dict[str, Any]) -> None:
    values = decaying(600)
    values[400] = np.nan
    (event,) = run_curve(values, config)
    assert event.data["float16"] is True and "bfloat16" in event.message and "loss scaling" in event.message


@pytest.mark.parametrize(
    "config",
    [
        {"amp": "bfloat16"},
        {"precision": "bf16-mixed"},
        {"mixed_precision": "bf16"},
        {"mixed_precision": "no"},
        {"fp16": False},
        {"amp": True, "device": "cpu"},  # Ultralytics and autocast use no float16 on the CPU
        {"amp": True, "amp_dtype": "bfloat16"},
        {"precision": 0.85},  # a metric, not a dtype
        {"analysis": {"dtype": "float16"}},  # the analysis section is not the training config
    ],
    ids=repr,
)
def test_bfloat16_and_float32_runs_are_not_float16(config: dict[str, Any]) -> None:
    assert not uses_float16(config)


def test_divergence_sets_status_and_recovery_resets_it() -> None:
    values = decaying(4000, seed=1)
    values[2000:2600] *= 4.0
    events = run_curve(values)
    div, rec = [e for e in events if e.kind in ("divergence", "recovery")]
    assert div.kind == "divergence" and div.status == "diverged" and div.severity == "error"
    assert 2000 <= div.data["onset_step"] <= div.step <= 2000 + 60
    assert div.data["ratio"] > 1.5 and "lower the learning rate" in div.message
    assert rec.kind == "recovery" and rec.status == "running" and 2600 <= rec.step <= 2700


def test_a_single_huge_spike_is_a_spike_not_a_divergence() -> None:
    values = decaying(3000, seed=2)
    values[1500] *= 1000.0
    assert kinds(run_curve(values)) == [("spike", 1500)]


def test_divergence_thresholds_are_configurable() -> None:
    values = decaying(3000, seed=3)
    values[2000:] *= 1.4
    assert [e for e in run_curve(values) if e.kind == "divergence"] == []
    events = run_curve(values, {"analysis": {"divergence": {"factor": 1.2}}})
    assert [e.kind for e in events if e.kind == "divergence"] == ["divergence"]
    assert [e for e in run_curve(values, divergence={"factor": 1.2}, spike=False) if e.kind == "divergence"]


def test_spikes_are_isolated_rate_limited_and_budgeted() -> None:
    values = decaying(3000, seed=4)
    values[[1000, 1050, 1200, 1400]] *= 5.0
    values[1600:1603] *= 5.0
    events = run_curve(values)
    assert kinds(events) == [("spike", 1000), ("spike", 1200), ("spike", 1400)]
    assert events[1].data["spikes_skipped"] == 1 and events[0].data["ratio"] > 4
    limited = run_curve(values, spike={"budget": 1})
    assert kinds(limited) == [("spike", 1000)]


def test_plateau_after_the_window_and_not_on_a_rising_curve() -> None:
    rng = np.random.default_rng(5)
    curve = 3.0 * (1 + np.arange(6000) / 200) ** -0.5
    flat = np.where(np.arange(6000) < 1500, curve, curve[1500]) * rng.lognormal(0, 0.05, 6000)
    (event,) = run_curve(flat)
    assert event.kind == "plateau" and event.severity == "info"
    assert 1500 + 2000 <= event.step <= 1500 + 2600 and event.data["points_since"] >= 2000
    rising = np.where(np.arange(6000) < 1500, curve, curve[1500] * np.exp((np.arange(6000) - 1500) / 3000))
    assert [e for e in run_curve(rising, divergence=False) if e.kind == "plateau"] == []
    assert [e for e in run_curve(flat, plateau={"window": 500}) if e.kind == "plateau"][0].step < 1500 + 1200


def test_unknown_detector_or_parameter_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="Unknown parameter 'factr' of detector 'divergence'; available: factor"):
        run_curve(decaying(10), divergence={"factr": 2})
    with pytest.raises(ConfigError, match="Unknown detector 'divergance'"):
        run_curve(decaying(10), divergance={"factor": 2})
    with pytest.raises(ConfigError, match="divergence.factor = 0.5 is below its minimum"):
        run_curve(decaying(10), divergence={"factor": 0.5})
    with pytest.raises(ConfigError, match="spike.cooldown = 2.5 must be a whole number"):
        run_curve(decaying(10), spike={"cooldown": 2.5})


def test_parameter_layers_and_assignments() -> None:
    params = (Param("factor", 1.5, "x", 1.0), Param("patience", 25, "n", 1, None, True))
    assert resolve("d", params, None) == {"factor": 1.5, "patience": 25}
    assert resolve("d", params, {"patience": 30.0}) == {"factor": 1.5, "patience": 30}
    assert resolve("d", params, False) is None
    assert parse_assignment("divergence.factor=2") == ("divergence", "factor", 2.0)
    assert parse_assignment("plateau.enabled=false") == ("plateau", "enabled", False)
    with pytest.raises(ConfigError, match="detector.param=value"):
        parse_assignment("factor=2")
    with pytest.raises(ConfigError, match="not a number"):
        parse_assignment("divergence.factor=big")


def test_only_loss_keys_are_analysed_by_default() -> None:
    analyzer = OnlineAnalyzer(builtin_detectors(), strict=True)
    assert analyzer.selected("loss/box") and analyzer.selected("train/cls_loss") and analyzer.selected("Loss")
    assert not analyzer.selected("lr") and not analyzer.selected("metrics/mAP50")
    custom = OnlineAnalyzer(builtin_detectors(), config={"analysis": {"keys": ["val/*"]}})
    assert custom.selected("val/map") and not custom.selected("loss")


def test_make_online_analyzer_opts_out() -> None:
    specs = builtin_detectors()
    assert make_online_analyzer(run_id="r", config={}, detectors=specs) is not None
    assert make_online_analyzer(run_id="r", config={"analysis": False}, detectors=specs) is None
    assert make_online_analyzer(run_id="r", config={"analysis": {"enabled": False}}, detectors=specs) is None
    assert make_online_analyzer(run_id="r", config={"analysis": {"bogus": {}}}, detectors=specs) is None
    assert make_online_analyzer(run_id="r", config={}, detectors={"x": specs["rank_disagreement"]}) is None


def test_observe_groups_keys_of_an_arrow_batch() -> None:
    values = decaying(1000)
    values[700] = np.nan
    steps = np.repeat(np.arange(1000), 2)
    keys = pa.array(["loss/box", "lr"] * 1000).dictionary_encode()
    table = pa.table({"step": steps, "key": keys, "value": np.column_stack([values, np.full(1000, 0.1)]).ravel(),
                      "wall_time": np.zeros(2000)})
    analyzer = OnlineAnalyzer(builtin_detectors(), strict=True)
    events = analyzer.observe(table.slice(0, 900)) + analyzer.observe(table.slice(900))
    assert kinds(events) == [("non_finite", 700)] and events[0].key == "loss/box"
    assert set(analyzer.streams) == {"loss/box"}


def test_a_raising_detector_is_dropped_online_but_raises_offline() -> None:
    class Broken:
        def __init__(self, ctx: StreamContext) -> None:
            pass

        def feed(self, chunk: Chunk) -> list[Event]:
            raise ValueError("boom")

    specs = {"broken": DetectorSpec("broken", "scalar", Broken), **builtin_detectors()}
    online = OnlineAnalyzer(specs)
    values = decaying(600)
    values[300] = np.nan
    assert kinds(online.feed("loss", np.arange(600), values)) == [("non_finite", 300)]
    assert "broken" not in online.streams["loss"]
    with pytest.raises(ValueError, match="boom"):
        OnlineAnalyzer(specs, strict=True).feed("loss", np.arange(600), values)


def test_spec_validation() -> None:
    with pytest.raises(PluginError, match="scope 'global'"):
        DetectorSpec("x", "global", lambda ctx: None).validate()
    with pytest.raises(PluginError, match="repeat"):
        DetectorSpec("x", "scalar", lambda ctx: None, (Param("a", 1, ""), Param("a", 2, ""))).validate()
    for spec in builtin_detectors().values():
        spec.validate()
        assert spec.description


def signature(events: list[Event]) -> list[tuple[Any, ...]]:
    return sorted((e.step, e.kind, e.key, e.message, json.dumps(e.data, sort_keys=True), e.status) for e in events)


CASES = scalar_cases(per_kind=1, seed=11)


@settings(max_examples=25, deadline=None)
@given(case=st.sampled_from(CASES), sizes=st.lists(st.integers(10, 900), min_size=1, max_size=30))
def test_events_are_identical_whatever_the_chunking(case: Any, sizes: list[int]) -> None:
    analyzer = OnlineAnalyzer(builtin_detectors(), strict=True)
    events: list[Event] = []
    lo, k = 0, 0
    while lo < case.values.size:
        hi = lo + sizes[k % len(sizes)]
        events += analyzer.feed("loss", case.steps[lo:hi], case.values[lo:hi])
        lo, k = hi, k + 1
    assert signature(events) == signature(analyze_case(case))


def test_point_by_point_equals_one_chunk() -> None:
    values = decaying(1400, sigma=0.1, seed=9)
    values[[400, 401, 900]] = [np.nan, np.inf, np.nan]
    values[600] *= 6
    values[1000:] *= np.exp(np.arange(400) / 60)
    one = OnlineAnalyzer(builtin_detectors(), strict=True).feed("loss", np.arange(1400), values)
    assert {e.kind for e in one} == {"non_finite", "spike", "divergence"}
    analyzer = OnlineAnalyzer(builtin_detectors(), strict=True)
    many = [e for i in range(1400) for e in analyzer.feed("loss", np.arange(i, i + 1), values[i : i + 1])]
    assert signature(many) == signature(one)


def test_a_converged_near_zero_loss_neither_diverges_nor_plateaus() -> None:
    """A loss that fell from 2.3 to ~1e-5 and wobbles 2x there (a classifier that has learned its set) is
    converged; the same wobble on a loss still at its starting level is a plateau."""
    rng = np.random.default_rng(5)
    t = np.arange(12000)
    level = np.maximum(2.3 * np.exp(-t / 150.0), 2e-5)
    wobble = np.exp(0.7 * np.sin(t / 90.0) + 0.5 * rng.standard_normal(t.size))
    converged = run_curve(level * wobble)
    assert not [e for e in converged if e.kind in ("divergence", "plateau")], kinds(converged)
    assert [e for e in run_curve(level * wobble, divergence={"floor": 0}) if e.kind == "divergence"]
    assert [e for e in run_curve(level * wobble, plateau={"converged": 0}) if e.kind == "plateau"]
    stuck = run_curve(2.3 * np.exp(0.01 * rng.standard_normal(t.size)))
    assert [e.kind for e in stuck if e.kind == "plateau"] == ["plateau"]
