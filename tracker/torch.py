"""The PyTorch bridge: loss modules, and the torch kernels of the built-in terms.

Importing this module imports torch (install it with ``pip install torch``).

* :class:`ClassWeightedBCEWithLogits` and :class:`SigmoidFocalLoss` are
  ``nn.Module`` losses over logits and targets of shape ``(..., C)``. They compute
  in float32 (float64 for float64 logits) whatever the input dtype, also under
  ``torch.autocast``, and return a float32 loss (float64 for float64 logits); the
  gradient flows back to the logits in their own dtype. With ``scheme="none"``
  and no ``pos_weight``, ``ClassWeightedBCEWithLogits`` equals
  ``torch.nn.BCEWithLogitsLoss`` to float32 rounding, forward and backward.
* After each forward, ``last_per_class`` holds the detached per-class SUM of the
  weighted elementwise loss (float64, shape ``(C,)``) and ``last_positives`` the
  number of targets > 0 per class, for ``run.log_classes``.
* :func:`bce_kernel` and :func:`focal_kernel` follow the kernel convention of
  :mod:`tracker.losses` on numpy arrays; ``plugins.losses`` registers them as the
  ``torch`` backend. They run over row chunks to bound memory.

The gradient is computed analytically in the forward pass (one pass over the
data) and kept for the backward pass; the formulas are those of
:mod:`plugins.losses`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from tracker.errors import ConfigError
from tracker.losses import REDUCTIONS, LossResult, check_gamma
from tracker.weights import class_weights

Elementwise = Callable[[torch.Tensor, torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None]]
WeightedElementwise = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None, bool], tuple[torch.Tensor, torch.Tensor | None]
]
KERNEL_CHUNK_ELEMENTS = 1 << 20


def _softplus_neg(x: torch.Tensor) -> torch.Tensor:
    """``softplus(-x) = max(-x, 0) + log1p(exp(-|x|))``."""
    return torch.log1p(torch.exp(-x.abs())).add_(torch.clamp(-x, min=0))


def bce_elementwise(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None, pos_weight: torch.Tensor | None, want_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weighted elementwise class-weighted BCE of ``(N, C)`` x, y and the gradient of its sum."""
    pwy = y if pos_weight is None else y * pos_weight
    k = None if pos_weight is None else pwy + (1 - y)
    loss = (1 - y) * x
    loss.add_(_softplus_neg(x) if k is None else _softplus_neg(x).mul_(k))
    if weight is not None:
        loss.mul_(weight)
    if not want_grad:
        return loss, None
    grad = torch.sigmoid(x)
    if k is not None:
        grad.mul_(k)
    grad.sub_(pwy)
    if weight is not None:
        grad.mul_(weight)
    return loss, grad


def focal_elementwise(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None, alpha: float, gamma: float, want_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weighted elementwise sigmoid focal loss of ``(N, C)`` x, y and the gradient of its sum."""
    p, pm = torch.sigmoid(x), torch.sigmoid(-x)
    ce = (1 - y) * x + _softplus_neg(x)
    q = p * (1 - y) + pm * y
    modulating = q.pow(gamma)
    factor = modulating if alpha < 0 else modulating * (alpha * y + (1 - alpha) * (1 - y))
    if weight is not None:
        factor = factor * weight
    loss = ce * factor
    if not want_grad:
        return loss, None
    grad = p * (1 - y) - pm * y
    if gamma != 0.0:
        ratio = (p * pm).mul_(1 - 2 * y).div_(q.clamp(min=torch.finfo(q.dtype).tiny))
        grad.add_(ratio.mul_(ce).mul_(gamma))
    return loss, grad.mul_(factor)


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _run_kernel(
    elementwise: Callable[[torch.Tensor, torch.Tensor, bool], "tuple[torch.Tensor, torch.Tensor | None]"],
    logits: np.ndarray,
    targets: np.ndarray,
    grad: np.ndarray | None,
    reduction: str,
) -> LossResult:
    if reduction not in REDUCTIONS:
        raise ConfigError(f"reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
    n, c = logits.shape
    dtype = torch.float64 if logits.dtype == np.float64 else torch.float32
    scale = 1.0 / (n * c) if reduction == "mean" and n else 1.0
    out = np.empty((n, c), dtype=np.float32) if reduction == "none" else None
    per_class = torch.zeros(c, dtype=torch.float64)
    positives = torch.zeros(c, dtype=torch.int64)
    rows = max(1, KERNEL_CHUNK_ELEMENTS // c)
    with torch.no_grad():
        for a in range(0, n, rows):
            x = _from_numpy(logits[a : a + rows]).to(dtype)
            y = _from_numpy(targets[a : a + rows]).to(dtype)
            loss, gradient = elementwise(x, y, grad is not None)
            per_class += loss.sum(dim=0, dtype=torch.float64)
            positives += (y > 0).sum(dim=0)
            if out is not None:
                out[a : a + rows] = loss.numpy()
            if grad is not None and gradient is not None:
                torch.from_numpy(grad[a : a + rows]).add_(gradient, alpha=scale)
    total = per_class.numpy()
    value: Any = out if out is not None else float(total.sum() * scale)
    return LossResult(loss=value, per_class=total, positives=positives.numpy())


def _tensor(vector: np.ndarray | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if vector is None else torch.as_tensor(np.asarray(vector), dtype=dtype)


def bce_kernel(
    logits: np.ndarray,
    targets: np.ndarray,
    grad: np.ndarray | None,
    *,
    weight: np.ndarray,
    pos_weight: np.ndarray | None,
    reduction: str,
) -> LossResult:
    """Torch kernel of ``class_weighted_bce`` (kernel convention of :mod:`tracker.losses`)."""
    dtype = torch.float64 if logits.dtype == np.float64 else torch.float32
    w, pw = _tensor(weight, dtype), _tensor(pos_weight, dtype)
    return _run_kernel(lambda x, y, g: bce_elementwise(x, y, w, pw, g), logits, targets, grad, reduction)


def focal_kernel(
    logits: np.ndarray,
    targets: np.ndarray,
    grad: np.ndarray | None,
    *,
    weight: np.ndarray,
    alpha: float,
    gamma: float,
    reduction: str,
) -> LossResult:
    """Torch kernel of ``sigmoid_focal`` (kernel convention of :mod:`tracker.losses`)."""
    check_gamma(gamma)
    w = _tensor(weight, torch.float64 if logits.dtype == np.float64 else torch.float32)
    return _run_kernel(lambda x, y, g: focal_elementwise(x, y, w, alpha, gamma, g), logits, targets, grad, reduction)


class _AnalyticLoss(torch.autograd.Function):
    """Loss whose gradient the forward pass computes; backward scales it by grad_output."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor, elementwise: Elementwise, reduction: str) -> Any:
        """The reduced loss; keeps the analytic gradient when x needs one."""
        loss, grad = elementwise(x, y, bool(ctx.needs_input_grad[0]))
        if reduction == "none":
            ctx.save_for_backward(grad)
            ctx.scale = 1.0
            return loss
        scale = 1.0 / loss.numel() if reduction == "mean" and loss.numel() else 1.0
        ctx.scale = scale
        ctx.save_for_backward(grad)
        return (loss.sum(dtype=torch.float64) * scale).to(loss.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        """The kept gradient times grad_output."""
        (grad,) = ctx.saved_tensors
        if grad is None:
            return None, None, None, None
        return grad * (grad_output * ctx.scale), None, None, None


class _ClassLoss(nn.Module):
    """Shared plumbing: class weights, float32 computation, per-class breakdown."""

    weight: torch.Tensor | None

    def __init__(
        self, scheme: str, counts: Any, beta: float, power: float, weights: Any, normalize: str, reduction: str
    ):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ConfigError(f"reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
        self.reduction = reduction
        needs_vector = scheme != "none" or counts is not None
        vector = (
            class_weights(counts, scheme, beta=beta, power=power, weights=weights, normalize=normalize)
            if needs_vector
            else None
        )
        self.register_buffer("weight", _tensor(vector, torch.float32))
        self.last_per_class: torch.Tensor | None = None
        self.last_positives: torch.Tensor | None = None

    def _inputs(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        if logits.shape != targets.shape:
            raise ConfigError(
                f"targets shape {tuple(targets.shape)} does not match logits; expected {tuple(logits.shape)}"
            )
        if not logits.is_floating_point():
            raise ConfigError(f"logits dtype {logits.dtype} is not supported; expected a floating dtype")
        c = logits.shape[-1]
        if self.weight is not None and self.weight.numel() != c:
            raise ConfigError(f"logits have {c} classes; the class weights have {self.weight.numel()}; expected equal")
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        return logits.reshape(-1, c).to(dtype), targets.reshape(-1, c).to(dtype), c

    def _compute(self, logits: torch.Tensor, targets: torch.Tensor, elementwise: WeightedElementwise) -> torch.Tensor:
        shape = logits.shape
        with torch.autocast(device_type=logits.device.type, enabled=False):
            x, y, _ = self._inputs(logits, targets)
            w = None if self.weight is None else self.weight.to(x.dtype)

            def weighted(xx: torch.Tensor, yy: torch.Tensor, want_grad: bool) -> Any:
                loss, grad = elementwise(xx, yy, w, want_grad)
                acc = torch.float32 if x.device.type == "mps" else torch.float64
                self.last_per_class = loss.detach().sum(dim=0, dtype=acc)
                self.last_positives = (yy > 0).sum(dim=0)
                return loss, grad

            out = _AnalyticLoss.apply(x, y, weighted, self.reduction)
        return out.reshape(shape) if self.reduction == "none" else out


class ClassWeightedBCEWithLogits(_ClassLoss):
    """Class-weighted BCE with logits as an ``nn.Module`` (see :mod:`tracker.weights` for schemes).

    ``ClassWeightedBCEWithLogits("effective_number", counts, beta=0.999)(logits, targets)``;
    ``pos_weight`` is a number or a per-class vector.
    """

    pos_weight: torch.Tensor | None

    def __init__(
        self,
        scheme: str = "none",
        counts: Sequence[float] | np.ndarray | None = None,
        *,
        beta: float = 0.999,
        power: float = 0.5,
        weights: Sequence[float] | np.ndarray | None = None,
        normalize: str = "mean",
        pos_weight: float | Sequence[float] | np.ndarray | torch.Tensor | None = None,
        reduction: str = "mean",
    ):
        super().__init__(scheme, counts, beta, power, weights, normalize, reduction)
        pw = None if pos_weight is None else torch.as_tensor(pos_weight, dtype=torch.float32)
        if pw is not None and (pw.ndim > 1 or not torch.all(torch.isfinite(pw) & (pw >= 0))):
            raise ConfigError(f"pos_weight is {pos_weight!r}; expected a number or a 1-D vector of finite numbers >= 0")
        self.register_buffer("pos_weight", pw)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of ``logits`` against ``targets`` (both ``(..., C)``)."""
        pw = self.pos_weight

        def elementwise(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None, want_grad: bool) -> Any:
            return bce_elementwise(x, y, w, None if pw is None else pw.to(x.dtype), want_grad)

        return self._compute(logits, targets, elementwise)


class SigmoidFocalLoss(_ClassLoss):
    """Sigmoid focal loss (``torchvision.ops.sigmoid_focal_loss`` semantics) times a class weight."""

    def __init__(
        self,
        alpha: float = 0.25,
        gamma: float = 2.0,
        scheme: str = "none",
        counts: Sequence[float] | np.ndarray | None = None,
        *,
        beta: float = 0.999,
        power: float = 0.5,
        weights: Sequence[float] | np.ndarray | None = None,
        normalize: str = "mean",
        reduction: str = "mean",
    ):
        super().__init__(scheme, counts, beta, power, weights, normalize, reduction)
        if not gamma >= 0.0 or not alpha <= 1.0:
            raise ConfigError(f"gamma={gamma!r}, alpha={alpha!r}; expected gamma >= 0 and alpha <= 1 (alpha < 0: none)")
        self.alpha, self.gamma = float(alpha), float(gamma)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of ``logits`` against ``targets`` (both ``(..., C)``)."""

        def elementwise(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None, want_grad: bool) -> Any:
            return focal_elementwise(x, y, w, self.alpha, self.gamma, want_grad)

        return self._compute(logits, targets, elementwise)
