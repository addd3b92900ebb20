"""System detectors: the labelled corpus, chunking, projections, online and offline on real runs."""

from __future__ import annotations

import numpy as np
import pytest

import tracker
from tracker.analysis.builtin import builtin_detectors
from tracker.analysis.corpus import format_table
from tracker.analysis.online import OnlineAnalyzer
from tracker.analysis.system import planned_steps
from tracker.analysis.system_corpus import (
    SYSTEM_KINDS,
    analyze_system_case,
    evaluate_system,
    system_cases,
)

TARGET = 0.95
GiB = float(1 << 30)


def _key(events):
    return sorted((e.step, e.kind, e.key or "", e.severity, e.message) for e in events)


def test_corpus_is_seeded_and_every_fault_is_labelled() -> None:
    a, b = system_cases(2, seed=5), system_cases(2, seed=5)
    assert [c.name for c in a] == [f"{k}-{i:03d}" for k in SYSTEM_KINDS for i in range(2)]
    assert all(np.array_equal(x.series["sys/proc/rss"][1], y.series["sys/proc/rss"][1]) for x, y in zip(a, b))
    kinds = {c.kind: {lb.kind for lb in c.labels} for c in a}
    assert kinds == {
        "healthy": set(),
        "leak": {"memory_growth"},
        "bloat": {"fragmentation"},
        "regression": {"step_time_regression"},
        "stall": {"data_stall", "step_time_regression"},
    }


@pytest.mark.parametrize("chunk", [1, 37, 500])
def test_same_events_whatever_the_chunking(chunk: int) -> None:
    for case in system_cases(1 if chunk == 1 else 2, seed=3):  # a sample at a time: one case of each kind
        whole = analyze_system_case(case)
        assert _key(analyze_system_case(case, chunk=chunk)) == _key(whole), case.name


def test_healthy_runs_get_nothing_and_faults_are_found() -> None:
    scores, healthy = evaluate_system(per_kind=6, seed=2)
    assert healthy == []
    for name, score in scores.items():
        assert score.tp > 0 and score.fp == 0, (name, score.to_dict())


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_system_detectors_meet_the_precision_and_recall_targets(seed: int) -> None:
    scores, healthy = evaluate_system(per_kind=20, seed=seed)
    print("\n" + format_table(scores))
    assert [e for e in healthy if e.severity != "info"] == []
    for name, score in scores.items():
        assert score.tp + score.fn > 0, name
        assert score.precision >= TARGET, (name, score.to_dict())
        assert score.recall >= TARGET, (name, score.to_dict())


def _leak_series(samples: int = 700, per_step: float = 1e6) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    steps = np.arange(1, samples + 1, dtype=np.int64) * 10
    reserved = 8 * GiB + per_step * steps + rng.normal(0, 2e6, samples)
    return {
        "sys/gpu0/reserved": (steps, reserved),
        "sys/gpu0/allocated": (steps, reserved * 0.9),
        "sys/gpu0/total": (steps, np.full(samples, 16 * GiB)),
    }


@pytest.mark.parametrize("plan, severity", [(None, "warning"), (100_000, "error"), (8_000, "warning")])
def test_memory_growth_projects_the_step_of_the_limit(plan: int | None, severity: str) -> None:
    config = {} if plan is None else {"planned_steps": plan}
    analyzer = OnlineAnalyzer(builtin_detectors(), config=config, strict=True)
    events = analyzer.feed_system(_leak_series())
    growth = [e for e in events if e.kind == "memory_growth"]
    assert len(growth) == 1 and growth[0].key == "sys/gpu0/reserved"
    data = growth[0].data
    # 8 GiB + 1 MB/step reaches 16 GiB near step 8,590; the event comes well before
    assert data["projected_step"] == pytest.approx(8 * GiB / 1e6, rel=0.05)
    assert growth[0].step < data["projected_step"] - 2000
    assert data["slope_bytes_per_step"] == pytest.approx(1e6, rel=0.05)
    assert data["limit"] == 16 * GiB and data["limit_key"] == "sys/gpu0/total"
    assert growth[0].severity == severity and data["oom_within_plan"] is (severity == "error")
    if severity == "error":
        assert "before the run's planned end" in growth[0].message and "out-of-memory" in growth[0].message


def test_planned_length_from_the_config() -> None:
    assert planned_steps({"max_steps": 500}) == 500
    assert planned_steps({"epochs": 3, "steps_per_epoch": 100}) == 300
    assert planned_steps({"epochs": 3}) is None
    assert planned_steps({"max_steps": True}) is None


def test_fragmentation_names_the_pool_figures() -> None:
    samples = 600
    steps = np.arange(samples, dtype=np.int64) * 10
    live = np.full(samples, 200e6)
    reserved = np.where(np.arange(samples) < 100, 240e6, 800e6)
    analyzer = OnlineAnalyzer(builtin_detectors(), strict=True)
    events = analyzer.feed_system({"sys/pool/reserved": (steps, reserved), "sys/pool/live": (steps, live)})
    frag = [e for e in events if e.kind == "fragmentation"]
    assert len(frag) == 1 and frag[0].key == "sys/pool/reserved"
    assert frag[0].data["ratio"] == pytest.approx(4.0) and frag[0].data["source"] == "pool"
    assert frag[0].step == steps[100 + 150 - 1]


def test_online_and_offline_agree_on_a_real_run() -> None:
    """A run logs sys/* keys as the sampler would; the flusher's events equal tracker.analyze's."""
    case = next(c for c in system_cases(1, seed=7) if c.kind == "stall")
    run = tracker.init("p", system=False, config={**case.config, "tracker_flush_interval": 0.05})
    rows: dict[int, dict[str, float]] = {}
    for key, (steps, values) in case.series.items():
        for s, v in zip(steps.tolist(), values.tolist()):
            rows.setdefault(s, {})[key] = v
    for step in sorted(rows):
        run.log({"loss": 1.0, **rows[step]}, step=step)
    run.finish()
    stored = tracker.query(
        "SELECT step, kind, key FROM events WHERE run_id = ? ORDER BY step, kind", [run.run_id]
    ).rows()
    offline = tracker.analyze(run.run_id)
    found = sorted((r.event.step, r.event.kind, r.event.key) for r in offline.events)
    assert stored == found
    system = {k for _, k, key in found if key.startswith("sys/")}
    assert system == {"data_stall", "step_time_regression"}
    # the loss detectors never see sys/* keys (the default key patterns are *loss*)
    assert {r.key for r in offline.keys} == {"loss"}


def test_a_resumed_run_continues_the_system_detectors_where_they_were() -> None:
    """Resume half-way: the flusher warms its system streams on the stored rows, so online == offline."""
    case = next(c for c in system_cases(1, seed=4) if c.kind == "regression")
    rows: dict[int, dict[str, float]] = {}
    for key, (steps, values) in case.series.items():
        if key != "sys/data_time":
            for s, v in zip(steps.tolist(), values.tolist()):
                rows.setdefault(s, {})[key] = v
    order = sorted(rows)
    onset = next(lb.onset for lb in case.labels)
    cut = next(i for i, s in enumerate(order) if s > onset)  # stop right after the change
    run = tracker.init("p", run_id="resumed", system=False, config=case.config)
    for step in order[:cut]:
        run.log(rows[step], step=step)
    run.finish("killed")
    run = tracker.init("p", run_id="resumed", resume="must", system=False)
    for step in order[cut:]:
        run.log(rows[step], step=step)
    run.finish()
    stored = tracker.query("SELECT step, kind FROM events WHERE run_id = 'resumed' ORDER BY step").rows()
    offline = sorted((r.event.step, r.event.kind) for r in tracker.analyze("resumed").events)
    assert stored == offline and ("step_time_regression" in {k for _, k in stored})
