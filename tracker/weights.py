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

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tracker.errors import ConfigError, DataError

SCHEMES: tuple[str, ...] = ("none", "inverse", "inverse_sqrt", "effective_number", "power", "manual")
NORMALIZATIONS: tuple[str, ...] = ("mean", "sum", "instances", "none")
COUNT_SCHEMES: frozenset[str] = frozenset({"inverse", "inverse_sqrt", "effective_number", "power"})


@dataclass
class ClassCounts:
    """Class names and their instance counts, in class-index order."""

    names: list[str]
    counts: np.ndarray


def _vector(value: Any, what: str) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} is {value!r}; expected a 1-D vector of numbers") from None
    if array.ndim != 1 or array.size == 0:
        raise ConfigError(f"{what} has shape {array.shape}; expected a non-empty 1-D vector")
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"{what}[{i}] is {float(array[i])!r}; expected finite numbers >= 0")
    return array


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


ACCEPTED_COUNTS = (
    "accepted: a COCO instances file (its annotations are counted per category), "
    'the class-count file {"categories": [{"name": ..., "instances": n}, ...]}, '
    '{name: count}, [count, ...], [[name, count], ...] or [{"name": ..., "count": n}, ...]'
)


def _count_of(entry: dict[str, Any], where: str) -> float:
    for key in ("instances", "count", "counts", "n"):
        if key in entry:
            return entry[key]
    raise DataError(
        f"{where} has keys {sorted(entry)}; expected a count under 'instances' or 'count' ({ACCEPTED_COUNTS})"
    )


def _is_coco_instances(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("annotations"), list) and "categories" in data


def _coco_instance_counts(data: dict[str, Any], file: Path) -> list[tuple[str, Any]]:
    """(name, instances) per category of a COCO instances file, in category order (validated)."""
    from tracker.coco.index import from_dict

    index = from_dict(data, path=file)
    return [(str(name), int(n)) for name, n in zip(index.cat_names, index.instances_per_class())]


def _entries(data: Any, path: str) -> list[tuple[str, Any]]:
    if isinstance(data, dict) and "categories" in data:
        data = data["categories"]
    if isinstance(data, dict):
        return [(str(k), v) for k, v in data.items()]
    if not isinstance(data, list):
        raise DataError(f"{path} holds a {type(data).__name__}; expected class counts ({ACCEPTED_COUNTS})")
    entries: list[tuple[str, Any]] = []
    for i, item in enumerate(data):
        if isinstance(item, dict):
            entries.append((str(item.get("name", item.get("id", i))), _count_of(item, f"{path} entry {i}")))
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            entries.append((str(item[0]), item[1]))
        else:
            entries.append((str(i), item))
    return entries


def load_counts(path: str | Path) -> ClassCounts:
    """Read class counts from JSON.

    Accepted: a COCO instances file (``images``, ``annotations``, ``categories``:
    the annotations are counted per category, every category listed, in file order),
    ``{"categories": [{"name": ..., "instances": n}, ...]}`` (the COCO class-count
    file), ``{name: count}``, ``[count, ...]``, ``[[name, count], ...]`` or
    ``[{"name": ..., "count": n}, ...]``. This is the one reader of counts files:
    the CLI, the web UI and the demo all use it. A refused file gets an error that
    lists these formats.
    """
    file = Path(path)
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise DataError(f"counts file {str(file)!r} does not exist; pass a JSON file of class counts") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"counts file {str(file)!r} is not valid JSON ({exc}); expected class counts") from None
    if _is_coco_instances(data):
        entries = _coco_instance_counts(data, file)
    else:
        entries = _entries(data, f"counts file {str(file)!r}")
    if not entries:
        raise DataError(f"counts file {str(file)!r} lists no classes; expected one count per class ({ACCEPTED_COUNTS})")
    names = [name for name, _ in entries]
    values = [count for _, count in entries]
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        i = next(i for i, v in enumerate(values) if isinstance(v, bool) or not isinstance(v, (int, float)))
        raise DataError(
            f"counts file {str(file)!r}: count of {names[i]!r} is {values[i]!r}; expected a number >= 0 "
            f"({ACCEPTED_COUNTS})"
        )
    try:
        counts = _vector(values, f"counts file {str(file)!r}: counts")
    except ConfigError as exc:
        raise DataError(str(exc)) from None
    return ClassCounts(names=names, counts=counts)
