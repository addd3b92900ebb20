"""The epoch judges (detector scope ``epochs``): verdicts on few-point histories.

Each judge reads a :class:`~tracker.analysis.epochs.History` and returns at most one
event, at the first step where its evidence sufficed (decided on the history as it
stood then; ``overfitting`` decides on the history as it stands, the whole of a
finished run, and reports the first step at which the history then met its rule
with the same minimum). Every event's ``data`` holds ``onset`` (the step the fault
began), ``confidence`` (0-1), ``advice`` (one line: what to do) and the keys it is
about. Defaults and why are in :mod:`tracker.analysis.epoch_specs`.

* ``overfitting``: in :mod:`tracker.analysis.epoch_overfit` (the corpus' label
  definition on the history as it stands).
* ``metric_collapse``: a metric at zero (<= ``floor``) for the last ``patience``
  points after having been above it, or at zero for the first ``never_patience``
  points and every one since. Decided on the history as it stands (a metric back
  above zero by the last point has not collapsed) and told at the first step the same
  stretch sufficed. A metric whose peak before the fall is below ``min_peak`` was
  never learnt, and one that came back from ``patience`` zeros before (after it had
  first left zero) flickers (a validation set of a few images): neither collapses.
* ``head_never_learnt``: every metric of one head (the ``(P)``, ``(M)``, ``(B)`` suffix
  of Ultralytics' metric names) at zero (<= ``floor``) at every point, ``patience`` of
  them at least, while another head's metrics are above zero: that head never matched
  a validation label (a pose head beside a box head that learns). Decided on the
  history as it stands, told at the first step the head had been at zero ``patience``
  points.
* ``zero_loss``: a loss exactly 0 for ``patience`` points in a row while its twin is
  not: a train loss (no target or positive ever reached it in training) or a
  validation loss (the validation images have no targets: the metrics are 0 too; a
  validation loss at 0 while a metric is above 0 is a term the validation does not
  compute, YOLO26's ``sem_loss``). Every loss of the run at 0 is a finding too (a
  single class, nothing to learn). A loss at 0 whose twin is 0 too, beside other
  losses that are not, is an unused term (YOLO26 ``sem_loss``) and no finding, unless
  every metric is 0 at every point as well and the box loss is among them (a box term
  is never unused): then no target ever reached it (a pose run whose box, pose and DFL
  losses are 0 in training and validation while its class loss is not, batch 7; a
  YOLO26 run that learnt nothing has its ``sem_loss`` at 0 and is no finding). A train loss at 0 with no twin while the other train losses are not
  is a warning, and so is a validation that computes none of its losses (each one 0 or
  not finite at every point while the metrics are above 0: the losses say nothing, an
  Ultralytics 8.0 segmentation run of batch 7). Where that is by design, a YOLOv9 model
  trained by WongKinYiu/yolov9's ``train_dual.py`` (WongKinYiu/yolov9#132), it is an
  info event of kind ``val_losses_absent``, not a zero-loss finding.
* ``stopped_early``: judged at the last point of a run that is not running. The
  config's planned epochs (``epochs``, ``max_epochs``, ...) against the epochs done,
  else the learning-rate schedule, never while it warms up: from the last step of
  its warm-up (:meth:`~tracker.analysis.epochs.History.warmup_end`) the schedule
  needs ``decay_points`` points, and the median of their last ``decay_points - 1``
  steps down says how many steps remain until the rate reaches ``lrf`` (config
  ``lrf``, else the parameter) times its peak; stopped early when at least
  ``min_remaining`` steps and ``min_fraction`` of the schedule remain. Its
  confidence is how constant those steps are. With the config's ``patience``, a
  stop ``patience`` epochs after the best fitness epoch is early stopping (info),
  any other is cut short (warning).
* ``epoch_divergence``: a train loss above ``factor`` times its minimum so far (of its
  running median of 3: a one-epoch dip is no minimum) for
  ``patience`` points in a row, having climbed back at least ``min_span`` of the way
  it had fallen before that minimum (a loss near zero that doubles from 0.03 to 0.06
  after falling from 1.2 is noise, not a divergence). Two gates against what is no
  divergence: the climb must be at least ``min_jump`` times the loss's own noise (the
  median step-to-step change of the points before the climb, where there are at least
  ``noise_points`` of them: a loss that swings 1.1-5.0 from epoch to epoch on an 8-image
  set and reaches 4.8 for two epochs is noise; a pose run of batch 7); and a climb that
  starts once the config's ``close_mosaic`` epochs turned the mosaic off (Ultralytics:
  the last ``close_mosaic`` of ``epochs``) is judged against the minimum since then
  only: the losses step up when the pipeline changes, which is no divergence (batch 8's
  readers, all three).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import numpy as np

from tracker.analysis.advice import ADVICE
from tracker.analysis.detectors import StreamContext, clean, fmt
from tracker.analysis.epochs import ZERO, History, config_value, dual_head, is_val
from tracker.events import Event

Check = Callable[[History], "Event | None"]


def replay(history: History, min_points: int, check: Check) -> list[Event]:
    """The first event ``check`` finds on the history as it stood at each step (none below ``min_points``)."""
    if history.steps.size < min_points:
        return []
    for step in history.steps:
        found = check(history.upto(int(step)))
        if found is not None:
            return [found]
    return []


def _event(h: History, kind: str, key: str | None, step: int, severity: str, message: str, **data: Any) -> Event:
    data.setdefault("advice", ADVICE[kind])
    data["unit"] = h.unit
    return Event(step=int(step), kind=kind, key=key, severity=severity, message=message, data=clean(data))


def _pct(x: float) -> str:
    return f"{x:+.0%}"


class MetricCollapse:
    """A metric that fell to zero and stayed there, or never left it (module doc)."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.min_points, self.patience = int(p["min_points"]), int(p["patience"])
        self.never_patience, self.floor = int(p["never_patience"]), float(p["floor"])
        self.min_peak, self.relative = float(p["min_peak"]), float(p["relative"])

    def judge(self, history: History) -> list[Event]:
        """The collapse event, if any: decided on the history as it stands (a metric back above zero
        by its last point has not collapsed), told at the first step the same zero stretch sufficed."""
        if not history.metrics or history.steps.size < self.min_points:
            return []
        now = self._check(history)
        if now is None:
            return []

        def same_stretch(h: History) -> Event | None:
            then = self._check(h)
            return then if then is not None and then.data.get("onset") == now.data.get("onset") else None

        return replay(history, self.min_points, same_stretch)

    def _flickers(self, zero: np.ndarray, end: int) -> bool:
        """Whether ``zero[:end]`` holds a stretch of ``patience`` zeros after the metric was above zero,
        that a value above zero followed: a metric that came back from zero before (a validation set
        of a few images) says nothing by going to zero again. Zeros before it first left zero (the
        first epochs) are no such stretch."""
        above = np.flatnonzero(~zero[:end])
        run = 0
        for is_zero in zero[int(above[0]) if above.size else end:end]:
            if is_zero:
                run += 1
            else:
                if run >= self.patience:
                    return True
                run = 0
        return False

    def _check(self, h: History) -> Event | None:
        fell, never = [], []
        for key in h.metrics:
            if key not in h.series:
                continue
            s, v = h.finite(key)
            # practically zero: at most ``relative`` of the metric's best so far (0.74 to 0.003-0.03)
            zero = v <= np.maximum(self.floor, self.relative * np.maximum.accumulate(v))
            z = int(np.argmax(~zero[::-1])) if not zero.all() else zero.size
            if z == 0:
                continue
            if z == v.size and z >= self.never_patience:
                never.append((key, int(s[0]), z))
            elif z < v.size and z >= self.patience:
                i = int(np.argmax(v[: v.size - z]))
                if float(v[i]) < self.min_peak or self._flickers(zero, v.size - z):
                    continue
                fell.append((key, int(s[v.size - z]), z, float(v[i]), int(s[i]), float(v[v.size - z:].max())))
        step = int(h.steps[-1])
        if fell:
            key, onset, z, peak, at, top = fell[0]
            others = f" (with {', '.join(k for k, *_ in fell[1:])})" if len(fell) > 1 else ""
            to = "0" if top <= self.floor else f"practically 0 (at most {fmt(top)}, under {self.relative:.0%} of its best)"
            msg = (f"{key}{others} fell from {fmt(peak)} ({h.when(at)}) to {to} at {h.when(onset)} and has stayed "
                   f"there for {z} {h.unit}s")
            return _event(h, "metric_collapse", key, step, "error", msg, onset=onset, keys=[f[0] for f in fell],
                          peak=peak, peak_step=at, since_max=top, confidence=1.0 - 0.5 ** z)
        if never and len(never) == len([k for k in h.metrics if k in h.series]):
            key, onset, z = never[0]
            msg = (f"every metric ({', '.join(k for k, *_ in never)}) has been 0 at every {h.unit} ({z} so far): "
                   "the model predicts nothing the validation labels match")
            return _event(h, "metric_collapse", key, step, "error", msg, onset=onset, keys=[k for k, *_ in never],
                          peak=0.0, confidence=1.0 - 0.5 ** z)
        return None


HEADS = {"B": "box", "M": "mask", "P": "pose", "O": "oriented box"}  # Ultralytics' metric suffixes
_HEAD = re.compile(r"\((\w+)\)$")


class HeadNeverLearnt:
    """One head's metrics at zero at every point while another head's are not (module doc)."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.min_points, self.patience, self.floor = int(p["min_points"]), int(p["patience"]), float(p["floor"])

    def judge(self, history: History) -> list[Event]:
        """The event, if any: decided on the history as it stands (a head whose metrics left zero by the
        last point has learnt, late), told at the first step the head had been at zero ``patience`` points."""
        if history.steps.size < self.min_points or self._check(history) is None:
            return []
        return replay(history, self.min_points, self._check)

    def _check(self, h: History) -> Event | None:
        heads: dict[str, dict[str, np.ndarray]] = {}  # head -> key -> its finite values
        for key in h.metrics:
            m = _HEAD.search(key)
            if m and key in h.series:
                heads.setdefault(m.group(1), {})[key] = h.finite(key)[1]
        if len(heads) < 2:
            return None
        best = {head: top for head, vals in heads.items()
                if (top := max(((float(np.max(v)), k) for k, v in vals.items() if v.size), default=None))}
        zero = [head for head, (top, _) in best.items() if top <= self.floor
                and min(v.size for v in heads[head].values()) >= self.patience]
        learnt = [head for head, (top, _) in best.items() if top > self.floor]
        if not zero or not learnt:
            return None
        head, other = zero[0], max(learnt, key=lambda x: best[x][0])
        name, other_name = HEADS.get(head, head), HEADS.get(other, other)
        keys = list(heads[head])
        n = min(v.size for v in heads[head].values())
        top, top_key = best[other]
        for k, v in heads[other].items():  # the other head's mAP50 says more than a recall of 1 on a few images
            if "mAP50(" in k and v.size and float(np.max(v)) > self.floor:
                top, top_key = float(np.max(v)), k
                break
        msg = (f"every {name} metric ({', '.join(keys)}) has been 0 at every {h.unit} ({n} so far) while the "
               f"{other_name} metrics reach {fmt(top)} ({top_key}): the {name} head has never matched a validation "
               "label")
        advice = ADVICE.get(f"head_never_learnt_{name}", ADVICE["head_never_learnt"])
        return _event(h, "head_never_learnt", keys[0], int(h.steps[-1]), "warning", msg, onset=int(h.steps[0]),
                      keys=keys, head=name, learnt=other_name, learnt_best=top, confidence=1.0 - 0.5 ** n,
                      advice=advice)


class ZeroLoss:
    """A loss identically zero while its train/validation twin is not, or every loss zero (module doc)."""

    def __init__(self, ctx: StreamContext) -> None:
        self.min_points, self.patience = int(ctx.params["min_points"]), int(ctx.params["patience"])

    def _all_zero(self, h: History, keys: list[str], onset: int) -> Event:
        msg = (f"every loss ({', '.join(keys)}) is exactly 0 at every {h.unit} since {h.when(onset)}: the model has "
               "nothing to learn (a single class, or no targets at all)")
        return _event(h, "zero_loss", keys[0], int(h.steps[-1]), "error", msg, onset=onset, keys=keys,
                      twin_key=None, side="all", confidence=1.0 - 0.5 ** self.patience,
                      advice="check the dataset: a classifier needs 2+ classes with images in each, a detector "
                             "label files with boxes (labels/ next to images/)")

    def judge(self, history: History) -> list[Event]:
        """The zero-loss event, if any."""
        if not history.losses:
            return []
        return replay(history, self.min_points, self._check)

    def _zeros(self, h: History, key: str) -> int | None:
        """The onset of the trailing run of exact zeros of ``key`` when it is ``patience`` long, else None."""
        s, v = h.finite(key)
        zero = np.abs(v) <= ZERO
        z = int(np.argmax(~zero[::-1])) if not zero.all() else zero.size
        return int(s[v.size - z]) if z >= self.patience else None

    def _check(self, h: History) -> Event | None:
        present = [k for k in h.losses if k in h.series]
        onsets = {k: self._zeros(h, k) for k in present}
        if present and all(o is not None for o in onsets.values()):
            return self._all_zero(h, present, max(o for o in onsets.values() if o is not None))
        found: dict[str, list[tuple[str, int, str | None]]] = {"train": [], "val": [], "alone": [], "both": [],
                                                                "uncomputed": []}
        never = not _metric_above_zero(h, int(h.steps[0])) if h.metrics else False
        for key in present:
            onset = onsets[key]
            if onset is None:
                continue
            twin = h.counterpart(key)
            if twin is not None and twin in h.series:
                tv = h.finite(twin)[1]
                if is_val(key) and _metric_above_zero(h, onset):
                    continue  # a term the validation does not compute (YOLO26 sem_loss): it has targets
                if tv.size and float(np.median(np.abs(tv))) > ZERO:
                    found["val" if is_val(key) else "train"].append((key, onset, twin))
                elif never and not is_val(key) and onsets.get(twin) is not None:
                    found["both"].append((key, onset, twin))  # 0 on both sides and nothing ever detected
            elif not is_val(key):
                others = [k for k in h.train_losses if k != key and k in h.series]
                if others and all(_ever_nonzero(h, k) for k in others):
                    found["alone"].append((key, onset, None))
        if not any("box" in k for k, *_ in found["both"]):
            found["both"] = []  # no box term among them: an unused term (YOLO26 sem_loss) of a run that learnt nothing
        val = [k for k in present if is_val(k)]
        if val and h.metrics and not found["val"] and all(onsets[k] is not None or not h.finite(k)[1].size for k in val) \
                and any(onsets[k] is not None for k in val) and _metric_above_zero(h, int(h.steps[0])) \
                and any(_ever_nonzero(h, k) for k in h.train_losses if k in h.series):
            found["uncomputed"] = [(k, int(onsets[k] if onsets[k] is not None else h.steps[0]), None) for k in val]
        side = next((s for s in ("train", "val", "both", "alone", "uncomputed") if found[s]), None)
        if side is None:
            return None
        hits = found[side]
        key, onset, twin = hits[0]
        names, verb = ", ".join(k for k, *_ in hits), "is" if len(hits) == 1 else "are"
        if side == "uncomputed" and dual_head(h.config):
            msg = (f"{names} {verb} exactly 0 at every {h.unit}: YOLOv9's train_dual.py does not compute "
                   "validation losses (WongKinYiu/yolov9#132), so they say nothing (no overfitting can be judged "
                   "on them)")
            return _event(h, "val_losses_absent", key, int(h.steps[-1]), "info", msg, onset=onset,
                          keys=[k for k, *_ in hits], confidence=1.0)
        why = {
            "train": f"while {twin} is not: no target or positive ever reached it in training",
            "val": f"while {twin} is not: the validation images have no targets",
            "alone": "while the other train losses are not: if this term should be active, its targets are missing",
            "both": f"in training and validation while {_nonzero(h)} is not and every metric is 0: no target or "
                    "positive ever reached it",
            "uncomputed": "(or not finite) while the metrics are above 0: the validation computes none of its losses, "
                          "so they say nothing (no overfitting can be judged on them)",
        }[side]
        msg = f"{names} {verb} exactly 0 at every {h.unit} since {h.when(onset)} {why}"
        return _event(h, "zero_loss", key, int(h.steps[-1]), "warning" if side in ("alone", "uncomputed") else "error",
                      msg, onset=onset, keys=[k for k, *_ in hits], twin_key=twin, side=side,
                      advice=ADVICE[{"val": "zero_loss_val", "uncomputed": "zero_loss_uncomputed"}.get(side, "zero_loss")],
                      confidence=1.0 - 0.5 ** self.patience)


def _smooth(v: np.ndarray) -> np.ndarray:
    """Centred running median of 3, the ends kept: a one-epoch dip or spike is no minimum."""
    if v.size < 3:
        return v.copy()
    mid = np.median(np.stack([v[:-2], v[1:-1], v[2:]]), axis=0)
    return np.concatenate([v[:1], mid, v[-1:]])


def _val_size(h: History) -> float | None:
    """The validation set's size as an accuracy's step tells it (accuracy moves in steps of 1/N); None without one."""
    key = next((k for k in h.metrics if "top1" in k.lower() or "accuracy" in k.lower()), None)
    if key is None:
        return None
    levels = np.unique(np.round(h.finite(key)[1], 5))
    gaps = np.diff(levels)
    gaps = gaps[gaps > 1e-4]
    return 1.0 / float(gaps.min()) if gaps.size else None


def _mosaic_closed(h: History) -> int | None:
    """The first step without the mosaic: Ultralytics turns it off for the last ``close_mosaic``
    of ``epochs`` (both from the config), at 0-based epoch ``epochs - close_mosaic``; None when
    the config says neither, for a classifier (it has no mosaic), or when the steps are not
    epochs (the run logs no ``epoch`` key and was not imported)."""
    close, planned = config_value(h.config, ("close_mosaic",)), h.planned_epochs()
    if config_value(h.config, ("task",)) == "classify":  # no mosaic to close
        return None
    try:
        close = int(close)
    except (TypeError, ValueError):
        return None
    if planned is None or not 0 < close < planned or not h.steps.size:
        return None
    at = planned - close  # epochs done when the mosaic closes
    if "epoch" in h.series:  # a live run: steps are batches, ``epoch`` counts completed epochs
        s, e = h.finite("epoch")
        hit = np.flatnonzero(e >= at)
        return int(s[hit[0]]) + 1 if hit.size else None
    if not h.imported:
        return None
    return int(h.steps[0]) + at  # the file's epochs: 0-based (8.0) or 1-based (8.1+) alike


def _ever_nonzero(h: History, key: str) -> bool:
    """Whether ``key`` is above 0 (in magnitude) at some finite point."""
    return float(np.nanmax(np.abs(h.finite(key)[1]), initial=0.0)) > ZERO


def _nonzero(h: History) -> str:
    """The first train loss that is not 0 at every point (for a message)."""
    return next((k for k in h.train_losses if k in h.series and _ever_nonzero(h, k)), "another loss")


def _metric_above_zero(h: History, since: int) -> bool:
    """Whether some metric is above zero at a step from ``since`` on (the validation set has targets)."""
    for key in h.metrics:
        s, v = h.finite(key)
        if np.any(v[s >= since] > ZERO):
            return True
    return False


def _fitness(h: History) -> tuple[np.ndarray, np.ndarray] | None:
    """Ultralytics' fitness (0.1 mAP50 + 0.9 mAP50-95) per step, else the first metric; None without metrics."""
    hi = next((k for k in h.metrics if "50-95" in k or "0.5:0.95" in k), None)
    lo = next((k for k in h.metrics if ("mAP50" in k and "95" not in k) or k.endswith("mAP_0.5")), None)
    if hi and lo:
        s1, v1 = h.finite(hi)
        s2, v2 = h.finite(lo)
        common, i1, i2 = np.intersect1d(s1, s2, return_indices=True)
        return common, 0.9 * v1[i1] + 0.1 * v2[i2]
    if h.metrics:
        return h.finite(h.metrics[0])
    return None


class StoppedEarly:
    """A run that ended before its schedule did (module doc)."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.min_points, self.min_remaining = int(p["min_points"]), float(p["min_remaining"])
        self.min_fraction, self.lrf = float(p["min_fraction"]), float(p["lrf"])
        self.decay_points = int(p["decay_points"])

    def judge(self, history: History) -> list[Event]:
        """The stopped-early event (at the last step), if any."""
        h = history
        if h.steps.size < self.min_points or h.status == "running":
            return []
        first, last = int(h.steps[0]), int(h.steps[-1])
        done = last + 1 if first == 0 else last  # epochs count from 0 (YOLOv5) or 1 (Ultralytics 8+)
        planned = h.planned_epochs() if h.unit == "epoch" else None
        if planned is not None:
            if done >= planned:
                return []
            return [self._planned(h, done, planned, last)]
        return self._from_lr(h, done, last)

    def _planned(self, h: History, done: int, planned: int, last: int) -> Event:
        patience = h.config.get("patience")
        fit = _fitness(h)
        best = int(fit[0][int(np.argmax(fit[1]))]) if fit is not None and fit[1].size else None
        if isinstance(patience, (int, float)) and 0 < patience < planned and best is not None and last - best >= patience:
            msg = (f"early stopping ended the run at {h.when(last)} of {planned}: no improvement in {int(patience)} "
                   f"{h.unit}s since the best {h.unit}, {best}")
            return _event(h, "stopped_early", None, last, "info", msg, onset=last, planned=planned, done=done,
                          best_step=best, how="early stopping", confidence=1.0,
                          advice="nothing to fix: use the best epoch's weights; raise patience to train longer")
        msg = f"the run stopped at {h.when(last)} of the {planned} its config planned (crashed, killed or interrupted)"
        return _event(h, "stopped_early", None, last, "warning", msg, onset=last, planned=planned, done=done,
                      best_step=best, how="cut short", confidence=1.0)

    def _from_lr(self, h: History, done: int, last: int) -> list[Event]:
        lr, warm = h.lr, h.warmup_end()
        if lr is None or warm is None:
            return []
        s, v = lr
        post = v[s >= warm]  # the schedule after its warm-up, from the warm-up's last step
        if post.size < self.decay_points:
            return []  # still in warm-up, or too little of the schedule to read its step
        peak = float(v[: int(np.searchsorted(s, warm)) + 1].max())
        diffs = np.diff(post)[-(self.decay_points - 1):]
        step = -float(np.median(diffs))
        if peak <= 0 or step <= peak * 1e-6:
            return []
        lrf = h.config.get("lrf")
        lrf = float(lrf) if isinstance(lrf, (int, float)) and 0 < lrf < 1 else self.lrf
        remaining = max(0.0, (float(v[-1]) - lrf * peak) / step)
        planned = done + remaining
        if remaining < self.min_remaining or remaining < self.min_fraction * planned:
            return []
        spread = float(np.max(np.abs(diffs + step))) / step
        msg = (f"the run stopped at {h.when(last)} with the learning rate still {float(v[-1]) / peak:.0%} of its "
               f"peak, falling {fmt(step)} an {h.unit}: its schedule had about {remaining:.0f} more {h.unit}s to go "
               f"(~{planned:.0f} planned)")
        return [_event(h, "stopped_early", None, last, "warning", msg, onset=last, planned=round(planned),
                       done=done, remaining=remaining, how="schedule unfinished", warmup_end=warm,
                       confidence=max(0.0, min(1.0, 1.0 - spread)))]


class EpochDivergence:
    """A train loss far above its minimum so far for several points in a row (module doc)."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.min_points, self.factor, self.patience = int(p["min_points"]), float(p["factor"]), int(p["patience"])
        self.min_span = float(p["min_span"])
        self.min_jump, self.noise_points = float(p["min_jump"]), int(p["noise_points"])

    def judge(self, history: History) -> list[Event]:
        """The divergence event, if any."""
        if not history.train_losses:
            return []
        closed = _mosaic_closed(history)
        return replay(history, self.min_points, lambda h: self._check(h, closed))

    def _check(self, h: History, closed: int | None) -> Event | None:
        for key in h.train_losses:
            if key not in h.series:
                continue
            s, v = h.finite(key)
            if v.size <= self.patience:
                continue
            if closed is not None and s[v.size - self.patience] >= closed:
                keep = s >= closed  # a new pipeline: its own minimum
                s, v = s[keep], v[keep]
                if v.size <= self.patience:
                    continue
            before, recent = v[: -self.patience], v[-self.patience:]
            low = _smooth(v)[: before.size]  # running median of 3: a one-epoch dip is no minimum
            b = int(np.argmin(low))
            best = float(low[b])
            if best <= ZERO or not np.all(recent > self.factor * best):
                continue
            fallen = float(before[: b + 1].max()) - best
            jump = float(recent.min()) - best
            if jump < self.min_span * fallen:
                continue
            steps = np.abs(np.diff(before))
            if steps.size >= self.noise_points and jump < self.min_jump * float(np.median(steps)):
                continue
            onset = int(s[v.size - self.patience])
            ratio = float(recent[-1]) / best
            msg = (f"{key} is diverging: {fmt(float(recent[-1]))} at {h.when(int(s[-1]))} is {ratio:.2f}x its "
                   f"minimum {fmt(best)} ({h.when(int(s[b]))}), above {self.factor:g}x since {h.when(onset)}")
            conf = 1.0 - math.exp(-(ratio - self.factor))
            return _event(h, "divergence", key, int(s[-1]), "error", msg, onset=onset, best=best,
                          best_step=int(s[b]), ratio=ratio, level="epoch", confidence=max(0.5, conf))
        return None
