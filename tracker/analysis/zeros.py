"""Zero loss, online: a loss (or a class's loss) identically 0 while the rest of the run's losses are not.

The epoch judge ``zero_loss`` (:mod:`tracker.analysis.epoch_judges`) reads whole
few-point histories in ``tracker analyze``; these two detectors say the same while
the run trains, on per-batch curves, and give the same events offline.

``twin_zero_loss`` (scope ``twins``: one stream sees every analysed key), rules:

* A key reaches a *zero run* when it is exactly 0 at ``patience`` finite points in a
  row (``val_patience`` for a validation key, logged once an epoch), and the run
  began at its first point or after a value of at least ``converged`` times its
  starting scale (:class:`tracker.analysis.trends.StartScale`): a loss that fell
  to 1e-7 and then rounds to 0 has converged, it has not lost its targets.
* It is reported when its train/validation twin (``train/box_loss`` and
  ``val/box_loss``, named as :func:`tracker.analysis.epochs.base_name` says) has a
  non-zero finite value at or after the run's onset, whenever that arrives: a term
  at 0 in train *and* val (YOLO26's ``sem_loss``) is unused and never reported. The
  event is at the step of the ``patience``-th zero; one per key.
* A validation key's zero run is a term the validation does not compute, as the
  epoch judge reads it, when a metric (mAP, accuracy, ...: the analyzer shows this
  detector the run's metric keys, analysed or not, through ``observe``) is above 0
  at or after its onset and another validation loss is not 0 there: YOLO26's
  ``sem_loss``, and its pose ``rle_loss``, whose keypoint sigmas the head computes in
  training only. It is never reported. A validation key's decision waits for the
  metrics of its step when the run logs metrics (they may come in a later flush);
  a validation whose losses are all 0 beside metrics above 0 is still reported,
  unless the config names a YOLOv9 model trained by ``train_dual.py``, whose
  validation computes no loss by design (the epoch judge's ``val_losses_absent``).

``class_zero_loss`` (scope ``classes``), rules:

* A class whose per-class loss is exactly 0 at every row since the key's first row
  while the row totals are not (no image of it ever reached the loss: its labels
  were dropped) is named at the first row where ``min_rows`` rows and two epochs of
  steps (``epochs`` x the config's ``steps_per_epoch``/``batches_per_epoch``, else
  ``span`` steps) have passed: every image is drawn once an epoch, so a class with
  even one training label shows up within two. One event per key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracker.analysis.advice import ADVICE
from tracker.analysis.detectors import KeyedChunk, StreamContext, clean, run_lengths
from tracker.analysis.epochs import base_name, dual_head, is_metric, is_val
from tracker.analysis.trends import StartScale
from tracker.events import Event

EPOCH_KEYS = ("steps_per_epoch", "batches_per_epoch")


@dataclass
class _Zeros:
    """One key's zero-run state."""

    scale: StartScale
    run: int = 0
    run_start: int | None = None
    before: float | None = None  # the value before the current zero run (None: since the first point)
    last: float | None = None  # the last finite value
    last_nonzero_step: int | None = None
    uncomputed: bool = False  # a validation term the validation does not compute: never reported
    candidate: tuple[int, int] | None = None  # (onset, step of the patience-th zero)
    reported: bool = False


class TwinZeroLoss:
    """A loss exactly 0 while its train/validation twin is not (module doc); scope ``twins``."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.patience, self.val_patience = int(p["patience"]), int(p["val_patience"])
        self.converged = float(p["converged"])
        self.keys: dict[str, _Zeros] = {}
        self.metric_last: int | None = None  # the last step of any metric point seen
        self.metric_above: int | None = None  # the last step at which a metric was above 0
        self.dual_head = dual_head(ctx.config)  # YOLOv9's train_dual.py: no validation loss is computed

    def _twin(self, key: str) -> str | None:
        name, val = base_name(key).lower(), is_val(key)
        for other in self.keys:
            if other != key and is_val(other) != val and base_name(other).lower() == name:
                return other
        return None

    def feed(self, item: KeyedChunk) -> list[Event]:
        """Events decided once ``chunk`` of ``key`` is in (for ``key`` or for its twin)."""
        key, chunk = item.key, item.chunk
        if is_metric(key):
            return self.observe(item)
        state = self.keys.get(key)
        if state is None:
            state = self.keys[key] = _Zeros(StartScale(50))
        x, steps = chunk.fvalues, chunk.fsteps
        if x.size:
            self._scan(key, state, x, steps)
        keys = [key, self._twin(key)]
        if is_val(key):
            keys += [k for k in self.keys if is_val(k) and k not in keys]  # a term judged against the others
        return [e for e in (self._decide(k) for k in keys if k is not None) if e is not None]

    def observe(self, item: KeyedChunk) -> list[Event]:
        """A metric key's next points: whether the validation has targets (module doc)."""
        x, steps = item.chunk.fvalues, item.chunk.fsteps
        if not steps.size:
            return []
        last = int(steps[-1])
        self.metric_last = last if self.metric_last is None else max(self.metric_last, last)
        above = steps[x > 0.0]
        if above.size:
            top = int(above[-1])
            self.metric_above = top if self.metric_above is None else max(self.metric_above, top)
        return [e for e in (self._decide(k) for k in list(self.keys) if is_val(k)) if e is not None]

    def _scan(self, key: str, st: _Zeros, x: np.ndarray, steps: np.ndarray) -> None:
        scale = st.scale.update(x)
        zero = x == 0.0
        lengths = run_lengths(zero, st.run)

        def start_of(i: int) -> tuple[int, float | None]:
            """Onset step of the zero run ending at ``i``, and the value just before it."""
            start = i - int(lengths[i]) + 1
            if start < 0:
                return int(st.run_start), st.before  # type: ignore[arg-type]
            return int(steps[start]), (float(x[start - 1]) if start > 0 else st.last)

        if st.candidate is None and not st.reported:
            need = self.val_patience if is_val(key) else self.patience
            for i in np.flatnonzero(lengths >= need).tolist():
                onset, before = start_of(i)
                level = float(scale[i])  # NaN in the first 50 points: only a run from the start counts there
                if before is None or (math.isfinite(level) and abs(before) >= self.converged * level):
                    st.candidate = (onset, int(steps[i]))
                    break
        nonzero = np.flatnonzero(~zero)
        if nonzero.size:
            st.last_nonzero_step = int(steps[nonzero[-1]])
        if zero[-1]:
            st.run_start, st.before = start_of(x.size - 1)
            st.run = int(lengths[-1])
        else:
            st.run, st.run_start, st.before = 0, None, None
        st.last = float(x[-1])

    def _decide(self, key: str) -> Event | None:
        st = self.keys[key]
        if st.candidate is None or st.reported:
            return None
        twin = self._twin(key)
        if twin is None:
            return None
        seen = self.keys[twin].last_nonzero_step
        onset, step = st.candidate
        if seen is None or seen < onset:
            return None
        val = is_val(key)
        if val:
            if self.metric_last is not None and self.metric_last < step:
                return None  # the metrics of this step have not come in yet
            if self._uncomputed(key, onset):
                st.reported = st.uncomputed = True
                return None
        st.reported = True
        why = ("the validation images have no targets" if val
               else "no target or positive ever reached it in training")
        advice = ADVICE["zero_loss_val" if val else "zero_loss"]
        need = self.val_patience if val else self.patience
        return Event(
            step=step, kind="zero_loss", key=key, severity="error",
            message=f"{key} is exactly 0 at {need} points in a row since step {onset} while {twin} is not: {why}; "
                    f"{advice}",
            data=clean({"onset": onset, "twin_key": twin, "side": "val" if val else "train", "patience": need,
                        "advice": advice, "confidence": 1.0 - 0.5 ** need}),
        )

    def _uncomputed(self, key: str, onset: int) -> bool:
        """Whether validation key ``key``, 0 since ``onset``, is a term the validation does not compute: a metric
        above 0 and another validation loss not 0 at or after ``onset``."""
        if self.dual_head:
            return True
        if self.metric_above is None or self.metric_above < onset:
            return False
        return any(k != key and is_val(k) and s.last_nonzero_step is not None and s.last_nonzero_step >= onset
                   for k, s in self.keys.items())

    def summary(self) -> dict[str, Any]:
        """Keys reported, and validation terms read as not computed."""
        return {"zero_loss_keys": sorted(k for k, s in self.keys.items() if s.reported and not s.uncomputed),
                "uncomputed_keys": sorted(k for k, s in self.keys.items() if s.uncomputed)}


class ClassZeroLoss:
    """Classes whose loss is exactly 0 at every row since the first while the totals are not (module doc)."""

    def __init__(self, ctx: StreamContext) -> None:
        p = ctx.params
        self.key, self.names = ctx.key, ctx.class_names
        self.min_rows = int(p["min_rows"])
        per_epoch = next((ctx.config.get(k) for k in EPOCH_KEYS if isinstance(ctx.config.get(k), (int, float))), None)
        self.span = float(p["epochs"]) * float(per_epoch) if per_epoch else float(p["span"])
        self.first: int | None = None
        self.rows = 0
        self.zero: np.ndarray = np.zeros(0, bool)  # per column: exactly 0 at every row so far
        self.total_seen = False
        self.done = False

    def feed(self, chunk: Any) -> list[Event]:
        """The event, at the row where the evidence suffices, if it falls in ``chunk``."""
        values = np.asarray(chunk.values, dtype=np.float64)
        steps = np.asarray(chunk.steps, dtype=np.int64)
        n = values.shape[0]
        if self.done or n == 0:
            self.rows += n
            return []
        if self.first is None:
            self.first = int(steps[0])
            self.zero = np.ones(values.shape[1], bool)
        if values.shape[1] > self.zero.size:  # a class that appears later was not 0 at the earlier rows
            self.zero = np.concatenate([self.zero, np.zeros(values.shape[1] - self.zero.size, bool)])
        elif values.shape[1] < self.zero.size:
            values = np.pad(values, ((0, 0), (0, self.zero.size - values.shape[1])), constant_values=np.nan)
        rows = self.rows + np.arange(1, n + 1)
        due = np.flatnonzero((rows >= self.min_rows) & (steps - self.first >= self.span))
        end = int(due[0]) + 1 if due.size else n
        part = values[:end]
        self.zero &= np.all(part == 0.0, axis=0)
        with np.errstate(invalid="ignore"):
            self.total_seen = self.total_seen or bool(np.any(np.nansum(np.abs(part), axis=1) > 0))
        self.rows += n
        if not due.size:
            return []
        self.done = True
        classes = np.flatnonzero(self.zero).tolist()
        if not classes or not self.total_seen or len(classes) == self.zero.size:
            return []
        step = int(steps[end - 1])
        names = [self.names.get(c, f"class {c}") for c in classes]
        return [Event(
            step=step, kind="zero_loss", key=self.key, severity="error",
            message=(f"{self.key}: {', '.join(names)} {'is' if len(names) == 1 else 'are'} exactly 0 at every row "
                     f"since step {self.first} ({self.rows - n + end} rows) while the other classes are not: no "
                     f"training image of {'it' if len(names) == 1 else 'them'} reached the loss; {ADVICE['zero_loss']}"),
            data=clean({"classes": classes, "names": names, "onset": self.first, "rows": self.rows - n + end,
                        "advice": ADVICE["zero_loss"], "confidence": 1.0}),
        )]

    def summary(self) -> dict[str, Any]:
        """Nothing beyond the events."""
        return {}
