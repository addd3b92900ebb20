"""Typed decoding of a COCO instances file straight into columns (the fast path).

``msgspec`` decodes the bytes against the small record types below: only the
fields the index needs become Python objects, and every other value
(``segmentation`` polygons, captions, licences, ...) is skipped while parsing,
without a regex pass and without building a dict per record. Records then become
numpy columns through C-level iteration (``attrgetter`` + ``np.fromiter``).

This path accepts exactly the files the general path (``orjson`` + the checks of
:mod:`tracker.coco.validate`) accepts without complaint. On anything it cannot
take as is (a missing key, a value of another type, an ``iscrowd`` other than 0 or
1, an id beyond 64 bits, invalid JSON) it returns None and the caller falls back to
the general path, which names the file, the record and the fix. Semantic checks
(duplicate ids, dangling references, negative boxes) run on the columns, shared
with the general path.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

_NAN = float("nan")


class _Image(msgspec.Struct, gc=False):
    id: int
    width: int = 0
    height: int = 0
    file_name: str = ""


class _Category(msgspec.Struct, gc=False):
    id: int
    name: str
    supercategory: Any = ""


class _Annotation(msgspec.Struct, gc=False):
    id: int
    image_id: int
    category_id: int
    bbox: tuple[float, float, float, float]
    area: float = _NAN
    iscrowd: int | bool = 0


class _Instances(msgspec.Struct, gc=False):
    images: list[_Image]
    annotations: list[_Annotation]
    categories: list[_Category]


_DECODER = msgspec.json.Decoder(_Instances)


def _column(records: list[Any], name: str, dtype: type) -> np.ndarray:
    return np.fromiter(map(attrgetter(name), records), dtype=dtype, count=len(records))


def decode(data: bytes | memoryview) -> dict[str, Any] | None:
    """Columns of a COCO file's images, categories and annotations, or None (see module doc).

    Returns ``{"images": {...}, "categories": {...}, "annotations": {...}}`` where
    annotations hold ``ann_ids``, ``image_id``, ``category_id``, ``bbox`` (n x 4),
    ``area`` (filled with width x height where absent) and ``iscrowd`` (bool).
    """
    try:
        doc = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    try:
        return _columns(doc)
    except (OverflowError, ValueError):
        return None


def _columns(doc: _Instances) -> dict[str, Any] | None:
    images, cats, anns = doc.images, doc.categories, doc.annotations
    n = len(anns)
    crowd = _column(anns, "iscrowd", np.int64)
    if n and not np.isin(crowd, (0, 1)).all():
        return None
    bbox = np.fromiter(chain.from_iterable(map(attrgetter("bbox"), anns)), dtype=np.float64, count=4 * n)
    bbox = bbox.reshape(n, 4)
    area = _column(anns, "area", np.float64)
    missing = np.isnan(area)
    area[missing] = bbox[missing, 2] * bbox[missing, 3]
    return {
        "images": {
            "image_ids": _column(images, "id", np.int64),
            "image_width": _column(images, "width", np.int64),
            "image_height": _column(images, "height", np.int64),
            "file_names": list(map(attrgetter("file_name"), images)),
        },
        "categories": {
            "ids": _column(cats, "id", np.int64),
            "names": list(map(attrgetter("name"), cats)),
            "supercategories": [str(c.supercategory) for c in cats],
        },
        "annotations": {
            "ann_ids": _column(anns, "id", np.int64),
            "image_id": _column(anns, "image_id", np.int64),
            "category_id": _column(anns, "category_id", np.int64),
            "bbox": bbox,
            "area": area,
            "iscrowd": crowd.astype(bool),
        },
    }
