"""The ``poly1_bce`` loss term: Poly-1 binary cross-entropy (Leng et al., PolyLoss, ICLR 2022).

Elementwise, with x = logit, y = target in [0, 1], p = sigmoid(x) and
p_t = p*y + (1-p)*(1-y)::

    l  = bce(x, y) + epsilon * (1 - p_t)
    dl/dx = (p - y) + epsilon * p * (1 - p) * (1 - 2y)

``bce`` is computed stably as ``max(x, 0) - x*y + log1p(exp(-|x|))``, and ``p`` from
``exp(-|x|)`` so that no exponential overflows for |x| up to 1e4. ``epsilon = 0`` is
plain BCE; the paper uses epsilon in [-1, 10] (-1 keeps the loss non-negative).

Two implementations, both following the kernel rules of ``tracker.losses``:

* :func:`poly1_reference`, the float64 oracle the conformance checks compare with;
* :func:`poly1_numpy`, the fast kernel: float32 arithmetic (float64 for float64
  inputs), per-class sums accumulated in float64, and the gradient ADDED into
  ``grad`` (``grad += g``), never assigned.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tracker.errors import ConfigError
from tracker.losses import REDUCTIONS, Kernel, LossResult, LossTerm, Param, reduce_elementwise

EPSILON = Param("epsilon", "float", 1.0, minimum=-1.0, maximum=100.0, doc="weight of the (1 - p_t) term; 0 is BCE")


def _elementwise(x: np.ndarray, y: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """Loss and its derivative per element, in the dtype of ``x``."""
    e = np.exp(-np.abs(x))
    bce = np.maximum(x, 0) - x * y + np.log1p(e)
    p = np.where(x >= 0, 1 / (1 + e), e / (1 + e))
    eps = x.dtype.type(epsilon)
    loss = bce + eps * (p + y - 2 * p * y)
    gradient = (p - y) + eps * p * (1 - p) * (1 - 2 * y)
    return loss, gradient


def poly1_reference(
    logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, *, epsilon: float, reduction: str
) -> LossResult:
    """The float64 reference (the oracle of the conformance checks)."""
    x, y = logits.astype(np.float64), targets.astype(np.float64)
    loss, gradient = _elementwise(x, y, epsilon)
    return reduce_elementwise(loss, gradient if grad is not None else None, y, grad, reduction)


def poly1_numpy(
    logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, *, epsilon: float, reduction: str
) -> LossResult:
    """The numpy kernel: float32 arithmetic, float64 sums, gradient ADDED into ``grad``."""
    if reduction not in REDUCTIONS:
        raise ConfigError(f"reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
    dtype = np.float64 if logits.dtype == np.float64 else np.float32
    x, y = logits.astype(dtype, copy=False), targets.astype(dtype, copy=False)
    n, c = x.shape
    loss, gradient = _elementwise(x, y, epsilon)
    per_class = loss.sum(axis=0, dtype=np.float64)
    positives = np.count_nonzero(targets > 0, axis=0).astype(np.int64)
    scale = 1.0 / (n * c) if reduction == "mean" and n else 1.0
    if grad is not None and n:
        grad += gradient * grad.dtype.type(scale)  # ADD: other terms' gradients may already be in grad
    value: Any = loss.astype(np.float32) if reduction == "none" else float(per_class.sum() * scale)
    return LossResult(loss=value, per_class=per_class, positives=positives)


def _examples(num_classes: int) -> list[dict[str, Any]]:
    """Parameter sets the conformance checks run: the default, a negative and a large epsilon."""
    return [{}, {"epsilon": -1.0}, {"epsilon": 2.5}]


POLY1 = LossTerm(
    name="poly1_bce",
    reference=poly1_reference,
    params=(EPSILON,),
    examples=_examples,
    description="Poly-1 BCE: bce + epsilon * (1 - p_t) (PolyLoss, Leng et al. 2022)",
)
POLY1_NUMPY = Kernel(
    term="poly1_bce",
    backend="numpy",
    fn=poly1_numpy,
    dtypes=("float32", "float64"),
    description="float32 numpy kernel with float64 sums",
)
