"""The labelled corpus of the system detectors: sampled ``sys/*`` curves with known findings.

Rules (those of :mod:`tracker.analysis.corpus`, which scores them):

* Every case is drawn from a seeded ``numpy.random.Generator``; a case is
  ``SAMPLES`` samples of the system sampler (one every 2 s, ``STEPS_PER_SAMPLE``
  training steps apart), plus ``sys/data_time`` at every step.
* A healthy run: memory filling up during a warm-up (the first 2-10 samples, as
  in the real trainings of ``bench/faults.py``), then flat with noise and
  an occasional single step up (an evaluation's buffers); step time noisy, slow
  for the first samples, with isolated long samples (evaluations); data time a
  small share of it with isolated long waits; reserved memory 1.05-1.35x the
  peak live. No label: a detector that reports anything on it is wrong.
* ``leak``: reserved GPU memory (or the process RSS) grows linearly or in
  stairs from a known onset (label ``memory_growth`` within ``MEMORY_DEADLINE``
  samples after it). ``bloat``: reserved memory climbs within 50 samples to
  2-4x the live peak and stays (label ``fragmentation``; the climb itself is fast
  growth of reserved memory, so a ``memory_growth`` event in the 400 samples after
  its onset is *allowed*: neither a hit nor a false alarm). ``regression``: the
  step time is 1.4-3x higher from an onset (label ``step_time_regression``).
  ``stall``: the data loader falls behind from an onset: waiting takes 50-85%
  of the step, so the step time rises too (labels ``data_stall`` and
  ``step_time_regression``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from tracker.analysis.corpus import Label, Score, match
from tracker.analysis.detectors import DetectorSpec
from tracker.analysis.online import OnlineAnalyzer
from tracker.events import Event

SYSTEM_KINDS = ("healthy", "leak", "bloat", "regression", "stall")
SYSTEM_SCORED = ("memory_growth", "fragmentation", "step_time_regression", "data_stall")
SAMPLES = 2000
STEPS_PER_SAMPLE = 10
MEMORY_DEADLINE = 600
FRAGMENTATION_DEADLINE = 400
REGRESSION_DEADLINE = 100
STALL_DEADLINE = 60 * STEPS_PER_SAMPLE
WARM_SAMPLES = 10  # memory fills within the first samples of a real run (bench/faults.py: within ~10 s)
GiB = float(1 << 30)

Series = dict[str, tuple[np.ndarray, np.ndarray]]


def allowed(events: list[Event], labels: list[Label]) -> list[Event]:
    """``events`` less those that an allowed label (same kind, step in its interval) covers."""
    return [e for e in events if not any(lb.kind == e.kind and lb.lo <= e.step <= lb.hi for lb in labels)]


@dataclass
class SystemCase:
    """One labelled run: ``sys/*`` key -> (steps, values), and its labels (steps)."""

    name: str
    kind: str
    seed: int
    series: Series
    labels: list[Label] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    allowed: list[Label] = field(default_factory=list)


@dataclass
class _Run:
    rng: np.random.Generator
    n: int = SAMPLES
    steps: np.ndarray = field(default_factory=lambda: np.arange(1, SAMPLES + 1, dtype=np.int64) * STEPS_PER_SAMPLE)

    def noise(self, sigma: float, size: int | None = None) -> np.ndarray:
        return np.exp(sigma * self.rng.standard_normal(size or self.n))

    def warm(self, level: float, samples: int) -> np.ndarray:
        t = np.arange(self.n)
        return level * (0.3 + 0.7 * np.clip(t / samples, 0.0, 1.0))

    def bumps(self, curve: np.ndarray, count: int, size: float) -> np.ndarray:
        for at in self.rng.integers(200, self.n - 100, size=count):
            curve[at:] *= 1.0 + self.rng.uniform(0.3, 1.0) * size
        return curve


def _healthy(run: _Run) -> tuple[Series, dict[str, Any]]:
    rng, n = run.rng, run.n
    total = float(rng.choice([16, 24, 40, 80])) * GiB
    live_peak = rng.uniform(0.2, 0.6) * total
    fill = int(rng.integers(2, WARM_SAMPLES))
    live_peak_curve = run.bumps(run.warm(live_peak, fill), int(rng.integers(0, 2)), 0.08)
    allocated = live_peak_curve * rng.uniform(0.6, 1.0, n)
    reserved = live_peak_curve * rng.uniform(1.05, 1.35) * run.noise(0.005)
    rss_level = rng.uniform(2.0, 8.0) * GiB
    rss = run.bumps(run.warm(rss_level, int(rng.integers(2, WARM_SAMPLES))), int(rng.integers(0, 3)), 0.04)
    rss = rss * run.noise(rng.uniform(0.002, 0.01))
    compute = rng.uniform(0.05, 0.5)
    step_time = compute * run.noise(rng.uniform(0.03, 0.15))
    step_time[: int(rng.integers(5, 25))] *= rng.uniform(1.5, 4.0)
    evals = np.arange(int(rng.integers(150, 400)), n, int(rng.integers(250, 500)))
    share = rng.uniform(0.03, 0.2)
    return {
        "sys/gpu0/reserved": (run.steps, reserved),
        "sys/gpu0/allocated": (run.steps, allocated),
        "sys/gpu0/total": (run.steps, np.full(n, total)),
        "sys/proc/rss": (run.steps, rss),
        "sys/host/mem_total": (run.steps, np.full(n, 64 * GiB)),
        "sys/pool/reserved": (run.steps, reserved * 0.1),
        "sys/pool/live": (run.steps, allocated * 0.1),
    }, {"step_time": step_time, "share": np.full(n, share), "evals": evals, "allowed": [],
        "eval_factor": rng.uniform(3.0, 20.0, evals.size)}


def _data_time(run: _Run, step_time: np.ndarray, share: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-step data time: each step waits ``share`` of the step time of its sample, with noise and outliers."""
    steps = np.arange(1, run.n * STEPS_PER_SAMPLE + 1, dtype=np.int64)
    per = np.repeat(step_time * share, STEPS_PER_SAMPLE)
    values = per * run.noise(0.3, steps.size)
    odd = run.rng.random(steps.size) < 0.003
    values[odd] = np.repeat(step_time, STEPS_PER_SAMPLE)[odd] * run.rng.uniform(0.5, 0.95, int(odd.sum()))
    return steps, values


def _onset(run: _Run, lo: int = 300, hi: int = 1200) -> int:
    return int(run.rng.integers(lo, hi))


def _leak(run: _Run, series: Series, extra: dict[str, Any]) -> list[Label]:
    o = _onset(run)
    key = "sys/gpu0/reserved" if run.rng.random() < 0.7 else "sys/proc/rss"
    steps, values = series[key]
    level = float(np.median(values[o - 50 : o]))
    per_sample = level * run.rng.uniform(0.03, 0.3) / 300
    growth = per_sample * np.clip(np.arange(run.n) - o, 0, None)
    if run.rng.random() < 0.5:  # stairs, as a caching allocator grows
        stair = int(run.rng.integers(3, 12))
        growth = np.floor(growth / (per_sample * stair)) * per_sample * stair
    series[key] = (steps, values + growth)
    if key == "sys/gpu0/reserved":
        a_steps, allocated = series["sys/gpu0/allocated"]
        series["sys/gpu0/allocated"] = (a_steps, allocated + growth)
    return [Label("memory_growth", int(steps[o]), int(steps[min(o + MEMORY_DEADLINE, run.n - 1)]), int(steps[o]))]


def _bloat(run: _Run, series: Series, extra: dict[str, Any]) -> list[Label]:
    o = _onset(run, 300, 1400)
    head = "gpu0" if run.rng.random() < 0.5 else "pool"
    live_key = "sys/gpu0/allocated" if head == "gpu0" else "sys/pool/live"
    steps, reserved = series[f"sys/{head}/reserved"]
    peak = np.maximum.accumulate(series[live_key][1])
    target = peak * run.rng.uniform(2.0, 4.0)
    ramp = np.clip((np.arange(run.n) - o) / run.rng.uniform(5, 50), 0.0, 1.0)
    series[f"sys/{head}/reserved"] = (steps, np.maximum(reserved, reserved + ramp * (target - reserved)))
    end = min(o + FRAGMENTATION_DEADLINE, run.n - 1)
    extra.setdefault("allowed", []).append(Label("memory_growth", int(steps[o]), int(steps[end]), int(steps[o])))
    return [Label("fragmentation", int(steps[o]), int(steps[end]), int(steps[o]))]


def _regression(run: _Run, series: Series, extra: dict[str, Any]) -> list[Label]:
    o = _onset(run, 300, 1800)
    extra["step_time"][o:] *= run.rng.uniform(1.4, 3.0)
    steps = series["sys/proc/rss"][0]
    end = min(o + REGRESSION_DEADLINE, run.n - 1)
    return [Label("step_time_regression", int(steps[o]), int(steps[end]), int(steps[o]))]


def _stall(run: _Run, series: Series, extra: dict[str, Any]) -> list[Label]:
    o = _onset(run, 300, 1800)
    old = float(extra["share"][0])
    new = run.rng.uniform(0.5, 0.85)
    extra["step_time"][o:] *= (1.0 - old) / (1.0 - new)
    extra["share"][o:] = new
    steps = series["sys/proc/rss"][0]
    onset = int(steps[o])
    end = min(o + REGRESSION_DEADLINE, run.n - 1)
    return [
        Label("data_stall", onset, onset + STALL_DEADLINE, onset),
        Label("step_time_regression", onset, int(steps[end]), onset),
    ]


FAULTS: dict[str, Callable[[_Run, Series, dict[str, Any]], list[Label]]] = {
    "leak": _leak, "bloat": _bloat, "regression": _regression, "stall": _stall,
}


def system_cases(per_kind: int = 20, seed: int = 0) -> list[SystemCase]:
    """``per_kind`` seeded runs of every kind in :data:`SYSTEM_KINDS`."""
    cases = []
    for k, kind in enumerate(SYSTEM_KINDS):
        for i in range(per_kind):
            case_seed = seed * 1_000_003 + 33_333 + k * 10_007 + i
            run = _Run(np.random.default_rng(case_seed))
            series, extra = _healthy(run)
            labels = FAULTS[kind](run, series, extra) if kind in FAULTS else []
            sampled = extra["step_time"].copy()
            sampled[extra["evals"]] *= extra["eval_factor"]  # an evaluation inside the sample
            series["sys/step_time"] = (run.steps, sampled)
            series["sys/data_time"] = _data_time(run, extra["step_time"], extra["share"])
            config = {"planned_steps": SAMPLES * STEPS_PER_SAMPLE}
            cases.append(SystemCase(f"{kind}-{i:03d}", kind, case_seed, series, labels, config, extra["allowed"]))
    return cases


def analyze_system_case(
    case: SystemCase, detectors: Mapping[str, DetectorSpec] | None = None, chunk: int | None = None
) -> list[Event]:
    """Run the detectors over one case, in one chunk or in chunks of ``chunk`` samples' steps."""
    from tracker.analysis.builtin import builtin_detectors

    analyzer = OnlineAnalyzer(detectors or builtin_detectors(), config=case.config, strict=True)
    if chunk is None:
        return analyzer.feed_system(case.series)
    last = max(int(s[-1]) for s, _ in case.series.values())
    span = chunk * STEPS_PER_SAMPLE
    events: list[Event] = []
    for lo in range(0, last + 1, span):
        part = {}
        for key, (steps, values) in case.series.items():
            a, b = np.searchsorted(steps, [lo, lo + span])
            if b > a:
                part[key] = (steps[a:b], values[a:b])
        events.extend(analyzer.feed_system(part))
    return events


def evaluate_system(
    per_kind: int = 20, seed: int = 0, detectors: Mapping[str, DetectorSpec] | None = None
) -> tuple[dict[str, Score], list[Event]]:
    """Score the system detectors on the seeded corpus; also returns the events on healthy runs."""
    scores = {name: Score(name) for name in SYSTEM_SCORED}
    healthy: list[Event] = []
    for case in system_cases(per_kind, seed):
        events = allowed(analyze_system_case(case, detectors), case.allowed)
        if case.kind == "healthy":
            healthy.extend(events)
        for name in SYSTEM_SCORED:
            match(events, case.labels, scores[name])
    return scores, healthy
