"""The classification term of an Ultralytics detection criterion, substituted or observed.

Ultralytics' ``v8DetectionLoss`` computes its classification loss as
``bce(pred_scores, target_scores)`` with ``bce = BCEWithLogitsLoss(reduction="none")``
(shape ``(batch, anchors, C)``), multiplies it by its own class weights when
``cls_pw > 0``, sums it, divides by ``target_scores_sum = target_scores.sum().clamp(min=1)``
and multiplies by the gain ``hyp.cls``. :func:`install` replaces the criterion's
``bce`` attribute with a :class:`ClassificationLoss` that

* computes the elementwise loss with the stock BCE (tracking only) or with a
  tracker loss term (substitution), so every step after it, the normalisation
  and the gain included, stays Ultralytics' own;
* keeps, after each call, the per-class breakdown
  ``sum over anchors / target_scores_sum * hyp.cls`` (times Ultralytics' class
  weights when they are set), whose sum is ``train/cls_loss``.

Terms: ``class_weighted_bce`` and ``sigmoid_focal`` (the built-in plugin's) run
as torch ops on the model's device through :mod:`tracker.torch`. Any other
registered term runs through :class:`HostTermFunction`, a generic autograd
bridge: each forward copies the logits and targets to the host, calls the term's
kernel (numpy, or whatever backend ``auto`` picks) with a gradient buffer, and
copies the elementwise loss and the gradient back, i.e. four host<->device
copies of ``batch x anchors x C`` float32 values per batch (about 43 MB per copy
at batch 16, imgsz 640, 80 classes) plus the kernel's own time, and a device
synchronisation. The gradient it returns is the term's gradient of the summed
loss times the incoming gradient, exact because Ultralytics only sums and scales
the elementwise loss (class weights of its own are refused with a term, see
:mod:`tracker.integrations.ultralytics`).

The criterion is not saved in checkpoints (Ultralytics strips it), so nothing of
tracker is pickled into ``last.pt``/``best.pt``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import nn

from tracker.errors import ConfigError
from tracker.losses import BoundLoss, get_term

BUILTIN_MODULE = "plugins.losses"
WEIGHT_KEYS = ("scheme", "counts", "beta", "power", "weights", "normalize")


class HostTermFunction(torch.autograd.Function):
    """A registered loss term on host arrays, as an elementwise autograd op (reduction ``none``)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, bound: BoundLoss) -> torch.Tensor:
        """Elementwise loss of ``(..., C)`` logits; keeps the term's gradient for the backward pass."""
        shape, c = logits.shape, logits.shape[-1]
        x = logits.detach().to("cpu", torch.float32).reshape(-1, c).contiguous().numpy()
        y = targets.detach().to("cpu", torch.float32).reshape(-1, c).contiguous().numpy()
        grad = np.zeros_like(x) if ctx.needs_input_grad[0] else None
        result = bound(x, y, grad=grad)
        out = torch.from_numpy(np.ascontiguousarray(result.loss, dtype=np.float32)).reshape(shape)
        ctx.save_for_backward(None if grad is None else torch.from_numpy(grad).reshape(shape).to(logits.device))
        return out.to(logits.device)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        """The kept gradient times the incoming gradient."""
        (grad,) = ctx.saved_tensors
        if grad is None:
            return None, None, None
        return (grad * grad_output).to(grad_output.dtype), None, None


class HostTermLoss(nn.Module):
    """``nn.Module`` face of :class:`HostTermFunction` for a bound term (reduction ``none``)."""

    def __init__(self, bound: BoundLoss) -> None:
        super().__init__()
        if bound.params.get("reduction") != "none":
            raise ConfigError(f"loss {bound.term.name!r} must be bound with reduction='none' for the detector")
        self.bound = bound

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Elementwise loss of ``logits`` against ``targets``."""
        return HostTermFunction.apply(logits, targets, self.bound)


class ClassificationLoss(nn.Module):
    """Stand-in for ``v8DetectionLoss.bce``: the elementwise loss, and its per-class breakdown kept aside."""

    def __init__(self, inner: nn.Module, gain: float, class_weights: torch.Tensor | None) -> None:
        super().__init__()
        self.inner = inner
        self.gain = float(gain)
        self.class_weights = None if class_weights is None else class_weights.detach().reshape(-1).clone()
        self._sums: tuple[torch.Tensor, torch.Tensor] | None = None
        self._per_class: torch.Tensor | None = None

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The elementwise loss (shape of ``logits``); records the per-class sums (``last_per_class``)."""
        out = self.inner(logits, targets)
        self.record(out, targets)
        return out

    def record(self, out: torch.Tensor, targets: torch.Tensor) -> None:
        """Keep the per-class sums of the elementwise loss ``out`` and the targets' sum (on their
        device, no sync): two float32 reductions, the dtype of Ultralytics' own ``.sum()`` (cascade
        sums on the CPU, tree reductions on a GPU; a float64 accumulation of float32 input is 6-8x
        slower on the CPU). :attr:`last_per_class` finishes them when it is read."""
        c = out.shape[-1]
        self._sums = (out.detach().reshape(-1, c).sum(dim=0), targets.detach().sum())
        self._per_class = None

    @property
    def last_per_class(self) -> torch.Tensor | None:
        """The last call's per-class breakdown ``sum over anchors / target_scores_sum * hyp.cls``
        (times Ultralytics' class weights when set), float64 (float32 on MPS); None before a call."""
        if self._per_class is None and self._sums is not None:
            sums, total = self._sums
            acc = torch.float32 if sums.device.type == "mps" else torch.float64
            per_class = sums.to(acc)
            if self.class_weights is not None:
                per_class = per_class * self.class_weights.to(per_class)
            self._per_class = per_class / total.to(acc).clamp(min=1) * self.gain
        return self._per_class


def is_builtin(name: str) -> bool:
    """True when ``name`` is a term of the built-in loss plugin (it has a torch module in tracker.torch)."""
    term = get_term(name)
    return getattr(term.reference, "__module__", "") == BUILTIN_MODULE and name in ("class_weighted_bce",
                                                                                     "sigmoid_focal")


def check_loss(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``params`` of loss ``name`` against its schema now (``counts`` may still be filled in later)."""
    term = get_term(name)
    if term.inputs != "logits":
        raise ConfigError(f"loss {name!r} takes {term.inputs} (a self-supervised pair term), not logits and "
                          "targets; a detector's classification loss needs a logits term such as class_weighted_bce")
    return term.check_params({**params, "reduction": "none"})


def term_module(name: str, params: Mapping[str, Any], counts: np.ndarray, num_classes: int) -> tuple[nn.Module, Any]:
    """The elementwise ``nn.Module`` for loss ``name`` and its resolved class weights (or None).

    ``counts`` (the training labels' instances per class) fills the term's
    ``counts`` parameter when the term has one and the user gave none.
    """
    term = get_term(name)
    given = dict(params)
    if "counts" in term.schema() and given.get("counts") is None:
        given["counts"] = np.asarray(counts, dtype=np.float64)
    checked = term.check_params({**given, "reduction": "none"})
    for key in ("counts", "weights", "pos_weight"):
        value = checked.get(key)
        if value is not None and np.ndim(value) == 1 and len(value) != num_classes:
            raise ConfigError(
                f"loss {name!r}: {key} has {len(value)} entries but the dataset has {num_classes} classes; "
                f"pass one value per class"
            )
    resolved = term.resolved(checked, num_classes)
    weights = resolved.get("weight")
    if is_builtin(name):
        from tracker.torch import ClassWeightedBCEWithLogits, SigmoidFocalLoss

        common = {k: checked[k] for k in WEIGHT_KEYS}
        common["counts"] = None if common["counts"] is None else common["counts"].tolist()
        if name == "class_weighted_bce":
            pw = checked["pos_weight"]
            module: nn.Module = ClassWeightedBCEWithLogits(
                **common, pos_weight=None if pw is None else np.asarray(pw, dtype=np.float32), reduction="none"
            )
        else:
            module = SigmoidFocalLoss(alpha=checked["alpha"], gamma=checked["gamma"], **common, reduction="none")
    else:
        module = HostTermLoss(BoundLoss(term, "auto", checked))
    return module, (None if weights is None else np.asarray(weights, dtype=np.float64))


def _leaves(criterion: Any) -> list[Any]:
    """The ``v8DetectionLoss``-like parts of a criterion (itself, or its one-to-many/one-to-one halves)."""
    if isinstance(getattr(criterion, "bce", None), nn.Module):
        return [criterion]
    parts = [getattr(criterion, a, None) for a in ("one2many", "one2one")]
    parts = [p for p in parts if isinstance(getattr(p, "bce", None), nn.Module)]
    if not parts:
        raise ConfigError(
            f"the model's criterion {type(criterion).__name__} has no elementwise classification BCE ('bce'); "
            "per-class losses and loss substitution need a detection criterion such as v8DetectionLoss"
        )
    return parts


def install(model: nn.Module, factory: Callable[[], nn.Module] | None) -> Callable[[], torch.Tensor | None]:
    """Give ``model`` its criterion now, with :class:`ClassificationLoss` in place of each ``bce``.

    ``factory`` builds the substituted term's module (None: keep the stock BCE).
    Returns a function giving the per-class breakdown of the last call, matching
    the criterion's ``cls_loss`` item.
    """
    criterion = getattr(model, "criterion", None)
    if criterion is None:
        criterion = model.criterion = model.init_criterion()
    wrappers = []
    for leaf in _leaves(criterion):
        if isinstance(leaf.bce, ClassificationLoss):
            wrappers.append(leaf.bce)
            continue
        inner = factory() if factory is not None else leaf.bce
        wrapper = ClassificationLoss(inner, leaf.hyp.cls, getattr(leaf, "class_weights", None)).to(leaf.device)
        leaf.bce = wrapper
        wrappers.append(wrapper)
    summed = type(criterion).__name__ == "E2EDetectLoss"  # its loss items are the sum of both halves

    def per_class() -> torch.Tensor | None:
        if not summed:
            return wrappers[-1].last_per_class
        parts = [w.last_per_class for w in wrappers]
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[return-value]

    return per_class
