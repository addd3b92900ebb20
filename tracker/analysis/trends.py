"""Divergence and plateau: both judge the smoothed curve against its best so far.

Both smooth the finite values of a key with the trailing median of ``median``
points followed by TensorBoard's debiased EMA (:mod:`tracker.analysis.smoothing`),
and keep every piece of state between chunks, so they decide the same events
whatever the chunking (see :mod:`tracker.analysis.detectors`).

Both judge a curve against its own *starting scale*: the median of its first
``min(warmup, 50)`` finite points (:class:`StartScale`; at least one). A loss that
has fallen to a tiny fraction of where it began and wobbles there (a classifier at
1e-5 whose batches swing 2x) is converged: relative changes of such values are
large and mean nothing. So a divergence must also rise by ``floor`` times the
starting scale, and a plateau is only a plateau while its best is still above
``converged`` times the starting scale (stopped improving while still high).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tracker.analysis.detectors import TINY, Chunk, StreamContext, clean, fmt, run_lengths
from tracker.analysis.smoothing import BlockMedian, Ema, RollingMedian
from tracker.events import Event


HEAD = 50  # at most this many first points make the starting scale


class StartScale:
    """The median of a stream's first ``n`` finite points, ``n = clip(warmup, 1, HEAD)``; NaN until they are in.

    ``update(x)`` takes the next finite values and returns the scale for each of them:
    NaN for the first ``n - 1``, the (fixed) median from the ``n``-th on, so it is the
    same whatever the chunking.
    """

    def __init__(self, warmup: int) -> None:
        self.n = max(1, min(int(warmup), HEAD))
        self.head: list[float] = []
        self.value = math.nan
        self.count = 0

    def update(self, x: np.ndarray) -> np.ndarray:
        """The scale at each of the next values ``x``."""
        base = self.count
        self.count += x.size
        if len(self.head) < self.n:
            self.head.extend(x[: self.n - len(self.head)].tolist())
            if len(self.head) == self.n:
                self.value = float(np.median(np.abs(np.asarray(self.head))))
        return np.where(np.arange(base, base + x.size) >= self.n - 1, self.value, math.nan)


def _onset(steps: np.ndarray, pos: int, rel: int, length: int, before: int | None) -> int | None:
    """Step where a run of ``length`` points ending at ``pos + rel`` began (``before`` if earlier)."""
    start = rel - length + 1
    return int(steps[pos + start]) if start >= 0 else before


class Divergence:
    """The smoothed loss rises well above its running best and stays there.

    Smoothed value ``s`` (debiased EMA of the trailing median of ``median`` points, so
    a single huge spike cannot pass for a divergence), running best ``b`` (minimum of ``s`` after
    ``warmup`` points), margin ``m = max((factor - 1) * |b|, min_delta, floor * scale)``
    with ``scale`` the curve's starting scale (module doc). Diverged
    once ``s > b + m`` for ``patience`` points in a row (event, status ``diverged``);
    recovered once ``s <= b + recover * m`` for ``patience`` points in a row (event,
    status ``running``).
    """

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.key = ctx.key
        self.median = RollingMedian(int(p["median"]))
        self.ema = Ema(float(p["smoothing"]))
        self.factor = float(p["factor"])
        self.patience = int(p["patience"])
        self.warmup = int(p["warmup"])
        self.recover = float(p["recover"])
        self.min_delta = float(p["min_delta"])
        self.floor = float(p["floor"])
        self.scale = StartScale(self.warmup)
        self.best = math.inf
        self.best_step: int | None = None
        self.diverged = False
        self.run = 0
        self.run_start: int | None = None
        self.smoothed = math.nan
        self.divergences = 0

    def feed(self, chunk: Chunk) -> list[Event]:
        """Divergence and recovery events decided by ``chunk``."""
        x, steps = chunk.fvalues, chunk.fsteps
        n = x.size
        if n == 0:
            return []
        s = self.ema.update(self.median.update(x))
        floor = np.nan_to_num(self.floor * self.scale.update(x), nan=0.0)
        eligible = np.arange(self.ema.count - n, self.ema.count) >= self.warmup
        se = np.where(eligible, s, np.inf)
        best = np.minimum.accumulate(np.concatenate(([self.best], se)))
        improved = se < best[:-1]
        best = best[1:]
        last_new = np.maximum.accumulate(np.where(improved, np.arange(n), -1))
        margin = np.maximum(np.maximum((self.factor - 1.0) * np.abs(best), self.min_delta), floor)
        exceed = eligible & (s > best + margin)
        back = eligible & (s <= best + self.recover * margin)
        ctx = (steps, s, best, last_new)
        events: list[Event] = []
        pos = 0
        while pos < n:
            cond = (back if self.diverged else exceed)[pos:]
            lengths = run_lengths(cond, self.run)
            hits = np.flatnonzero(lengths >= self.patience)
            if hits.size == 0:
                last = int(lengths[-1])
                if last == 0:
                    self.run_start = None
                elif last <= cond.size:
                    self.run_start = int(steps[pos + cond.size - last])
                self.run = last
                break
            j = int(hits[0])
            onset = _onset(steps, pos, j, int(lengths[j]), self.run_start)
            events.append(self._event(ctx, pos + j, onset))
            self.diverged = not self.diverged
            self.run, self.run_start = 0, None
            pos += j + 1
        self.best = float(best[-1])
        if last_new[-1] >= 0:
            self.best_step = int(steps[last_new[-1]])
        self.smoothed = float(s[-1])
        return events

    def _event(self, ctx: tuple[np.ndarray, ...], i: int, onset: int | None) -> Event:
        steps, s, best, last_new = ctx
        step, value, b = int(steps[i]), float(s[i]), float(best[i])
        best_step = int(steps[last_new[i]]) if last_new[i] >= 0 else self.best_step
        ratio = value / b if b > 0 else math.inf
        data = clean(
            {
                "smoothed": value,
                "best": b,
                "best_step": best_step,
                "ratio": ratio,
                "onset_step": onset,
                "factor": self.factor,
                "patience": self.patience,
                "start_scale": self.scale.value,
            }
        )
        if not self.diverged:
            self.divergences += 1
            return Event(
                step=step,
                kind="divergence",
                key=self.key,
                severity="error",
                status="diverged",
                data=data,
                message=(
                    f"{self.key} is diverging: smoothed {fmt(value)} at step {step} is {ratio:.2f}x its best "
                    f"{fmt(b)} (step {best_step}), above it since step {onset}; lower the learning rate, "
                    "lengthen the warmup or clip gradients"
                ),
            )
        return Event(
            step=step,
            kind="recovery",
            key=self.key,
            severity="info",
            status="running",
            data=data,
            message=f"{self.key} recovered: smoothed {fmt(value)} at step {step} is back near its best {fmt(b)}",
        )

    def summary(self) -> dict[str, Any]:
        """State at the end: diverged or not, the best and the last smoothed value."""
        return {
            "diverged": self.diverged,
            "divergences": self.divergences,
            "best_smoothed": self.best if math.isfinite(self.best) else None,
            "best_step": self.best_step,
            "smoothed": self.smoothed if math.isfinite(self.smoothed) else None,
        }


class Plateau:
    """No improvement of the smoothed best over a window.

    The reference best ``b`` improves when the smoothed value ``s`` (debiased EMA of
    the trailing median of ``median`` points, after ``warmup`` points) falls below
    ``b - max(min_delta * |b|, noise_z * sd_d, min_abs)``, where ``sd_d`` is the SD
    of the difference of two smoothed values of pure noise when ``b`` was set:
    ``sqrt(2)`` times the relative noise of the raw points (from the median
    absolute difference of consecutive points over the previous block, so no best
    counts before the first block of 256 points is complete) times
    ``sqrt((1 - w) / (1 + w))`` times ``|b|``. A noisy flat curve thus cannot
    "improve" on its own noise. A plateau is reported, once per reference, at the
    first point at least ``window`` points after the last improvement where ``s`` is
    still within ``max_rise * |b|`` of ``b`` (a curve that rises instead is
    diverging, not flat) and ``b`` is still above ``converged`` times the starting
    scale (module doc): a curve that fell below that and stays is converged.
    """

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.key = ctx.key
        weight = float(p["smoothing"])
        self.median = RollingMedian(int(p["median"]))
        self.ema = Ema(weight)
        self.noise = BlockMedian()
        self.smooth_sd = math.sqrt((1.0 - weight) / (1.0 + weight)) / 0.6745
        self.window = int(p["window"])
        self.min_delta = float(p["min_delta"])
        self.noise_z = float(p["noise_z"])
        self.min_abs = float(p["min_abs"])
        self.max_rise = float(p["max_rise"])
        self.warmup = int(p["warmup"])
        self.converged = float(p["converged"])
        self.scale = StartScale(self.warmup)
        self.ref = math.inf
        self.ref_margin = 0.0
        self.ref_index = 0
        self.ref_step: int | None = None
        self.reported = False
        self.plateaus = 0
        self.last_x = math.nan
        self.last_s = math.nan

    def _target(self) -> float:
        if not math.isfinite(self.ref):
            return math.inf
        return self.ref - self.ref_margin

    def feed(self, chunk: Chunk) -> list[Event]:
        """Plateau events decided by ``chunk``."""
        x, steps = chunk.fvalues, chunk.fsteps
        n = x.size
        if n == 0:
            return []
        base = self.ema.count
        s = self.ema.update(self.median.update(x))
        self.scale.update(x)
        s_prev = np.concatenate(([self.last_s], s[:-1]))
        jumps = np.abs(np.diff(np.concatenate(([self.last_x], x)))) / (np.abs(s_prev) + TINY)
        noise = self.noise.update(np.nan_to_num(jumps, nan=0.0)) * self.smooth_sd
        self.last_x, self.last_s = float(x[-1]), float(s[-1])
        eligible = (np.arange(base, base + n) >= self.warmup) & np.isfinite(noise)
        se = np.where(eligible, s, np.inf)
        neg_min = -np.minimum.accumulate(se)
        events: list[Event] = []
        pos = 0
        while True:
            target = self._target()
            if math.isfinite(target):
                j = int(np.searchsorted(neg_min, -target, side="right"))
            else:
                finite = np.isfinite(se)
                j = int(np.argmax(finite)) if finite.any() else n
            j = max(j, pos)
            self._check_plateau(steps, s, base, pos, j, events)
            if j >= n:
                break
            ref = float(s[j])
            sd = float(noise[j]) * abs(ref)
            self.ref_margin = max(self.min_delta * abs(ref), self.noise_z * sd, self.min_abs)
            self.ref, self.ref_index, self.ref_step = ref, base + j, int(steps[j])
            self.reported = False
            pos = j + 1
        return events

    def _check_plateau(self, steps: np.ndarray, s: np.ndarray, base: int, lo: int, hi: int, out: list[Event]) -> None:
        """Report a plateau between chunk positions ``lo`` and ``hi`` if one is due there."""
        if self.reported or not math.isfinite(self.ref) or not self._high():
            return
        start = max(lo, self.ref_index + self.window - base)
        if start >= hi:
            return
        flat = s[start:hi] <= self.ref + self.max_rise * abs(self.ref)
        if not flat.any():
            return
        i = start + int(np.argmax(flat))
        self.reported = True
        self.plateaus += 1
        step = int(steps[i])
        out.append(
            Event(
                step=step,
                kind="plateau",
                key=self.key,
                severity="info",
                message=(
                    f"{self.key} has plateaued: its smoothed best {fmt(self.ref)} (step {self.ref_step}) has not "
                    f"improved by {self.min_delta:.1%} in {base + i - self.ref_index} points; lower the learning "
                    "rate, or stop if this is as good as it gets"
                ),
                data=clean(
                    {
                        "best": self.ref,
                        "best_step": self.ref_step,
                        "smoothed": float(s[i]),
                        "points_since": base + i - self.ref_index,
                        "window": self.window,
                        "min_delta": self.min_delta,
                        "start_scale": self.scale.value,
                    }
                ),
            )
        )

    def _high(self) -> bool:
        """Whether the reference best is still above ``converged`` x the starting scale (not converged)."""
        scale = self.scale.value
        return not math.isfinite(scale) or abs(self.ref) > self.converged * scale

    def summary(self) -> dict[str, Any]:
        """Whether the curve is on a plateau at its end, and since when."""
        since = self.ema.count - 1 - self.ref_index
        flat = self.last_s <= self.ref + self.max_rise * abs(self.ref)
        return {
            "plateaued": bool(math.isfinite(self.ref) and since >= self.window and flat and self._high()),
            "last_improvement_step": self.ref_step,
            "plateaus": self.plateaus,
        }
