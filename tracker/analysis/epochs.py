"""Epoch-level histories: what a run's few-point curves are made of, for the epoch judges.

Most real histories hold one point per epoch, 10 to 300 of them (an Ultralytics
``results.csv``, a Keras or Lightning CSV log). The streaming detectors are tuned
for per-batch curves; the judges of :mod:`tracker.analysis.epoch_judges` (detector
scope ``epochs``) read these instead. Rules:

* A :class:`History` holds every key of one rank with at most :data:`MAX_POINTS`
  points (so the epoch metrics of a per-batch run are judged too), each as
  ``(steps, values)`` in step order, NaN/inf kept; plus the run's config, recorded
  environment (``run.json``: GPUs) and status.
* Roles come from the key names, as the common trainers spell them:
  a *loss* has ``loss`` in its name; a *validation* key starts ``val/``, ``val_``,
  ``valid``, ``validation``, ``eval`` or ``test/`` (Ultralytics ``val/box_loss``,
  Keras ``val_loss``, Lightning ``val_loss``); its *train counterpart* has the same
  name after the prefix (``train/box_loss``, ``loss``, ``train_loss``); a *metric*
  (higher is better) names an mAP, an accuracy, a precision, a recall, an F1, an
  IoU, a Dice score or an AUC; *learning rates* are ``lr``, ``lr/pg0``, ``x/lr0``,
  ``lr-Adam`` or ``learning_rate`` keys, read as their median per step.
* Judges decide causally: :meth:`History.upto` is the history as it stood at a
  step, and a judge reports the first step at which the evidence was enough (so the
  lead time from a finding's onset to its event is what a user watching the run
  would have had; ``overfitting`` decides on the whole history and reports the
  first step at which it was already clear). A history shorter than a judge's
  ``min_points`` steps gets no verdict from it.
* Steps are called epochs in messages when the run is an import (its steps are the
  file's epochs); else steps (``unit``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

import numpy as np

MAX_POINTS = 2000
VAL_PREFIXES = ("val/", "val_", "valid/", "valid_", "validation/", "validation_", "eval/", "eval_", "test/")
TRAIN_PREFIXES = ("train/", "train_", "training/", "training_")
_METRIC = re.compile(r"map|acc|precision|recall|f1|iou|dice|auc|top1|top5", re.IGNORECASE)
_LR = re.compile(r"(^|/)(x/)?lr(\d|/|_|-|$)|learning_rate", re.IGNORECASE)
EPOCHS_KEYS = ("epochs", "max_epochs", "num_train_epochs", "n_epochs")
ZERO = 1e-12


def is_loss(key: str) -> bool:
    """Whether ``key`` names a loss."""
    return "loss" in key.lower()


def is_val(key: str) -> bool:
    """Whether ``key`` is measured on validation data."""
    low = key.lower()
    return low.startswith(VAL_PREFIXES) or "/val_" in low or "/val/" in low


def base_name(key: str) -> str:
    """``key`` without its train/validation prefix: the name a train key and its val twin share."""
    low = key.lower()
    for prefix in (*VAL_PREFIXES, *TRAIN_PREFIXES):
        if low.startswith(prefix):
            return key[len(prefix):]
    return key


def is_lr(key: str) -> bool:
    """Whether ``key`` is a learning rate."""
    return bool(_LR.search(key))


def is_metric(key: str) -> bool:
    """Whether ``key`` is a higher-is-better metric (mAP, accuracy, precision, recall, ...)."""
    return not is_loss(key) and not is_lr(key) and bool(_METRIC.search(key))


def config_value(config: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    """The first of ``names`` in ``config`` or one level down (``{"trainer": {"max_epochs": 10}}``)."""
    for name in names:
        if name in config and not isinstance(config[name], (Mapping, bool)):
            return config[name]
    for value in config.values():
        if isinstance(value, Mapping):
            for name in names:
                if name in value and not isinstance(value[name], (Mapping, bool)):
                    return value[name]
    return None


def dual_head(config: Mapping[str, Any]) -> bool:
    """A YOLOv9 model trained by WongKinYiu/yolov9's ``train_dual.py`` (its ``opt.yaml``'s ``cfg`` names a
    yolov9 model, not a GELAN one), whose validation computes no losses by design (WongKinYiu/yolov9#132)."""
    cfg = config_value(config, ("cfg",))
    name = str(cfg).lower().rsplit("/", 1)[-1] if isinstance(cfg, str) else ""
    return "yolov9" in name and "gelan" not in name


def config_count(config: Mapping[str, Any], names: tuple[str, ...]) -> int | None:
    """:func:`config_value` as a positive int (``300`` or ``"300"``), or None."""
    try:
        n = int(config_value(config, names))
    except (TypeError, ValueError, OverflowError):
        return None
    return n if n > 0 else None


@dataclass
class History:
    """The small keys of one rank of a run (see the module doc)."""

    series: dict[str, tuple[np.ndarray, np.ndarray]]
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    status: str | None = None
    imported: bool = False

    @cached_property
    def steps(self) -> np.ndarray:
        """Every step at which some key has a point, ascending."""
        parts = [s for s, _ in self.series.values()]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)

    @cached_property
    def unit(self) -> str:
        """``epoch`` for an imported run (its steps are the file's epochs), else ``step``."""
        return "epoch" if self.imported else "step"

    def upto(self, step: int) -> History:
        """The history as it stood at ``step`` (points with step <= ``step``)."""
        cut = {}
        for key, (s, v) in self.series.items():
            n = int(np.searchsorted(s, step, side="right"))
            if n:
                cut[key] = (s[:n], v[:n])
        return History(cut, self.config, self.environment, self.status, self.imported)

    def finite(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of the finite points of ``key``."""
        s, v = self.series[key]
        ok = np.isfinite(v)
        return s[ok], v[ok]

    @cached_property
    def losses(self) -> list[str]:
        """Loss keys, sorted."""
        return sorted(k for k in self.series if is_loss(k))

    @cached_property
    def val_losses(self) -> list[str]:
        """Validation loss keys, sorted."""
        return [k for k in self.losses if is_val(k)]

    @cached_property
    def train_losses(self) -> list[str]:
        """Loss keys that are not validation losses, sorted."""
        return [k for k in self.losses if not is_val(k)]

    def counterpart(self, key: str) -> str | None:
        """The train twin of a val key, or the val twin of a train key; None when there is none."""
        name = base_name(key).lower()
        pool = self.train_losses if is_val(key) else self.val_losses
        for other in pool:
            if base_name(other).lower() == name:
                return other
        return None

    @cached_property
    def metrics(self) -> list[str]:
        """Metric keys (higher is better), sorted."""
        return sorted(k for k in self.series if is_metric(k))

    @cached_property
    def lr(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(steps, median learning rate over the lr keys) or None."""
        keys = [k for k in self.series if is_lr(k)]
        if not keys:
            return None
        steps = np.unique(np.concatenate([self.series[k][0] for k in keys]))
        grid = np.full((len(keys), steps.size), np.nan)
        for i, k in enumerate(keys):
            s, v = self.series[k]
            grid[i, np.searchsorted(steps, s)] = v
        with np.errstate(all="ignore"):
            med = np.nanmedian(np.where(np.isfinite(grid), grid, np.nan), axis=0)
        ok = np.isfinite(med)
        return (steps[ok], med[ok]) if ok.any() else None

    def in_warmup(self) -> bool:
        """Whether the learning rate is still warming up at the last step (:meth:`warmup_end` is the last step)."""
        lr = self.lr
        return lr is not None and lr[1].size >= 2 and self.warmup_end() == int(lr[0][-1])

    def warmup_end(self) -> int | None:
        """The last step of the learning rate's warm-up (None without an lr key).

        A step is in warm-up when the median rate rose to it, or when the rate
        groups moved against each other (Ultralytics and YOLOv5 warm the bias group
        down from 0.1 while the others rise; after the warm-up every group follows
        the schedule at a fixed ratio: YOLO26's two rates of 3:1 stay 3:1). The first
        step is the warm-up's end when neither happens.
        """
        lr = self.lr
        if lr is None:
            return None
        steps, med = lr
        warm = np.zeros(med.size, bool)
        warm[1:] = med[1:] > med[:-1] * (1 + 1e-9)
        for key in (k for k in self.series if is_lr(k)):
            s, v = self.series[key]
            i = np.minimum(np.searchsorted(steps, s), steps.size - 1)
            ok = (steps[i] == s) & np.isfinite(v) & (v > 0) & (med[i] > 0)
            i, ratio = i[ok], v[ok] / med[i[ok]]
            moved = np.abs(ratio[1:] / ratio[:-1] - 1.0) > 1e-3
            warm[i[1:][moved]] = True
        hit = np.nonzero(warm)[0]
        return int(steps[hit[-1]]) if hit.size else int(steps[0])

    def planned_epochs(self) -> int | None:
        """The epochs the config asked for (Ultralytics/YOLOv5 ``epochs``, Lightning ``max_epochs``, ...)."""
        return config_count(self.config, EPOCHS_KEYS)

    def when(self, step: int) -> str:
        """``epoch 12`` or ``step 12``."""
        return f"{self.unit} {int(step)}"
