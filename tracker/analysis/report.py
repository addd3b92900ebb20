"""What ``tracker.analyze`` returns: verdicts per loss key, events and stagnant classes.

Rules of the verdict (per key and rank, from the finite points):

* ``too short to tell`` below ``trend.min_points`` finite points (10: an epoch-level
  history of 10 points gets a verdict; a per-batch curve is far longer);
* ``diverging`` when the curve ends non-finite (NaN/inf), or when the divergence
  detector ends in its diverged state;
* ``plateaued`` when the plateau detector ends on a plateau (no improvement over
  its window), even if a tiny decline is statistically significant;
* otherwise the Mann–Kendall trend of the recent part of the curve (the last
  ``trend.recent`` fraction of its points) decides: decreasing at confidence
  ``1 - trend.alpha`` is ``converging``, increasing is ``diverging``, neither is
  ``plateaued``.

Every verdict but ``converging`` carries one line of advice (``advice``). The run's
*findings* (:attr:`Analysis.findings`) are the events of the epoch judges
(overfitting, metric collapse, zero loss, stopped early, epoch divergence); each has
``onset``, ``confidence`` and ``advice`` in its data.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tracker.analysis.params import Param
from tracker.analysis.trend import Trend, trend
from tracker.events import Event

VERDICTS = ("converging", "diverging", "plateaued", "too short to tell")

TREND_PARAMS: tuple[Param, ...] = (
    Param("max_points", 500, "buckets of the downsampled curve for the trend test", 8, 2000, True),
    Param("alpha", 0.01, "significance level of the trend test", 1e-9, 0.5),
    Param("min_points", 10, "fewer finite points: too short to tell", 8, None, True),
    Param("recent", 0.5, "fraction of the curve (its end) judged by the trend test", 0.05, 1.0),
)


@dataclass
class KeyReport:
    """The verdict on one loss key of one rank."""

    key: str
    rank: int
    points: int
    non_finite: int
    first_step: int | None
    last_step: int | None
    last_value: float | None
    verdict: str
    reason: str
    trend: Trend | None
    detectors: dict[str, Any] = field(default_factory=dict)
    advice: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready values."""
        out = asdict(self)
        out["trend"] = self.trend.to_dict() if self.trend else None
        if self.last_value is not None and not math.isfinite(self.last_value):
            out["last_value"] = repr(self.last_value)
        return out


@dataclass
class StagnantClass:
    """One class that has not learned."""

    index: int
    name: str
    ref: float
    now: float

    @property
    def change(self) -> float:
        """Relative change of its loss since the reference window."""
        return self.now / self.ref - 1.0 if self.ref else 0.0


@dataclass
class StagnantReport:
    """The stagnant classes of one per-class key at the end of the run."""

    key: str
    rank: int
    step: int
    total_change: float
    classes: list[StagnantClass]

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready values."""
        return {
            "key": self.key,
            "rank": self.rank,
            "step": self.step,
            "total_change": self.total_change,
            "classes": [{**asdict(c), "change": c.change} for c in self.classes],
        }


@dataclass
class EventRecord:
    """An event found by the analysis, with the rank it belongs to."""

    rank: int
    event: Event

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready values."""
        e = self.event
        return {
            "rank": self.rank,
            "step": e.step,
            "key": e.key,
            "kind": e.kind,
            "severity": e.severity,
            "message": e.message,
            "status": e.status,
            "data": e.data,
        }


@dataclass
class Analysis:
    """The loss analysis of one run."""

    run_id: str
    project: str | None
    name: str | None
    status: str | None
    keys: list[KeyReport]
    events: list[EventRecord]
    stagnant: list[StagnantReport]
    settings: dict[str, Any] = field(default_factory=dict)
    findings: list[EventRecord] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    unit: str = "step"  # what the run's steps are: "epoch" for an imported history

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready values (what ``tracker analyze --format json`` prints)."""
        return {
            "run_id": self.run_id,
            "project": self.project,
            "name": self.name,
            "status": self.status,
            "findings": [e.to_dict() for e in self.findings],
            "keys": [k.to_dict() for k in self.keys],
            "events": [e.to_dict() for e in self.events],
            "stagnant": [s.to_dict() for s in self.stagnant],
            "settings": self.settings,
            "unit": self.unit,
            "environment": {"gpus": self.environment.get("gpus", [])},
        }


def verdict(
    steps: np.ndarray, values: np.ndarray, summary: dict[str, Any], params: dict[str, Any], unit: str = "step"
) -> tuple[str, str, Trend | None]:
    """(verdict, reason, trend) for one curve given its detectors' end states.

    ``unit`` (``step`` or ``epoch``) names the steps in the reason; a curve of fewer
    than 1000 points gives its slope per step, a longer one per 1000 steps.
    """
    finite = np.isfinite(values)
    n = int(finite.sum())
    if n < int(params["min_points"]):
        return "too short to tell", f"{n} finite points; at least {params['min_points']} are needed", None
    keep = max(int(math.ceil(n * float(params["recent"]))), 8)
    fs, fv = steps[finite][-keep:], values[finite][-keep:]
    found = trend(fs, fv, int(params["max_points"]), float(params["alpha"]))
    since = f"over {unit}s {int(fs[0])}-{int(fs[-1])}"
    if not np.any(values[finite]):
        return "plateaued", f"exactly 0 at every {unit}", found
    if summary.get("non_finite_active"):
        return "diverging", f"the loss is NaN/inf from step {summary.get('non_finite_since')} to the end", found
    if summary.get("diverged"):
        return "diverging", "the divergence detector flagged it and it has not recovered", found
    if summary.get("plateaued"):
        step = summary.get("last_improvement_step")
        return "plateaued", f"no improvement of its smoothed best since step {step}", found
    if found is None:
        return "too short to tell", "too few points for the trend test", None
    per = found.relative_slope / 1000
    rate = f"{per:+.2%} per {unit}" if n < 1000 else f"{found.relative_slope:+.1%} per 1000 steps"
    pct = f"{rate}, confidence {found.confidence:.3f}"
    if found.direction == "decreasing":
        return "converging", f"falling {since} ({pct})", found
    if found.direction == "increasing":
        return "diverging", f"rising {since} ({pct})", found
    return "plateaued", f"no significant trend {since} ({pct})", found
