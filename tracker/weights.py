"""Per-class weights from class counts (pure numpy).

Schemes, for a class with ``n_c > 0`` instances:

* ``none``: 1;
* ``inverse``: ``1 / n_c``;
* ``inverse_sqrt``: ``1 / sqrt(n_c)``;
* ``effective_number``: ``(1 - beta) / (1 - beta**n_c)`` (Cui et al. 2019), ``0 <= beta < 1``;
* ``power``: ``(1 / n_c) ** p`` (Ultralytics' class-weight power), ``p >= 0``;
* ``manual``: the given vector (finite, >= 0, not all zero).

Zero counts: a class with ``n_c == 0`` gets the largest raw weight of the classes
that do occur (it is treated as the rarest class seen), so it is finite and never
dominates; when no class occurs every raw weight is 1.

Normalisation (applied to every scheme, ``manual`` included):

* ``mean`` (default): the weights average 1 over the C classes, i.e. they sum to
  C (Cui et al.'s normalisation); ``sum`` names the same rule;
* ``instances``: the instance-weighted mean ``sum(n_c * w_c) / sum(n_c)`` is 1, so
  the weighted loss keeps the unweighted loss's scale on the training distribution
  (needs counts);
* ``none``: the raw weights.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tracker.coco.counts import ACCEPTED_COUNTS, ClassCounts, load_counts
from tracker.coco.counts import count_vector as _vector
from tracker.errors import ConfigError

SCHEMES: tuple[str, ...] = ("none", "inverse", "inverse_sqrt", "effective_number", "power", "manual")
NORMALIZATIONS: tuple[str, ...] = ("mean", "sum", "instances", "none")
COUNT_SCHEMES: frozenset[str] = frozenset({"inverse", "inverse_sqrt", "effective_number", "power"})

# The counts reader lives in tracker.coco.counts; these names stay importable from here.
__all__ = [
    "ACCEPTED_COUNTS", "COUNT_SCHEMES", "ClassCounts", "NORMALIZATIONS", "SCHEMES", "class_weights",
    "load_counts",
]


def _raw_weights(counts: np.ndarray, scheme: str, beta: float, power: float) -> np.ndarray:
    present = counts > 0
    n = np.where(present, counts, 1.0)
    if scheme == "inverse":
        raw = 1.0 / n
    elif scheme == "inverse_sqrt":
        raw = 1.0 / np.sqrt(n)
    elif scheme == "power":
        raw = np.exp(-power * np.log(n))
    elif beta == 0.0:
        raw = np.ones_like(n)
    else:
        raw = (1.0 - beta) / -np.expm1(n * np.log(beta))
    if not present.any():
        return np.ones_like(n)
    return np.where(present, raw, raw[present].max())


def class_weights(
    counts: Sequence[float] | np.ndarray | None = None,
    scheme: str = "inverse",
    *,
    beta: float = 0.999,
    power: float = 0.5,
    weights: Sequence[float] | np.ndarray | None = None,
    normalize: str = "mean",
    num_classes: int | None = None,
) -> np.ndarray:
    """Per-class weights (float64, length C) under ``scheme`` and ``normalize`` (see the module doc).

    ``num_classes`` fixes C when given; ``counts`` (and ``weights`` for ``manual``)
    must then have C entries.
    """
    if scheme not in SCHEMES:
        raise ConfigError(f"Unknown weight scheme {scheme!r}; available: {', '.join(SCHEMES)}")
    if normalize not in NORMALIZATIONS:
        raise ConfigError(f"normalize is {normalize!r}; expected one of {', '.join(NORMALIZATIONS)}")
    if not 0.0 <= beta < 1.0:
        raise ConfigError(f"beta is {beta!r}; expected 0 <= beta < 1 (e.g. 0.999)")
    if not 0.0 <= power < np.inf:
        raise ConfigError(f"power is {power!r}; expected a number >= 0 (e.g. 0.5)")
    n = None if counts is None else _vector(counts, "counts")
    if (scheme in COUNT_SCHEMES or normalize == "instances") and n is None:
        why = f"scheme {scheme!r}" if scheme in COUNT_SCHEMES else "normalize 'instances'"
        raise ConfigError(f"{why} needs class counts; pass counts=[n_0, ..., n_C-1]")
    if scheme == "manual":
        if weights is None:
            raise ConfigError("scheme 'manual' needs weights=[w_0, ..., w_C-1]")
        raw = _vector(weights, "weights")
        if not raw.any():
            raise ConfigError("weights are all zero; expected at least one positive weight")
    elif weights is not None:
        raise ConfigError(f"weights are only used with scheme 'manual', not {scheme!r}; drop weights or use 'manual'")
    if num_classes is not None:
        size = num_classes
    elif scheme == "manual":
        size = len(raw)
    elif n is not None:
        size = len(n)
    else:
        raise ConfigError("scheme 'none' needs num_classes or counts to know how many classes there are")
    for what, vec in (("counts", n), ("weights", raw if scheme == "manual" else None)):
        if vec is not None and len(vec) != size:
            raise ConfigError(f"{what} has {len(vec)} entries; expected {size} (one per class)")
    if scheme == "none":
        raw = np.ones(size)
    elif scheme != "manual":
        assert n is not None  # count schemes were refused without counts above
        raw = _raw_weights(n, scheme, beta, power)
    return _normalized(raw, n, normalize)


def _normalized(raw: np.ndarray, counts: np.ndarray | None, normalize: str) -> np.ndarray:
    if normalize in ("mean", "sum"):
        return raw * (len(raw) / raw.sum())
    if normalize == "instances":
        assert counts is not None
        mass = float((counts * raw).sum())
        if mass == 0.0:
            raise ConfigError("normalize 'instances' needs at least one class with a positive count and weight")
        return raw * (counts.sum() / mass)
    return raw.copy()
