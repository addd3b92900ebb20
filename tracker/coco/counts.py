"""Class counts: the one reader of class-count files, and COCO train2017's shipped counts.

:func:`load_counts` reads every accepted format (a COCO instances file, the COCO
class-count file, ``{name: count}``, ``[count, ...]``, ``[[name, count], ...]``,
``[{"name": ..., "count": n}, ...]``); the CLI, the web UI, the class weights
(:mod:`tracker.weights`), the COCO statistics and the demos all use it.
:func:`coco_train2017_counts` gives the 80 COCO class names and their train2017
instance counts from the copy shipped with the package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from tracker.errors import ConfigError, DataError


@dataclass
class ClassCounts:
    """Class names and their instance counts, in class-index order."""

    names: list[str]
    counts: np.ndarray


def count_vector(value: Any, what: str) -> np.ndarray:
    """``value`` as a non-empty 1-D float64 vector of finite numbers >= 0 (``what`` names it in errors)."""
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
        counts = count_vector(values, f"counts file {str(file)!r}: counts")
    except ConfigError as exc:
        raise DataError(str(exc)) from None
    return ClassCounts(names=names, counts=counts)


def coco_train2017_counts() -> tuple[list[str], np.ndarray]:
    """The 80 COCO class names and their train2017 instance counts (shipped with the package)."""
    with resources.as_file(resources.files("tracker.data") / "coco_train2017_class_counts.json") as path:
        loaded = load_counts(path)
    return loaded.names, loaded.counts
