"""Pair terms: loss terms whose two inputs are embeddings or student/teacher logits.

Self-supervised losses compare two arrays of one shape instead of logits with
targets. A :class:`tracker.losses.LossTerm` says so with ``inputs``:

* ``"views"``: two embedding views ``(z1, z2)`` of shape ``(N, D)`` (SimCLR,
  VICReg, Barlow Twins), or a predictor output and its target ``(p, z)``
  (BYOL/SimSiam);
* ``"student_teacher"``: student and teacher logits of shape ``(N, K)`` (DINO).

Rules every pair kernel (and reference) follows, checked by
:mod:`tracker.testing`:

* it is called as ``fn(a, b, grad, **resolved)`` with C-contiguous 2-D ``(N, D)``
  arrays of one dtype among ``kernel.dtypes`` and ``grad`` None or a pair
  ``(grad_a, grad_b)``, each None (that gradient is not wanted) or a writeable
  C-contiguous ``(N, D)`` float32/float64 array; ``resolve`` gets ``D`` as its
  ``num_classes``;
* it ADDS dL/da into ``grad_a`` and dL/db into ``grad_b``. A term whose
  ``stops_gradient(resolved)`` is true treats ``b`` as a constant (the
  stop-gradient of SimSiam's and BYOL's target, DINO's teacher) and leaves
  ``grad_b`` untouched;
* it returns a :class:`tracker.losses.LossResult` whose ``per_class`` holds the
  term's ``components`` (shape ``(K,)``, float64) summed over the samples, so that
  they add up to the ``sum`` loss; ``positives`` holds ``N`` for each component;
* reductions: ``mean`` is the loss as the method's paper defines it (a mean over
  samples, or the batch loss for VICReg and Barlow Twins), ``sum`` is ``N`` times
  it, ``none`` (for terms that decompose per sample) the ``(N,)`` losses whose mean
  is ``mean``. A term lists the ones it supports in ``reductions``;
* ``N == 0`` gives loss 0.0, zero components and untouched gradients.

Input handling in ``tracker.loss(name)(a, b, grad=(ga, gb))``: both inputs of
shape ``(..., D)`` are flattened to ``(N, D)``; ``b`` is cast to ``a``'s dtype.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tracker.errors import ConfigError, PluginError
from tracker.losses import DTYPES, INPUT_KINDS, REDUCTIONS, LossResult, _logits_array, _to_numpy, dtype_name

PAIR_KINDS: tuple[str, ...] = tuple(k for k in INPUT_KINDS if k != "logits")


def validate_pair_term(term: Any) -> None:
    """Raise PluginError when a pair term's declaration is malformed."""
    where = f"loss term {term.name!r}"
    if term.inputs not in INPUT_KINDS:
        raise PluginError(f"{where}: inputs {term.inputs!r} is not one of {', '.join(INPUT_KINDS)}")
    if term.inputs == "logits":
        raise PluginError(f"{where}: components and reductions are declared by pair terms only (inputs {PAIR_KINDS})")
    if not term.components or not all(isinstance(c, str) and c for c in term.components):
        raise PluginError(f"{where}: a pair term names its loss components, e.g. components=('loss',)")
    bad = [r for r in term.reductions if r not in REDUCTIONS]
    if bad or not {"mean", "sum"} <= set(term.reductions) or len(set(term.reductions)) != len(term.reductions):
        raise PluginError(
            f"{where}: reductions {term.reductions!r} must include 'mean' and 'sum' and use only {REDUCTIONS}"
        )
    if term.stops_gradient is not None and not callable(term.stops_gradient):
        raise PluginError(f"{where}: stops_gradient must be a callable of the resolved parameters")


def stops_gradient(term: Any, resolved: dict[str, Any]) -> bool:
    """Whether ``term`` treats its second input as a constant for these parameters."""
    return bool(term.stops_gradient(resolved)) if term.stops_gradient is not None else False


def _grad_buffer(value: Any, shape: tuple[int, ...], which: str) -> np.ndarray | None:
    if value is None:
        return None
    g = _to_numpy(value)
    if not isinstance(g, np.ndarray) or g.dtype not in (np.float32, np.float64):
        raise ConfigError(f"{which} is {type(value).__name__}; expected a float32/float64 array of shape {shape}")
    if g.shape != shape:
        raise ConfigError(f"{which} shape {g.shape} does not match the inputs; expected {shape}")
    if not g.flags.c_contiguous or not g.flags.writeable:
        raise ConfigError(f"{which} must be a writeable C-contiguous array (the loss adds into it in place)")
    return g


def prepare_pair(
    a: Any, b: Any, grad: Any, kernel_dtypes: Sequence[str] = DTYPES
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray | None, np.ndarray | None] | None, tuple[int, ...]]:
    """Check and flatten a pair to ``(N, D)``; return ``(a, b, grads_or_None, original_shape)``."""
    x = _logits_array(a, kernel_dtypes)
    y = _to_numpy(b)
    y = y if isinstance(y, np.ndarray) else np.asarray(y)
    if y.shape != x.shape:
        raise ConfigError(f"second input shape {y.shape} does not match the first; expected {x.shape}")
    if y.dtype.kind != "f" and dtype_name(y.dtype) != "bfloat16":
        raise ConfigError(f"second input dtype {y.dtype} is not a float dtype")
    y = np.ascontiguousarray(y if y.dtype == x.dtype else y.astype(x.dtype))
    shape = tuple(x.shape)
    grads = None
    if grad is not None:
        if not isinstance(grad, (tuple, list)) or len(grad) != 2:
            raise ConfigError(
                "grad of a pair term is a pair (grad_a, grad_b); pass (g, None) for the first input's gradient only"
            )
        ga, gb = (_grad_buffer(g, shape, f"grad[{i}]") for i, g in enumerate(grad))
        grads = (None if ga is None else ga.reshape(-1, shape[-1]), None if gb is None else gb.reshape(-1, shape[-1]))
    d = shape[-1]
    return x.reshape(-1, d), y.reshape(-1, d), grads, shape


def call_pair(bound: Any, kernel: Any, a: Any, b: Any, grad: Any) -> LossResult:
    """What :class:`tracker.losses.BoundLoss` does for a pair term."""
    x, y, grads, shape = prepare_pair(a, b, grad, kernel.dtypes)
    resolved = bound.resolved(shape[-1])
    result = kernel.fn(x, y, grads, **resolved)
    if resolved["reduction"] == "none":
        result.loss = np.asarray(result.loss, dtype=np.float32).reshape(shape[:-1])
    return result


def pair_result(
    components: np.ndarray,
    per_sample: np.ndarray | None,
    n: int,
    reduction: str,
    grads: tuple[np.ndarray | None, np.ndarray | None] | None,
    gradients: tuple[np.ndarray | None, np.ndarray | None],
) -> LossResult:
    """Finish a float64 pair reference: apply ``reduction``, ADD the scaled gradients.

    ``components`` are the loss components summed over samples (they add up to the
    ``sum`` loss); ``per_sample`` the ``(N,)`` losses (None for batch-level terms);
    ``gradients`` the derivatives of the ``sum`` loss with respect to each input
    (None where not computed).
    """
    if reduction not in REDUCTIONS or (reduction == "none" and per_sample is None):
        raise ConfigError(f"reduction {reduction!r} is not supported here")
    comps = np.asarray(components, dtype=np.float64)
    scale = 1.0 / n if reduction == "mean" and n else 1.0
    if grads is not None and n:
        for buffer, gradient in zip(grads, gradients):
            if buffer is not None and gradient is not None:
                buffer += gradient * scale
    if reduction == "none":
        value: Any = np.asarray(per_sample, dtype=np.float32)
    else:
        value = float(comps.sum() * scale)
    return LossResult(loss=value, per_class=comps, positives=np.full(comps.size, n, dtype=np.int64))


def empty_result(components: int, reduction: str) -> LossResult:
    """The result of a pair term on ``N == 0``."""
    loss: Any = np.zeros(0, dtype=np.float32) if reduction == "none" else 0.0
    return LossResult(loss=loss, per_class=np.zeros(components), positives=np.zeros(components, dtype=np.int64))
