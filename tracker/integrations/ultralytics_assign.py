"""Assignment statistics, gradient balance and AP per class from an Ultralytics training.

Nothing runs a second forward pass: :func:`attach` wraps, on the training model's
criterion (``v8DetectionLoss``, or the one-to-many half of ``E2EDetectLoss``),

* the forward of its ``TaskAlignedAssigner``, to keep the inputs and outputs of
  the assignment Ultralytics computes anyway (``gt_labels``, ``mask_gt``,
  ``target_labels``, ``fg_mask``, ``target_gt_idx``, the anchor points), and
* the forward of its classification loss (the
  :class:`~tracker.integrations.ultralytics_loss.ClassificationLoss` that the
  integration already puts in place of ``bce``), to take the gradient of the
  elementwise loss with respect to the classification logits.

The gradient is that of the logged ``train/cls_loss`` (the criterion's loss item):
``d/dx sum(loss * w_c) / target_scores_sum * hyp.cls``. For the stock BCE it is
``(sigmoid(x) - target)`` times that scale, computed in closed form; for a
substituted term it is ``torch.autograd.grad`` of the term's elementwise loss on a
detached copy of the logits (one more evaluation of the term on logged batches).
Positives of class c are the anchors the assigner made foreground with label c;
every other anchor is a negative of c.

The statistics are computed only on the batches that are logged (``log_every``)
and stay on the device until one copy at ``on_train_batch_end``. A probe that fails
(a criterion of a layout this module does not know) turns itself off for the rest of
the training with one warning; the training goes on.
:func:`log_val_ap` logs ``val/AP50`` and ``val/AP50-95`` per class from the
validator's metrics (NaN for a class the validation set lacks).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from tracker.assign import assignment_stats, bce_grad, grad_stats, positives, write
from tracker.integrations.ultralytics_loss import ClassificationLoss, _leaves

MARK = "_tracker_assign"
log = logging.getLogger(__name__)


class AssignProbe:
    """The kept assignment and gradient statistics of the last probed criterion call."""

    def __init__(self, num_classes: int, strides: list[float]) -> None:
        self.num_classes = num_classes
        self.strides = strides
        self.active = True
        self.failed = False
        self.stats: dict[str, torch.Tensor] | None = None
        self._assigned: tuple[torch.Tensor, ...] | None = None
        self._levels: dict[tuple[int, str], torch.Tensor] = {}

    def anchor_strides(self, anc_points: torch.Tensor) -> torch.Tensor:
        """The stride of each anchor, from its pixel centre: level s holds the centres ``(i + 0.5) * s``."""
        key = (int(anc_points.shape[0]), str(anc_points.device))
        cached = self._levels.get(key)
        if cached is None:
            x = anc_points[:, 0].float()
            cached = torch.zeros_like(x)
            for s in self.strides:
                cached = torch.where(torch.remainder(x - s / 2, s).abs() < 1e-3, torch.full_like(x, s), cached)
            self._levels[key] = cached
        return cached

    def on_assign(self, args: tuple[Any, ...], out: tuple[torch.Tensor, ...]) -> None:
        """Keep the assignment (called after the assigner's forward)."""
        if not self.active:
            return
        anc_points, gt_labels, mask_gt = args[2], args[3], args[5]
        target_labels, fg_mask, target_gt_idx = out[0], out[3], out[4]
        with torch.no_grad():
            self.stats = assignment_stats(gt_labels.squeeze(-1), mask_gt.squeeze(-1), fg_mask, target_gt_idx,
                                          self.num_classes, self.anchor_strides(anc_points))
        self._assigned = (fg_mask, target_labels)

    def on_cls_loss(self, loss: ClassificationLoss, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """Add the gradient balance of the classification loss just computed."""
        if not self.active or self._assigned is None or self.stats is None:
            return
        fg_mask, target_labels = self._assigned
        self._assigned = None
        with torch.no_grad():
            scale = loss.gain / targets.detach().float().sum().clamp(min=1)
            if loss.class_weights is not None:
                scale = scale * loss.class_weights.to(logits.device).float()
            if _plain_bce(loss.inner):
                grad = bce_grad(logits, targets, scale)
            else:
                grad = _autograd(loss.inner, logits, targets).abs_().mul_(scale)
            self.stats.update(grad_stats(grad, positives(fg_mask, target_labels, self.num_classes)))

    def fail(self, exc: BaseException) -> None:
        """Turn the probe off for the rest of the training (one warning): tracking never stops a training."""
        if not self.failed:
            log.warning("tracker: the assignment statistics are off for this training: %s: %s",
                        type(exc).__name__, exc)
        self.failed, self.active, self.stats, self._assigned = True, False, None, None

    def take(self) -> dict[str, torch.Tensor] | None:
        """The last batch's statistics (once)."""
        stats, self.stats = self.stats, None
        return stats


def _plain_bce(module: torch.nn.Module) -> bool:
    return (isinstance(module, torch.nn.BCEWithLogitsLoss) and module.weight is None
            and module.pos_weight is None)


def _autograd(inner: torch.nn.Module, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    x = logits.detach().float().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(inner(x, targets.detach().float()).sum(), x)
    return grad


def attach(model: torch.nn.Module) -> AssignProbe:
    """Wrap the criterion of ``model`` (after :func:`~tracker.integrations.ultralytics_loss.install`)
    so that each call keeps its assignment and gradient statistics; returns the probe."""
    leaf = _leaves(model.criterion)[0]  # the one-to-many half of an end-to-end criterion
    probe = AssignProbe(int(leaf.nc), [float(s) for s in leaf.stride.tolist()])
    assigner, bce = leaf.assigner, leaf.bce
    for module in (assigner, bce):  # a second training of the same model: unwrap first
        inner = getattr(module, MARK, None)
        if inner is not None:
            module.forward = inner
    assign_forward, bce_forward = assigner.forward, bce.forward

    def assign(*args: Any, **kwargs: Any) -> Any:
        out = assign_forward(*args, **kwargs)
        try:
            probe.on_assign(args, out)
        except Exception as exc:  # a layout this code does not know: no statistics, the training goes on
            probe.fail(exc)
        return out

    def classify(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        out = bce_forward(logits, targets)
        if isinstance(bce, ClassificationLoss):
            try:
                probe.on_cls_loss(bce, logits, targets)
            except Exception as exc:
                probe.fail(exc)
        return out

    assigner.forward, bce.forward = assign, classify
    setattr(assigner, MARK, assign_forward)
    setattr(bce, MARK, bce_forward)
    return probe


def log_batch(probe: AssignProbe | None, run: Any, step: int, log_every: int) -> None:
    """Log the probed batch's statistics at ``step``; arm the probe for the next batch if it is logged."""
    if probe is None:
        return
    stats = probe.take()
    if stats and step % log_every == 0:
        write(run, stats, step)
    probe.active = not probe.failed and (step + 1) % log_every == 0


def val_ap(trainer: Any, num_classes: int) -> dict[str, np.ndarray] | None:
    """``{"val/AP50": (C,), "val/AP50-95": (C,)}`` from the trainer's last validation (NaN where a
    class has no AP: absent from the validation labels); None when the validator has none."""
    box = getattr(getattr(getattr(trainer, "validator", None), "metrics", None), "box", None)
    index = np.asarray(getattr(box, "ap_class_index", None) if box is not None else [], dtype=np.int64).reshape(-1)
    all_ap = np.asarray(getattr(box, "all_ap", []), dtype=np.float64)
    if not index.size or all_ap.ndim != 2 or all_ap.shape[0] != index.size:
        return None
    ap50, ap = np.full(num_classes, np.nan), np.full(num_classes, np.nan)
    for row, c in enumerate(index):
        if 0 <= int(c) < num_classes:
            ap50[int(c)], ap[int(c)] = all_ap[row, 0], all_ap[row].mean()
    return {"val/AP50": ap50, "val/AP50-95": ap}


def log_val_ap(run: Any, trainer: Any, step: int, prefix: str = "val/") -> None:
    """Log the per-class AP vectors of the trainer's last validation at ``step``."""
    aps = val_ap(trainer, len(run.classes or ()) or int(trainer.data["nc"]))
    for key, values in (aps or {}).items():
        run.log_classes(prefix + key.split("/", 1)[1], values, step=step)
