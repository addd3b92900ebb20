"""Trend of a loss curve: Mann–Kendall test with tie correction and Sen's slope.

Rules:

* The test runs on the downsampled curve (:func:`tracker.analysis.smoothing.bucket_medians`,
  at most ``max_points`` buckets, 500 by default): bucket medians smooth the curve
  and, unlike an EMA, keep the noise of different buckets independent, which the
  test's confidence assumes. The O(n^2) pair statistics are computed vectorised on
  those few hundred points, never on the raw curve.
* ``S = sum_{i<j} sign(x_j - x_i)``; its variance is corrected for ties,
  ``Var S = (n(n-1)(2n+5) - sum_t t(t-1)(2t+5)) / 18``; ``Z`` uses the continuity
  correction ``(S - sign(S)) / sqrt(Var S)``; the p-value is two-sided and the
  confidence is ``1 - p``. Kendall's tau is ``S / (n(n-1)/2)``.
* Sen's slope is the median of the pairwise slopes ``(x_j - x_i) / (t_j - t_i)``, in
  loss units per step; ``relative_slope`` is that slope times 1000 steps divided
  by the median level, i.e. the fraction the loss moves per 1000 steps.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tracker.analysis.smoothing import bucket_medians

MIN_POINTS = 8


@dataclass
class Trend:
    """The Mann–Kendall / Sen's slope summary of one curve."""

    n: int
    s: float
    z: float
    p_value: float
    confidence: float
    tau: float
    slope: float
    relative_slope: float
    direction: str  # "decreasing" | "increasing" | "none"

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready values."""
        return {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in asdict(self).items()}


def _pairs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    i, j = np.triu_indices(values.size, k=1)
    return i, j


def mann_kendall(values: np.ndarray) -> tuple[float, float, float, float]:
    """Return ``(S, Var S, Z, two-sided p)`` for ``values`` (finite, in time order)."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n < 3:
        return 0.0, 0.0, 0.0, 1.0
    diff = x[None, :] - x[:, None]
    s = float(np.sign(np.triu(diff, k=1)).sum())
    _, counts = np.unique(x, return_counts=True)
    ties = counts[counts > 1].astype(np.float64)
    var = (n * (n - 1) * (2 * n + 5) - float(np.sum(ties * (ties - 1) * (2 * ties + 5)))) / 18.0
    if var <= 0:
        return s, var, 0.0, 1.0
    z = (s - math.copysign(1.0, s)) / math.sqrt(var) if s != 0 else 0.0
    p = math.erfc(abs(z) / math.sqrt(2.0))
    return s, var, z, p


def sens_slope(times: np.ndarray, values: np.ndarray) -> float:
    """Median of the pairwise slopes (pairs with equal times are left out)."""
    t = np.asarray(times, dtype=np.float64)
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return 0.0
    i, j = _pairs(x)
    dt = t[j] - t[i]
    keep = dt != 0
    if not keep.any():
        return 0.0
    return float(np.median((x[j] - x[i])[keep] / dt[keep]))


def trend(steps: np.ndarray, values: np.ndarray, max_points: int = 500, alpha: float = 0.01) -> Trend | None:
    """Trend of the curve, or None when it has fewer than ``MIN_POINTS`` finite points."""
    xs, ys = bucket_medians(np.asarray(steps), np.asarray(values), max_points)
    n = ys.size
    if n < MIN_POINTS:
        return None
    s, _, z, p = mann_kendall(ys)
    slope = sens_slope(xs, ys)
    level = float(np.median(np.abs(ys)))
    relative = slope * 1000.0 / level if level > 0 else 0.0
    direction = "none"
    if p < alpha:
        direction = "decreasing" if s < 0 else "increasing"
    return Trend(
        n=int(n),
        s=s,
        z=float(z),
        p_value=float(p),
        confidence=float(1.0 - p),
        tau=float(s / (n * (n - 1) / 2.0)),
        slope=slope,
        relative_slope=float(relative),
        direction=direction,
    )
