"""The epoch judge ``overfitting``: a validation loss rising from its minimum while its train twin falls.

The rule is the corpus' written label definition (``tests/data/real_runs/manifest.toml``,
"Label definitions", 1) with the gates below added, applied to the history *as it stands*: the whole of a
finished run, what has been logged so far of a running one. For a validation loss
``V`` with a train twin ``T`` (same name after ``val/`` and ``train/``):

* ``V`` has ``min_points`` finite points; on its centred running median of 3 (a
  one-epoch dip is no minimum; the ends are kept), ``b`` is the point of its
  minimum, with at least ``patience`` points after it;
* the median of the last ``window`` smoothed points is ``min_rise`` above ``V(b)``
  (the end rise, 10%), the median of *every* smoothed point after ``b`` is
  ``settled`` above it (a lasting rise, 5%: a late two-epoch blip is none), and that
  median's rise is at least ``give_back`` of ``V``'s smoothed range (5%: a loss that
  fell from 1.57 to 0.01 and wanders by 0.05 has given nothing back);
* ``T``'s median after ``b`` is ``train_drop`` below ``T`` at ``b`` (5%);
* ``V``'s median is at least ``min_share`` of the mean of the medians of the run's
  validation losses that have twins (half: a term tiny in the run's own scale);
* the validation set has targets: not every metric 0 at every point together with a
  validation loss exactly 0 throughout beside a train twin that is not;
* optional gates, off by default since the definition has none: ``metric_gain``
  (the run's fitness more than ``1 + metric_gain`` times its best up to ``b``: the
  minimum came before the model had learnt) and ``min_val_size`` (an accuracy's 1/N
  steps say the validation set has fewer images).

Of several validation losses that qualify, the one with the largest lasting rise is
the finding's key (the definition's choice). ``b`` is the **best epoch**, the onset
is the point after it. The finding's step is the first point at which the history
*as it stood then* met the same rule with the same minimum: on a finished run, the
lead a watcher of the run would have had had they asked then. A running run's
verdict can change as it goes on (a new minimum undoes it), and a finished run's
verdict reads its whole curve.

``confidence`` says how sure the rise is given how many points it rests on and how
noisy ``V`` is: ``Phi(z)``, ``z`` the lasting rise over its standard error,
``1.25 sigma sqrt(1/n + 1/3)`` (the median of the ``n`` points after ``b`` against
the median of 3 at ``b``), ``sigma`` the robust scale of ``V``'s point-to-point
changes (``1.4826 MAD / sqrt 2``). ``min_confidence`` (default 0.9) gates on it.
The last gates are not in the written definition: they were set on the labels
read by eye (``tests/data/real_runs/eye-labels.toml``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tracker.analysis.detectors import StreamContext, fmt
from tracker.analysis.epoch_judges import _event, _fitness, _metric_above_zero, _pct, _smooth, _val_size
from tracker.analysis.epochs import History
from tracker.events import Event


@dataclass
class Rise:
    """What the rule found on one validation loss: its minimum and the rise after it."""

    val: str
    train: str
    b: int  # index of the minimum among V's finite points
    best_step: int
    onset: int
    best: float
    settled: float  # rise of the median of every smoothed point after b
    end: float  # rise of the median of the last ``window`` smoothed points
    train_change: float
    n_after: int
    confidence: float


def _noise(v: np.ndarray) -> float:
    """Robust scale of the point-to-point noise of ``v`` (1.4826 MAD of its differences / sqrt 2)."""
    d = np.diff(v)
    if d.size < 2:
        return 0.0
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2.0))


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _near(ts: np.ndarray, tv: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``T``'s points in ``(lo, hi]``, else its last point at or before ``hi``."""
    part = tv[(ts > lo) & (ts <= hi)]
    if part.size == 0:
        part = tv[ts <= hi][-1:]
    return part


class Overfitting:
    """The label definition of overfitting on the history as it stands (module doc)."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.min_points, self.patience, self.window = int(p["min_points"]), int(p["patience"]), int(p["window"])
        self.min_rise, self.settled, self.give_back = float(p["min_rise"]), float(p["settled"]), float(p["give_back"])
        self.train_drop, self.metric_gain = float(p["train_drop"]), float(p["metric_gain"])
        self.min_val_size, self.min_confidence = float(p["min_val_size"]), float(p["min_confidence"])
        self.min_share = float(p["min_share"])

    def judge(self, history: History) -> list[Event]:
        """The overfitting event, if any (one per history: the largest lasting rise)."""
        pairs = [(v, history.counterpart(v)) for v in history.val_losses]
        pairs = [(v, str(t)) for v, t in pairs if t is not None and v in history.series and t in history.series]
        if not pairs or history.steps.size < self.min_points:
            return []
        size = _val_size(history)
        if size is not None and size < self.min_val_size:
            return []
        if self._no_targets(history):
            return []
        pairs = self._material(history, pairs)
        rises = [r for r in (self.assess(history, v, t) for v, t in pairs) if r is not None]
        rises = [r for r in rises if not self._still_improving(history, r.best_step)]
        if not rises:
            return []
        rise = max(rises, key=lambda r: r.settled)
        return [self._found(history, rise, self._first_step(history, rise))]

    def _material(self, h: History, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The pairs whose validation loss is at least ``min_share`` of the mean of the run's validation
        losses (medians): a term tiny in the run's own scale is left out."""
        if self.min_share <= 0 or len(pairs) < 2:
            return pairs
        values = {v: h.finite(v)[1] for v, _ in pairs}
        level = {v: float(np.median(x)) if x.size else 0.0 for v, x in values.items()}
        mean = sum(x for x in level.values() if x > 0) / len(pairs)
        return [(v, t) for v, t in pairs if mean > 0 and level[v] >= self.min_share * mean]

    @staticmethod
    def _no_targets(h: History) -> bool:
        """Whether the validation set has no targets: every metric 0 at every point, and a validation loss
        exactly 0 throughout while its train twin is not (``zero_loss`` says so); its losses then measure
        nothing a model could overfit to."""
        if not h.metrics or _metric_above_zero(h, int(h.steps[0])):
            return False
        for v in h.val_losses:
            t = h.counterpart(v)
            if t is None or v not in h.series or t not in h.series:
                continue
            val, train = h.finite(v)[1], h.finite(str(t))[1]
            if val.size and np.all(val == 0) and np.any(train != 0):
                return True
        return False

    def assess(self, h: History, val: str, train: str, upto: int | None = None) -> Rise | None:
        """The rule on ``val`` and ``train`` as they stood at step ``upto`` (the last step when None)."""
        s, v = h.finite(val)
        ts, tv = h.finite(train)
        if upto is not None:
            s, v = s[s <= upto], v[s <= upto]
            ts, tv = ts[ts <= upto], tv[ts <= upto]
        if v.size < self.min_points or tv.size == 0:
            return None
        sm = _smooth(v)
        b = int(np.argmin(sm))
        best, after = float(sm[b]), sm[b + 1:]
        if after.size < self.patience or best <= 0:
            return None
        settled, end = float(np.median(after)), float(np.median(after[-self.window:]))
        if settled < (1 + self.settled) * best or end < (1 + self.min_rise) * best:
            return None
        if settled - best < self.give_back * (float(sm.max()) - best):
            return None
        at_b = _near(ts, tv, float(s[b - 1]) if b else -math.inf, float(s[b]))
        later = tv[ts > s[b]]
        if at_b.size == 0 or later.size == 0 or not float(np.median(at_b)) > 0:
            return None
        t_b = float(np.median(at_b))
        t_change = float(np.median(later)) / t_b - 1.0
        if t_change >= -self.train_drop:
            return None
        sigma = _noise(v)
        se = 1.2533 * sigma * math.sqrt(1.0 / after.size + 1.0 / 3.0)
        conf = _phi((settled - best) / se) if se > 0 else 1.0
        if conf < self.min_confidence:
            return None
        return Rise(val, train, b, int(s[b]), int(s[b + 1]), best, settled / best - 1.0, end / best - 1.0,
                    t_change, int(after.size), conf)

    def _first_step(self, h: History, rise: Rise) -> int:
        """The first step at which the history as it stood met the rule with this minimum."""
        s, _ = h.finite(rise.val)
        for step in s[rise.b + self.patience:]:
            then = self.assess(h, rise.val, rise.train, int(step))
            if then is not None and then.best_step == rise.best_step:
                return int(step)
        return int(s[-1])

    def _still_improving(self, h: History, best_step: int) -> bool:
        """Whether the fitness (or first metric) is more than ``1 + metric_gain`` times its best up to ``best_step``."""
        if self.metric_gain <= 0:
            return False
        fit = _fitness(h)
        if fit is None:
            return False
        s, v = fit
        before, after = v[s <= best_step], v[s > best_step]
        if before.size == 0 or after.size == 0:
            return False
        top = float(before.max())
        return float(np.median(after[-self.window:])) > top + self.metric_gain * max(abs(top), 1e-9)

    def _found(self, h: History, r: Rise, step: int) -> Event:
        s, v = h.finite(r.val)
        last = int(s[-1])
        end = float(v[-1]) / r.best - 1.0
        how = (f"at the end ({h.when(last)}) it is {_pct(end)} from that minimum" if end > 0
               else f"it fell back below that minimum by {h.when(last)}")
        last_n = f"its last {h.unit}" if self.window == 1 else f"its last {self.window} {h.unit}s"
        msg = (f"{r.val} (running median of 3) is lowest at {h.when(r.best_step)} ({fmt(r.best)}); since then its "
               f"median is {_pct(r.settled)} above it and {last_n} {_pct(r.end)}, while "
               f"{r.train} moved {_pct(r.train_change)}: overfitting since {h.when(r.onset)}, clear by "
               f"{h.when(step)}; the best {h.unit} is {r.best_step}; {how}")
        return _event(h, "overfitting", r.val, step, "warning", msg, onset=r.onset, best_step=r.best_step,
                      train_key=r.train, rise=r.end, settled_rise=r.settled, train_change=r.train_change,
                      points_after=r.n_after, confidence=r.confidence, best=r.best, end_change=end)
