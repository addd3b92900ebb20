"""Assignment statistics and gradient balance per class, for any dense detector (torch).

Why a rare class does not learn shows in three places that the loss curve hides:

* **assignment**: how many ground-truth (GT) boxes of the class a batch holds
  (``assign/gt``), how many anchors the assigner made positive for it
  (``assign/pos``) and how many of its GT boxes got no positive anchor at all
  (``assign/gt_no_pos``: a box smaller than the stride under a task-aligned
  assigner, for instance); with anchor strides, the positives per feature-pyramid
  level (``assign/pos/P3``, ...) and the GT boxes that level served
  (``assign/gt/P3``: boxes with at least one positive there) as scalar totals;
* **gradient balance** (Equalization Loss v2, Tan et al. 2021): ``grad/pos`` and
  ``grad/neg``, the summed ``|dL/dlogit|`` of class c's logit over the samples of
  class c (positives) and over every other sample (negatives: background and the
  other classes' positives). Their cumulative ratio over the run is EQL v2's
  indicator of a balanced class; it is derived when read
  (:func:`tracker.assign_queries.grad_ratio`), not stored;
* **AP per class** after validation (logged by the integration, ``val/AP50``).

The input is the padded layout of Ultralytics' task-aligned assigner, which any
assigner (TAL, SimOTA, ATSS, torchvision's Matcher) can fill: ``B`` images,
``M`` GT slots per image, ``A`` anchors per image, ``C`` classes.

Everything stays on the tensors' device until one copy to the host at the end
(one synchronisation per logged batch). ``import tracker`` does not import torch:
this module is imported on first use.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from tracker.errors import ConfigError

KEYS = ("assign/gt", "assign/pos", "assign/gt_no_pos", "grad/pos", "grad/neg")


def level_names(strides: Sequence[float]) -> list[str]:
    """``P3``, ``P4``... for strides 8, 16...: the pyramid level is log2 of the stride."""
    return [f"P{round(math.log2(float(s)))}" for s in strides]


def _as(x: Any, what: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError):
            raise ConfigError(f"log_assignments: {what} is a {type(x).__name__}; expected a tensor or array") from None
    return x if dtype is None else x.to(dtype)


def assignment_stats(gt_labels: Any, gt_mask: Any, fg_mask: Any, matched_gt: Any, num_classes: int,
                     anchor_strides: Any = None) -> dict[str, torch.Tensor]:
    """Per-class ``assign/gt``, ``assign/pos``, ``assign/gt_no_pos`` (each ``(C,)``), and per level
    ``assign/pos/P3``, ``assign/gt/P3``... (0-d) when ``anchor_strides`` (``(A,)``) is given.

    ``gt_labels`` ``(B, M)`` class of each GT slot, ``gt_mask`` ``(B, M)`` True for a real box,
    ``fg_mask`` ``(B, A)`` True for a positive anchor, ``matched_gt`` ``(B, A)`` the GT slot
    a positive anchor is assigned to (ignored where ``fg_mask`` is False).
    """
    labels = _as(gt_labels, "gt_labels").reshape(gt_labels.shape[0], -1).long()
    valid = _as(gt_mask, "gt_mask").reshape(labels.shape).bool()
    fg = _as(fg_mask, "fg_mask").bool()
    idx = _as(matched_gt, "matched_gt").long()
    if fg.shape != idx.shape or fg.shape[0] != labels.shape[0]:
        raise ConfigError(f"log_assignments: fg_mask {tuple(fg.shape)} and matched_gt {tuple(idx.shape)} must both be "
                          f"(B, A) with B = {labels.shape[0]} images as in gt_labels {tuple(labels.shape)}")
    b, m = labels.shape
    c = int(num_classes)
    idx = idx.clamp(0, max(m - 1, 0))
    out: dict[str, torch.Tensor] = {}
    out["assign/gt"] = torch.bincount(labels[valid].clamp(0, c - 1), minlength=c)[:c]
    if m == 0:
        zero = torch.zeros(c, dtype=torch.long, device=labels.device)
        out["assign/pos"], out["assign/gt_no_pos"] = zero, zero.clone()
        per_gt = torch.zeros(b, 0, dtype=torch.long, device=labels.device)
    else:
        assigned = labels.gather(1, idx)  # (B, A) class of the GT each anchor is matched to
        out["assign/pos"] = torch.bincount(assigned[fg].clamp(0, c - 1), minlength=c)[:c]
        per_gt = torch.zeros(b, m, dtype=torch.long, device=labels.device).scatter_add_(1, idx, fg.long())
        out["assign/gt_no_pos"] = torch.bincount(labels[valid & (per_gt == 0)].clamp(0, c - 1), minlength=c)[:c]
    if anchor_strides is not None:
        strides = _as(anchor_strides, "anchor_strides").reshape(-1).to(fg.device)
        if strides.numel() != fg.shape[1]:
            raise ConfigError(f"log_assignments: anchor_strides has {strides.numel()} entries for {fg.shape[1]} "
                              "anchors; pass the stride of each anchor")
        for s in torch.unique(strides).tolist():
            if not s > 0:  # anchors of no known level
                continue
            at = strides == s
            name = level_names([s])[0]
            out[f"assign/pos/{name}"] = fg[:, at].sum()
            if m:
                served = torch.zeros(b, m, dtype=torch.long, device=fg.device).scatter_add_(
                    1, idx[:, at], fg[:, at].long())
                out[f"assign/gt/{name}"] = (valid & (served > 0)).sum()
    return out


def bce_grad(logits: torch.Tensor, targets: torch.Tensor, scale: Any = 1.0) -> torch.Tensor:
    """``|d/dx BCEWithLogits(x, y)| * scale`` elementwise, i.e. ``|sigmoid(x) - y| * scale`` (float32)."""
    g = (logits.detach().float().sigmoid() - targets.detach().float()).abs_()
    return g.mul_(scale) if not isinstance(scale, torch.Tensor) else g.mul_(scale.to(g))


def grad_stats(grad: torch.Tensor, positive: torch.Tensor) -> dict[str, torch.Tensor]:
    """``grad/pos`` and ``grad/neg`` ``(C,)``: ``|grad|`` ``(..., C)`` summed over the positive and the
    negative samples of each class; ``positive`` ``(..., C)`` True where the sample belongs to the class."""
    c = grad.shape[-1]
    g = grad.detach().abs().reshape(-1, c).to(torch.float64 if grad.device.type != "mps" else torch.float32)
    pos = positive.reshape(-1, c)
    total = g.sum(0)
    pos_sum = (g * pos).sum(0)
    return {"grad/pos": pos_sum, "grad/neg": total - pos_sum}


def positives(fg_mask: torch.Tensor, assigned_labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``(B, A, C)`` True where anchor a is a positive of class c (``fg_mask`` and its assigned label)."""
    labels = assigned_labels.long().clamp(0, num_classes - 1)
    onehot = torch.nn.functional.one_hot(labels, num_classes).bool()
    return onehot & fg_mask.bool().unsqueeze(-1)


def log_assignments(run: Any, *, gt_labels: Any, gt_mask: Any, fg_mask: Any, matched_gt: Any,
                    num_classes: int | None = None, step: int | None = None, anchor_strides: Any = None,
                    logits: Any = None, targets: Any = None, grad: Any = None, grad_scale: Any = 1.0) -> dict[str, Any]:
    """Compute and log one batch's assignment statistics and gradient balance; returns what it logged.

    See :meth:`tracker.run.Run.log_assignments` for the arguments.
    """
    c = int(num_classes if num_classes is not None else len(run.classes or ()) or 0)
    if c < 1:
        raise ConfigError("log_assignments: num_classes is unknown; pass num_classes=C or call run.set_classes first")
    stats = assignment_stats(gt_labels, gt_mask, fg_mask, matched_gt, c, anchor_strides)
    if grad is None and logits is not None:
        if targets is None:
            raise ConfigError("log_assignments: logits given without targets; pass targets (the BCE targets, "
                              "(B, A, C)) or grad= (dL/dlogits) instead")
        grad = bce_grad(_as(logits, "logits"), _as(targets, "targets"), grad_scale)
    elif grad is not None:
        grad = _as(grad, "grad").abs() * grad_scale
    if grad is not None:
        fg = _as(fg_mask, "fg_mask").bool()
        labels = _as(gt_labels, "gt_labels").reshape(fg.shape[0], -1).long()
        idx = _as(matched_gt, "matched_gt").long().clamp(0, max(labels.shape[1] - 1, 0))
        assigned = labels.gather(1, idx) if labels.shape[1] else torch.zeros_like(idx)
        if grad.shape[:-1] != fg.shape or grad.shape[-1] != c:
            raise ConfigError(f"log_assignments: grad/logits have shape {tuple(grad.shape)}; expected "
                              f"{(*fg.shape, c)} (B, A, C)")
        stats.update(grad_stats(grad, positives(fg, assigned, c)))
    return write(run, stats, step)


def write(run: Any, stats: dict[str, torch.Tensor], step: int | None) -> dict[str, Any]:
    """Log ``stats``: vectors with ``run.log_classes``, 0-d totals with ``run.log`` (one host copy)."""
    names = list(stats)
    host = [t.detach().cpu() for t in stats.values()] if names else []
    step = run._next_step if step is None else step
    scalars: dict[str, float] = {}
    logged: dict[str, Any] = {}
    for name, value in zip(names, host):
        if value.ndim == 0:
            scalars[name] = float(value)
            logged[name] = scalars[name]
        else:
            arr = value.double().numpy()
            run.log_classes(name, arr, step=step)
            logged[name] = arr
    if scalars:
        run.log(scalars, step=step)
    return logged
