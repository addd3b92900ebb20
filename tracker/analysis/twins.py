"""Overfitting, online: a validation loss rising from its best while its train twin falls.

Scope ``twins``: one stream per analyzer sees every analysed key (``feed(key,
chunk)``), so it can judge a validation loss against its train twin
(``val/box_loss`` and ``train/box_loss``, ``val_loss`` and ``loss``: named as
:func:`tracker.analysis.epochs.base_name` says). Keys may arrive in any order and
chunking (offline, ``tracker analyze`` feeds them one key at a time), so a decision
at a validation point waits until the train twin has reached its step; the events
are the same either way.

``twin_overfitting`` judges causally while the run trains (defaults in
:mod:`tracker.analysis.builtin`; the epoch judge ``overfitting`` of
:mod:`tracker.analysis.epoch_overfit` reads a finished run's whole curve instead),
at each point ``e`` of a validation loss ``V``, ``b`` the point of its minimum so
far:

* ``V`` has ``min_points`` points, ``patience`` of them since ``b`` and, where the
  config plans the run's epochs (``epochs``, ``max_epochs``, ...), ``lasting`` of
  those planned epochs as points since ``b``, at most the config's early-stopping
  ``patience`` (a rise must last a tenth of the run: an early dip amid a noisy
  descent that comes back is no minimum); the median of
  its last ``window`` points is ``min_rise`` above ``V(b)``; Mann-Kendall finds it
  rising over ``[b, e]`` (p < ``alpha``);
* the train twin's mean over the validation interval ending at ``b`` fell at least
  ``train_drop`` to the median of its means over the last ``window`` intervals.
  The twin's means come from its running sums, kept at every point for its first
  8,192 points and at every 64th after (an interval's ends move by at most 63 points
  of a long per-batch curve).

Unlike the epoch judge it reads loss keys only (the analysed keys): no fitness gate
(an mAP still rising) and no learning-rate warmup gate. One event per validation key.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tracker.analysis.advice import ADVICE
from tracker.analysis.detectors import KeyedChunk, StreamContext, clean, fmt
from tracker.analysis.epochs import EPOCHS_KEYS, base_name, config_count, is_val
from tracker.analysis.trend import mann_kendall
from tracker.events import Event

DENSE = 8192  # running sums kept at every point up to here
STRIDE = 64  # and at every STRIDE-th point after


class _Sums:
    """Running sums of a train key's finite values at kept points: step, count, sum."""

    def __init__(self) -> None:
        self.steps: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []
        self.sums: list[np.ndarray] = []
        self.n = 0
        self.total = 0.0
        self.last_step: int | None = None
        self._cat: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def update(self, steps: np.ndarray, x: np.ndarray) -> None:
        if x.size == 0:
            return
        idx = self.n + np.arange(1, x.size + 1)
        cum = self.total + np.cumsum(x)
        keep = (idx <= DENSE) | (idx % STRIDE == 0)
        self.steps.append(steps[keep])
        self.counts.append(idx[keep])
        self.sums.append(cum[keep])
        self.n, self.total, self.last_step = int(idx[-1]), float(cum[-1]), int(steps[-1])
        self._cat = None

    def at(self, step: int) -> tuple[int, float]:
        """(count, sum) at the last kept point with step <= ``step`` ((0, 0) before the first)."""
        if self._cat is None:
            self._cat = (np.concatenate(self.steps), np.concatenate(self.counts), np.concatenate(self.sums))
            self.steps, self.counts, self.sums = [self._cat[0]], [self._cat[1]], [self._cat[2]]
        s, c, v = self._cat
        i = int(np.searchsorted(s, step, side="right")) - 1
        return (int(c[i]), float(v[i])) if i >= 0 else (0, 0.0)


class _Val:
    """A validation key's points and its decision state."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.values: list[float] = []
        self.means: list[float] = []  # the train twin's mean over each interval, once known
        self.reported = False


class TwinOverfitting:
    """Overfitting judged while the run trains (module doc); scope ``twins``."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.min_points, self.patience, self.window = int(p["min_points"]), int(p["patience"]), int(p["window"])
        self.min_rise, self.alpha, self.train_drop = float(p["min_rise"]), float(p["alpha"]), float(p["train_drop"])
        planned, stop = config_count(ctx.config, EPOCHS_KEYS), config_count(ctx.config, ("patience",))
        lasting = float(p["lasting"]) * planned if planned else 0.0
        if stop:  # never longer than the trainer's own early-stopping patience (epochs=5000, patience=50)
            lasting = min(lasting, stop)
        self.since = max(self.patience, int(np.ceil(lasting)))  # points after the minimum before judging
        self.vals: dict[str, _Val] = {}
        self.trains: dict[str, _Sums] = {}

    def feed(self, item: KeyedChunk) -> list[Event]:
        """Overfitting events decided once ``chunk`` of ``key`` is in."""
        key, chunk = item.key, item.chunk
        if "loss" not in key.lower():
            return []
        x, steps = chunk.fvalues, chunk.fsteps
        if is_val(key):
            val = self.vals.setdefault(key, _Val())
            val.steps.extend(steps.tolist())
            val.values.extend(x.tolist())
            found = self._decide(key)
            return [found] if found is not None else []
        self.trains.setdefault(key, _Sums()).update(steps, x)
        name = base_name(key).lower()
        events = []
        for vkey in self.vals:
            if base_name(vkey).lower() == name:
                found = self._decide(vkey)
                if found is not None:
                    events.append(found)
        return events

    def _twin(self, vkey: str) -> str | None:
        name = base_name(vkey).lower()
        return next((k for k in self.trains if base_name(k).lower() == name), None)

    def _decide(self, vkey: str) -> Event | None:
        """Judge the validation points whose interval the train twin has covered."""
        val = self.vals[vkey]
        tkey = self._twin(vkey)
        if tkey is None or val.reported:
            return None
        sums = self.trains[tkey]
        while len(val.means) < len(val.steps) and sums.last_step is not None \
                and sums.last_step >= val.steps[len(val.means)]:
            i = len(val.means)
            c1, s1 = sums.at(val.steps[i])
            c0, s0 = sums.at(val.steps[i - 1]) if i else (0, 0.0)
            val.means.append((s1 - s0) / (c1 - c0) if c1 > c0 else float("nan"))
            found = self._judge(vkey, tkey, i)
            if found is not None:
                val.reported = True
                return found
        return None

    def _judge(self, vkey: str, tkey: str, e: int) -> Event | None:
        v = np.asarray(self.vals[vkey].values[: e + 1])
        if v.size < self.min_points:
            return None
        b = int(np.argmin(v))
        best = float(v[b])
        if e - b < self.since or best <= 0:
            return None
        rise = float(np.median(v[-self.window:])) / best - 1.0
        if rise < self.min_rise or not v[-1] > best:
            return None
        _, _, _, p = mann_kendall(v[b:])
        if not p < self.alpha:
            return None
        means = np.asarray(self.vals[vkey].means[: e + 1])
        then, now = float(means[b]), float(np.nanmedian(means[-self.window:]))
        if not (then > 0 and np.isfinite(now)):
            return None
        fell = now / then - 1.0
        if fell > -self.train_drop:
            return None
        steps = self.vals[vkey].steps
        best_step, onset, step = steps[b], steps[b + 1], steps[e]
        advice = ADVICE["overfitting"]
        return Event(
            step=step, kind="overfitting", key=vkey, severity="warning",
            message=(f"{vkey} has risen {rise:+.0%} above its minimum {fmt(best)} (step {best_step}) while {tkey} "
                     f"moved {fell:+.0%}: overfitting since step {onset}; the best step is {best_step}; {advice}"),
            data=clean({"onset": onset, "best_step": best_step, "best": best, "rise": rise, "train_key": tkey,
                        "train_change": fell, "confidence": 1.0 - p, "advice": advice}),
        )

    def summary(self) -> dict[str, Any]:
        """Validation keys reported."""
        return {"overfitting_keys": sorted(k for k, v in self.vals.items() if v.reported)}
