"""Spikes: single-point outliers above the smoothed curve, judged by a robust scale.

The state (EMA, block scale, the last point, a candidate waiting for its next
point) is kept between chunks, so the same spikes are found whatever the chunking.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tracker.analysis.detectors import Chunk, RateLimit, StreamContext, clean, fmt
from tracker.analysis.smoothing import MAD_TO_SIGMA, BlockMedian, Ema
from tracker.events import Event

SpikeRecord = tuple[int, int, float, float, float, float]
"""A confirmed or pending spike: global index, step, value, baseline, quiet band, scale."""


class Spike:
    """A single-point outlier above the smoothed curve, judged by a robust scale.

    Log residual ``r = ln(x / s_prev)`` against the EMA before the point (loss noise
    is multiplicative: it grows with the loss and its upper tail is long, which the
    log makes symmetric); scale ``1.4826 * median |r|`` of the previous block of
    points; a candidate has ``r > width = max(threshold * scale, ln(1 + min_rise))``.
    Only positive values can be spikes. A candidate is a spike when its neighbours
    are quiet: both the point before and the point after stay under ``s_prev *
    exp(width / 2)`` (so a level shift, a run of high values or a divergence is not
    a spike). Events are rate limited (``cooldown``, ``budget``).
    """

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.key = ctx.key
        self.ema = Ema(float(p["smoothing"]))
        self.scale = BlockMedian()
        self.threshold = float(p["threshold"])
        self.log_rise = math.log1p(float(p["min_rise"]))
        self.limit = RateLimit(int(p["cooldown"]), int(p["budget"]))
        self.last_s = math.nan
        self.last_x = math.nan
        self.pending: SpikeRecord | None = None
        self.spikes = 0

    def feed(self, chunk: Chunk) -> list[Event]:
        """Spike events confirmed by ``chunk`` (a spike on its last point waits for the next)."""
        x, steps = chunk.fvalues, chunk.fsteps
        n = x.size
        if n == 0:
            return []
        base = self.ema.count
        s = self.ema.update(x)
        s_prev = np.concatenate(([self.last_s], s[:-1]))
        positive = (x > 0) & (s_prev > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            resid = np.log(x / s_prev)
        if not positive.all():
            resid[~positive] = 0.0
        scale = MAD_TO_SIGMA * self.scale.update(np.abs(resid))
        width = np.maximum(self.threshold * scale, self.log_rise)
        cand = positive & (resid > width)
        quiet = s_prev * np.exp(0.5 * width)
        prev_ok = np.concatenate(([self.last_x], x[:-1])) <= quiet
        next_ok = np.concatenate((x[1:] <= quiet[:-1], [False]))

        def record(i: int) -> SpikeRecord:
            return (base + i, int(steps[i]), float(x[i]), float(s_prev[i]), float(quiet[i]), float(scale[i]))

        found: list[SpikeRecord] = []
        if self.pending is not None:
            if x[0] <= self.pending[4]:
                found.append(self.pending)
            self.pending = None
        spikes = cand & prev_ok
        found.extend(record(i) for i in np.flatnonzero(spikes[:-1] & next_ok[:-1]).tolist())
        if spikes[-1]:
            self.pending = record(n - 1)
        self.last_x = float(x[-1])
        self.last_s = float(s[-1])
        self.spikes += len(found)
        picked, skipped = self.limit.pick(np.array([f[0] for f in found], dtype=np.float64))
        return [self._event(found[k], skip) for k, skip in zip(picked, skipped)]

    def _event(self, spike: SpikeRecord, skipped: int) -> Event:
        _, step, value, baseline, _, scale = spike
        z = math.log(value / baseline) / scale if scale > 0 else math.inf
        ratio = value / baseline if baseline > 0 else math.inf
        return Event(
            step=step,
            kind="spike",
            key=self.key,
            severity="warning",
            message=(
                f"{self.key} spiked to {fmt(value)} at step {step}, {ratio:.1f}x its smoothed value "
                f"{fmt(baseline)} ({z:.0f} robust SDs) and came back; check that step's batch, "
                "and clip gradients if spikes recur"
            ),
            data=clean(
                {
                    "value": value,
                    "baseline": baseline,
                    "scale": scale,
                    "z": z,
                    "ratio": ratio,
                    "spikes_skipped": skipped,
                }
            ),
        )

    def summary(self) -> dict[str, Any]:
        """How many spikes were found (reported or rate limited)."""
        return {"spikes": self.spikes}
