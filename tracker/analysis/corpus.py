"""The labelled corpus: generated loss curves with known findings, and their scoring.

Rules:

* Every curve is drawn from a seeded ``numpy.random.Generator``: the same
  ``(seed, n)`` gives the same corpus everywhere.
* Base curve: a per-batch loss ``a * (1 + t/tau) ** -alpha`` times log-normal
  noise of 3-25% (one point per step). Kinds, with their labels:
  ``converging`` (no finding), ``diverging`` (exponential, linear or step rise from
  a known onset, the model's loss level frozen there: a divergence within 200
  steps of it), ``spikes`` (isolated 2.5-10x points at known steps: a spike at
  each), ``non_finite`` (NaN/inf episodes at known steps: an event at each start),
  ``plateau`` (flat from a known step: one plateau after it; its delay is reported)
  and ``noisy`` (a steady level with heavy noise: it is flat, so one plateau, and
  nothing else).
* Per-class cases: 80 classes with COCO's class frequencies; named tail classes
  stay flat while the others learn. Rank cases: fingerprints per rank and epoch
  with known disagreements.
* Scoring matches each event to the first open label of its kind whose interval
  holds its step; an unmatched event is a false positive, an unmatched label a
  false negative. Divergence delay is the event step minus the onset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from tracker.analysis.builtin import builtin_detectors
from tracker.analysis.detectors import DetectorSpec, StreamContext
from tracker.analysis.online import OnlineAnalyzer
from tracker.errors import ConfigError
from tracker.events import Event

KINDS = ("converging", "diverging", "spikes", "non_finite", "plateau", "noisy")
SCORED = ("non_finite", "divergence", "spike", "plateau", "stagnant_classes", "rank_disagreement")
DIVERGENCE_DEADLINE = 200
PLATEAU_WINDOW = 2000
LENGTH = 6000


@dataclass
class Label:
    """An expected event of ``kind`` with a step in ``[lo, hi]``; ``onset`` for delays."""

    kind: str
    lo: int
    hi: int
    onset: int


@dataclass
class Case:
    """One labelled curve."""

    name: str
    kind: str
    seed: int
    steps: np.ndarray
    values: np.ndarray
    labels: list[Label] = field(default_factory=list)


def _base(rng: np.random.Generator, length: int) -> tuple[np.ndarray, np.ndarray, float]:
    t = np.arange(length)
    a, tau, alpha = rng.uniform(2.0, 6.0), rng.uniform(100.0, 600.0), rng.uniform(0.3, 0.8)
    sigma = rng.uniform(0.03, 0.15)
    return t, a * (1.0 + t / tau) ** -alpha, sigma


def _noise(rng: np.random.Generator, curve: np.ndarray, sigma: float) -> np.ndarray:
    return curve * np.exp(sigma * rng.standard_normal(curve.size))


def _converging(rng: np.random.Generator, length: int) -> tuple[np.ndarray, list[Label]]:
    t, curve, sigma = _base(rng, length)
    return _noise(rng, curve, sigma), []


def _diverging(rng: np.random.Generator, length: int) -> tuple[np.ndarray, list[Label]]:
    t, curve, sigma = _base(rng, length)
    onset = int(rng.integers(1500, 4000))
    dt = np.clip(t - onset, 0, None).astype(np.float64)
    shape = rng.choice(["exponential", "linear", "step"])
    if shape == "exponential":
        rise = np.exp(dt / rng.uniform(30.0, 150.0))
    elif shape == "linear":
        rise = 1.0 + dt / rng.uniform(40.0, 150.0)
    else:
        rise = 1.0 + (rng.uniform(2.0, 5.0) - 1.0) * np.clip(dt / rng.uniform(5.0, 60.0), 0.0, 1.0)
    rise = np.minimum(rise, rng.uniform(5.0, 1000.0))
    values = _noise(rng, np.where(t < onset, curve, curve[onset]) * rise, sigma)
    return values, [Label("divergence", onset, onset + DIVERGENCE_DEADLINE, onset)]


def _spikes(rng: np.random.Generator, length: int) -> tuple[np.ndarray, list[Label]]:
    t, curve, sigma = _base(rng, length)
    values = _noise(rng, curve, sigma)
    count = int(rng.integers(3, 9))
    slots = rng.choice(np.arange(300, length - 10, 300), size=count, replace=False)
    at = np.sort(slots + rng.integers(0, 150, size=count))
    values[at] = curve[at] * rng.uniform(2.5, 10.0, size=count)
    return values, [Label("spike", int(s), int(s), int(s)) for s in at]


def _non_finite(rng: np.random.Generator, length: int) -> tuple[np.ndarray, list[Label]]:
    t, curve, sigma = _base(rng, length)
    values = _noise(rng, curve, sigma)
    count = int(rng.integers(1, 4))
    starts = np.sort(rng.choice(np.arange(50, length - 400, 400), size=count, replace=False))
    labels = []
    for k, start in enumerate(starts.tolist()):
        last = k == count - 1 and rng.random() < 0.4
        stop = length if last else start + int(rng.integers(1, 20))
        values[start:stop] = rng.choice([np.nan, np.inf, -np.inf])
        labels.append(Label("non_finite", start, start, start))
        if last:
            break
    return values, labels


def _plateau(rng: np.random.Generator, length: int) -> tuple[np.ndarray, list[Label]]:
    t, curve, sigma = _base(rng, length)
    onset = int(rng.integers(1000, length - PLATEAU_WINDOW - 1500))
    curve = np.where(t < onset, curve, curve[onset])
    return _noise(rng, curve, sigma), [Label("plateau", onset, length, onset)]


def _noisy(rng: np.random.Generator, length: int) -> tuple[np.ndarray, list[Label]]:
    level = rng.uniform(0.5, 5.0)
    values = level * np.exp(rng.uniform(0.1, 0.25) * rng.standard_normal(length))
    return values, [Label("plateau", 0, length, 0)]


GENERATORS: dict[str, Callable[[np.random.Generator, int], tuple[np.ndarray, list[Label]]]] = {
    "converging": _converging,
    "diverging": _diverging,
    "spikes": _spikes,
    "non_finite": _non_finite,
    "plateau": _plateau,
    "noisy": _noisy,
}


def scalar_cases(per_kind: int = 30, seed: int = 0, length: int = LENGTH) -> list[Case]:
    """``per_kind`` seeded curves of every kind, ``length`` points each (at least 6000)."""
    if length < LENGTH:
        raise ConfigError(f"corpus length {length!r} is too short; curves need at least {LENGTH} points")
    cases = []
    for k, kind in enumerate(KINDS):
        for i in range(per_kind):
            case_seed = seed * 1_000_003 + k * 10_007 + i
            values, labels = GENERATORS[kind](np.random.default_rng(case_seed), length)
            cases.append(Case(f"{kind}-{i:03d}", kind, case_seed, np.arange(length, dtype=np.int64), values, labels))
    return cases


@dataclass
class ClassCase:
    """Per-class curves (rows x 80 classes) with the classes that never learn."""

    name: str
    seed: int
    steps: np.ndarray
    matrix: np.ndarray
    stagnant: set[int]


def coco_like_frequencies(classes: int = 80) -> np.ndarray:
    """Instance counts with COCO train2017's head-to-tail ratio (262,465 : 198)."""
    power = np.log(262_465 / 198) / np.log(classes)
    return 262_465 * np.arange(1, classes + 1, dtype=np.float64) ** -power


def class_cases(n: int = 20, seed: int = 0, rows: int = 1200, classes: int = 80) -> list[ClassCase]:
    """``n`` seeded per-class cases; most hold 1-5 stagnant tail classes, some none."""
    freq = coco_like_frequencies(classes)
    out = []
    for i in range(n):
        case_seed = seed * 1_000_003 + 77_777 + i
        rng = np.random.default_rng(case_seed)
        t = np.arange(rows, dtype=np.float64)[:, None]
        start = rng.uniform(0.2, 1.0, classes)
        tau = rng.uniform(20.0, 150.0, classes)
        alpha = rng.uniform(0.3, 0.7, classes)
        curves = start * (1.0 + t / tau) ** -alpha
        count = 0 if i % 4 == 0 else int(rng.integers(1, 6))
        stuck = rng.choice(np.arange(classes // 2, classes), size=count, replace=False)
        curves[:, stuck] = start[stuck] * (1.0 + rng.uniform(-0.03, 0.03, count))
        sigma = 0.05 + 0.35 * (1.0 - np.log(freq) / np.log(freq[0]))
        matrix = curves * np.exp(sigma * rng.standard_normal((rows, classes)))
        steps = np.arange(rows, dtype=np.int64) * 10
        out.append(ClassCase(f"classes-{i:03d}", case_seed, steps, matrix, {int(c) for c in stuck}))
    return out


@dataclass
class RankCase:
    """RNG fingerprints per rank and epoch, with the expected disagreement steps."""

    name: str
    seed: int
    series: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]
    expected_steps: list[int]


def rank_cases(n: int = 20, seed: int = 0, epochs: int = 20, steps_per_epoch: int = 500) -> list[RankCase]:
    """``n`` seeded cases: ranks that agree, one badly seeded rank, a late drift, two odd ranks."""
    out = []
    for i in range(n):
        case_seed = seed * 1_000_003 + 55_555 + i
        rng = np.random.default_rng(case_seed)
        world = int(rng.choice([2, 4, 8]))
        fps = np.tile(rng.integers(1, 2**52, size=epochs).astype(np.float64), (world, 1))
        variant = i % 4
        expected: list[int] = []
        if variant == 1:
            odd = int(rng.integers(0, world))
            fps[odd] = rng.integers(1, 2**52, size=epochs)
            expected = [0]
        elif variant == 2:
            odd, first = int(rng.integers(0, world)), int(rng.integers(1, epochs))
            fps[odd, first:] = rng.integers(1, 2**52, size=epochs - first)
            expected = [first * steps_per_epoch]
        elif variant == 3 and world > 2:
            pair, first = rng.choice(world, size=2, replace=False), int(rng.integers(0, epochs))
            fps[pair, first:] = rng.integers(1, 2**52, size=epochs - first)
            expected = [first * steps_per_epoch]
        steps = np.arange(epochs, dtype=np.int64) * steps_per_epoch
        series = {r: (steps, fps[r], np.arange(epochs, dtype=np.float64)) for r in range(world)}
        out.append(RankCase(f"ranks-{i:03d}", case_seed, series, expected))
    return out


@dataclass
class Score:
    """Precision, recall and delays of one detector over the corpus."""

    detector: str
    tp: int = 0
    fp: int = 0
    fn: int = 0
    cases: int = 0
    delays: list[int] = field(default_factory=list)

    @property
    def precision(self) -> float:
        """tp / (tp + fp); 1 when nothing was reported."""
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        """tp / (tp + fn); 1 when nothing was expected."""
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        delays = np.asarray(self.delays, dtype=np.float64)
        return {
            "detector": self.detector,
            "precision": self.precision,
            "recall": self.recall,
            "n": self.tp + self.fn,
            "tp": self.tp,
            "fp": self.fp,
            "fn": self.fn,
            "cases": self.cases,
            "mean_delay": float(delays.mean()) if delays.size else None,
            "max_delay": int(delays.max()) if delays.size else None,
        }


def match(events: list[Event], labels: list[Label], score: Score) -> None:
    """Add one case's events of ``score.detector`` to ``score``."""
    score.cases += 1
    wanted = [lb for lb in labels if lb.kind == score.detector]
    open_ = [True] * len(wanted)
    for event in sorted((e for e in events if e.kind == score.detector), key=lambda e: e.step):
        hit = next((k for k, lb in enumerate(wanted) if open_[k] and lb.lo <= event.step <= lb.hi), None)
        if hit is None:
            score.fp += 1
            continue
        open_[hit] = False
        score.tp += 1
        score.delays.append(event.step - wanted[hit].onset)
    score.fn += sum(open_)


def analyze_case(
    case: Case,
    detectors: Mapping[str, DetectorSpec] | None = None,
    overrides: Mapping[str, Any] | None = None,
    chunk: int | None = None,
) -> list[Event]:
    """Run the detectors over one curve, in one chunk or in chunks of ``chunk`` points."""
    analyzer = OnlineAnalyzer(detectors or builtin_detectors(), overrides=overrides, strict=True)
    size = chunk or case.values.size
    events: list[Event] = []
    for lo in range(0, case.values.size, size):
        events.extend(analyzer.feed("loss", case.steps[lo : lo + size], case.values[lo : lo + size]))
    return events


def evaluate(
    per_kind: int = 30,
    seed: int = 0,
    overrides: Mapping[str, Any] | None = None,
    detectors: Mapping[str, DetectorSpec] | None = None,
) -> dict[str, Score]:
    """Score every detector on the seeded corpus; returns detector -> Score."""
    detectors = detectors or builtin_detectors()
    scores = {name: Score(name) for name in SCORED}
    for case in scalar_cases(per_kind, seed):
        events = analyze_case(case, detectors, overrides)
        for name in ("non_finite", "divergence", "spike", "plateau"):
            match(events, case.labels, scores[name])
    analyzer_config = {"analysis": dict(overrides or {})}
    for ccase in class_cases(max(4, per_kind // 2), seed):
        analyzer = OnlineAnalyzer(detectors, config=analyzer_config, strict=True)
        events = analyzer.feed_classes("loss/cls", ccase.steps, ccase.matrix)
        flagged = {c for e in events if e.kind == "stagnant_classes" for c in e.data["classes"]}
        score = scores["stagnant_classes"]
        score.cases += 1
        score.tp += len(flagged & ccase.stagnant)
        score.fp += len(flagged - ccase.stagnant)
        score.fn += len(ccase.stagnant - flagged)
    for rcase in rank_cases(max(4, per_kind // 2), seed):
        events = detectors["rank_disagreement"].factory(StreamContext("rng/fingerprint", {})).detect(rcase.series)
        labels = [Label("rank_disagreement", s, s, s) for s in rcase.expected_steps]
        match(events, labels, scores["rank_disagreement"])
    return scores


def format_table(scores: Mapping[str, Score]) -> str:
    """The corpus table: detector, precision, recall, n, fp, fn, mean/max delay."""
    lines = [
        f"{'detector':<20} {'precision':>9} {'recall':>7} {'n':>5} {'fp':>4} {'fn':>4} "
        f"{'mean delay':>10} {'max delay':>9}"
    ]
    for score in scores.values():
        d = score.to_dict()
        mean = f"{d['mean_delay']:.0f}" if d["mean_delay"] is not None else "-"
        top = f"{d['max_delay']}" if d["max_delay"] is not None else "-"
        lines.append(
            f"{score.detector:<20} {score.precision:>9.3f} {score.recall:>7.3f} {d['n']:>5} {score.fp:>4} "
            f"{score.fn:>4} {mean:>10} {top:>9}"
        )
    return "\n".join(lines)


def scores_json(scores: Mapping[str, Score]) -> str:
    """The corpus scores as JSON."""
    return json.dumps([s.to_dict() for s in scores.values()], indent=2)


def save(scores: Mapping[str, Score], path: Path) -> None:
    """Write the corpus scores as JSON to ``path``."""
    path.write_text(scores_json(scores))
