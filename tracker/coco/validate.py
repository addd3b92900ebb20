"""COCO records to validated numpy columns.

Each list is first converted in one vectorised pass. Only when that pass fails
(a missing key, a value of the wrong type, a ragged bbox) are the records checked
one by one, to name the first bad one. Semantic checks (duplicate ids, ids that
point nowhere, negative box sizes) are vectorised and always run.

Messages name the record as ``annotation #<position> (id <id>)``: the position is
the 0-based index in the file's ``annotations`` list.
"""

from __future__ import annotations

import math
from itertools import chain
from numbers import Real
from typing import Any

import numpy as np

from tracker.errors import DataError

_NAN = float("nan")
_SKIP_HINT = "fix the file, or load it with skip_invalid=True (--skip-invalid) to skip bad annotations"
_BBOX = "expected 4 numbers [x, y, width, height] with width and height >= 0"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(float(v))


def _typed(values: list[Any], allowed: set[type], dtype: type) -> np.ndarray | None:
    """``values`` as a ``dtype`` array when every value's type is in ``allowed``, else None.

    Checking the set of types first (a C-speed pass) keeps ``np.fromiter`` from
    quietly converting strings or floats.
    """
    if not set(map(type, values)) <= allowed:
        return None
    try:
        return np.fromiter(values, dtype=dtype, count=len(values))
    except (OverflowError, ValueError):
        return None


def _ints(values: list[Any]) -> np.ndarray | None:
    """An int64 array of ``values``, or None when one of them is not an integer."""
    return _typed(values, {int}, np.int64)


def _name(kind: str, pos: int, rec: Any) -> str:
    rid = rec.get("id") if isinstance(rec, dict) else None
    return f"{kind} #{pos}" + (f" (id {rid!r})" if rid is not None else "")


def _require_int(kind: str, records: list[Any], key: str, where: str) -> np.ndarray:
    """The integer field ``key`` of every record, or a DataError naming the first bad one."""
    try:
        arr = _ints([r[key] for r in records])
    except (KeyError, TypeError, IndexError):
        arr = None
    if arr is not None:
        return arr
    for pos, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise DataError(f"{where}: {kind} #{pos} is a {type(rec).__name__}; expected an object")
        if key not in rec:
            raise DataError(f"{where}: {_name(kind, pos, rec)}: missing field {key!r}; expected an integer")
        if not _is_int(rec[key]):
            raise DataError(
                f"{where}: {_name(kind, pos, rec)}: field {key!r} is {rec[key]!r}; expected an integer"
            )
    raise DataError(f"{where}: {kind} field {key!r} holds integers too large for 64 bits")


def _duplicates(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose id appeared on an earlier row, and that earlier (first) row for each."""
    order = np.argsort(ids, kind="stable")
    ranked = ids[order]
    later = np.flatnonzero(ranked[1:] == ranked[:-1]) + 1
    run_start = np.maximum.accumulate(np.where(np.diff(ranked, prepend=ranked[:1] - 1) != 0,
                                               np.arange(len(ranked)), 0))
    return order[later], order[run_start[later]]


def _check_unique(kind: str, ids: np.ndarray, where: str) -> None:
    dup_rows, first_rows = _duplicates(ids)
    if len(dup_rows) == 0:
        return
    i = int(np.argmin(dup_rows))
    row, first = int(dup_rows[i]), int(first_rows[i])
    raise DataError(
        f"{where}: {kind} #{row} (id {int(ids[row])}): duplicate {kind} id {int(ids[row])} "
        f"(also {kind} #{first}); expected unique ids"
    )


def image_columns(images: list[Any], where: str) -> dict[str, Any]:
    """Validated image columns: ids, width, height, file names and positions."""
    ids = _require_int("image", images, "id", where)
    _check_unique("image", ids, where)
    try:
        width = _ints([r.get("width", 0) for r in images])
        height = _ints([r.get("height", 0) for r in images])
    except AttributeError:  # pragma: no cover - _require_int already checked the records
        width = height = None
    if width is None or height is None:
        for pos, rec in enumerate(images):
            for key in ("width", "height"):
                if key in rec and not _is_int(rec[key]):
                    raise DataError(
                        f"{where}: {_name('image', pos, rec)}: field {key!r} is {rec[key]!r}; "
                        "expected an integer number of pixels"
                    )
    names = [str(r.get("file_name", "")) for r in images]
    return {
        "image_ids": ids, "image_width": width, "image_height": height, "file_names": names,
        "image_pos": np.arange(len(images), dtype=np.int64),
    }


def category_columns(categories: list[Any], where: str) -> dict[str, Any]:
    """Validated category columns, sorted by id."""
    ids = _require_int("category", categories, "id", where)
    _check_unique("category", ids, where)
    for pos, rec in enumerate(categories):
        if not isinstance(rec.get("name"), str):
            raise DataError(
                f"{where}: {_name('category', pos, rec)}: field 'name' is {rec.get('name')!r}; "
                "expected a string"
            )
    order = np.argsort(ids, kind="stable")
    return {
        "cat_ids": ids[order],
        "cat_names": [categories[i]["name"] for i in order],
        "supercategories": [str(categories[i].get("supercategory", "")) for i in order],
    }


def _record_problem(rec: Any) -> str | None:
    """Why one annotation record is structurally bad, or None."""
    if not isinstance(rec, dict):
        return f"is a {type(rec).__name__}; expected an object"
    for key in ("id", "image_id", "category_id"):
        if key not in rec:
            return f"missing field {key!r}; expected an integer"
        if not _is_int(rec[key]):
            return f"field {key!r} is {rec[key]!r}; expected an integer"
    box = rec.get("bbox")
    if "bbox" not in rec:
        return f"missing field 'bbox'; {_BBOX}"
    if not isinstance(box, list) or len(box) != 4 or not all(_is_num(v) for v in box):
        return f"field 'bbox' is {box!r}; {_BBOX}"
    if "area" in rec and not _is_num(rec["area"]):
        return f"field 'area' is {rec['area']!r}; expected a number >= 0"
    if rec.get("iscrowd", 0) not in (0, 1):
        return f"field 'iscrowd' is {rec['iscrowd']!r}; expected 0 or 1"
    return None


def _extract(anns: list[Any]) -> dict[str, np.ndarray] | None:
    """Vectorised columns of ``anns``, or None when a record is structurally bad."""
    if not anns:
        return _empty()
    try:
        ids = _ints([a["id"] for a in anns])
        img = _ints([a["image_id"] for a in anns])
        cat = _ints([a["category_id"] for a in anns])
        boxes = [a["bbox"] for a in anns]
        area = _typed([a.get("area", _NAN) for a in anns], {int, float}, np.float64)
        crowd = _typed([a.get("iscrowd", 0) for a in anns], {int, bool}, np.int64)
    except (KeyError, TypeError, AttributeError):
        return None
    if ids is None or img is None or cat is None or area is None or crowd is None:
        return None
    if set(map(type, boxes)) != {list} or set(map(len, boxes)) != {4}:
        return None
    flat = _typed(list(chain.from_iterable(boxes)), {int, float}, np.float64)
    if flat is None or not np.isin(crowd, (0, 1)).all():
        return None
    bbox = flat.reshape(len(anns), 4)
    missing = np.isnan(area)
    area[missing] = bbox[missing, 2] * bbox[missing, 3]
    return {"ann_ids": ids, "image_id": img, "category_id": cat, "bbox": bbox,
            "area": area, "iscrowd": crowd.astype(bool)}


def _empty() -> dict[str, np.ndarray]:
    z = np.zeros(0, dtype=np.int64)
    return {"ann_ids": z, "image_id": z, "category_id": z, "bbox": np.zeros((0, 4)),
            "area": np.zeros(0), "iscrowd": np.zeros(0, dtype=bool)}


def _semantic_problems(
    cols: dict[str, np.ndarray], image_ids: np.ndarray, cat_ids: np.ndarray,
) -> tuple[dict[int, str], np.ndarray, np.ndarray]:
    """Problems by row; and the image / category index of each row."""
    problems: dict[int, str] = {}

    def flag(mask: np.ndarray, reason: Any) -> None:
        for row in np.flatnonzero(mask):
            problems.setdefault(int(row), reason(int(row)))

    bbox, area = cols["bbox"], cols["area"]
    flag(~np.isfinite(bbox).all(axis=1) | (bbox[:, 2] < 0) | (bbox[:, 3] < 0),
         lambda r: f"field 'bbox' is {bbox[r].tolist()}; {_BBOX}")
    flag(~np.isfinite(area) | (area < 0), lambda r: f"field 'area' is {area[r]}; expected a number >= 0")
    img_order = np.argsort(image_ids, kind="stable")
    img_idx = _lookup(image_ids, img_order, cols["image_id"])
    flag(img_idx < 0, lambda r: f"field 'image_id' is {int(cols['image_id'][r])}, which points to no "
         "image; expected the id of a record in 'images'")
    cat_idx = _lookup(cat_ids, np.arange(len(cat_ids)), cols["category_id"])
    flag(cat_idx < 0, lambda r: f"field 'category_id' is {int(cols['category_id'][r])}, which points "
         "to no category; expected the id of a record in 'categories'")
    ids = cols["ann_ids"]
    clean_mask = np.ones(len(ids), dtype=bool)
    clean_mask[list(problems)] = False
    clean = np.flatnonzero(clean_mask)
    dup_rows, first_rows = _duplicates(ids[clean])
    for row, first in zip(clean[dup_rows].tolist(), clean[first_rows].tolist()):
        problems[row] = f"duplicate annotation id {int(ids[row])} (first at row {first})"
    return problems, img_idx, cat_idx


def _lookup(sorted_keys_src: np.ndarray, order: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index in ``sorted_keys_src`` of each value, or -1 where absent."""
    keys = sorted_keys_src[order]
    if len(keys) == 0:
        return np.full(len(values), -1, dtype=np.int64)
    pos = np.clip(np.searchsorted(keys, values), 0, len(keys) - 1)
    return np.where(keys[pos] == values, order[pos], -1).astype(np.int64)


def annotation_columns(
    anns: list[Any], image_ids: np.ndarray, cat_ids: np.ndarray, where: str, skip_invalid: bool,
) -> tuple[dict[str, np.ndarray], list[Any]]:
    """Validated annotation columns and the list of skipped records (lenient mode)."""
    from tracker.coco.index import Skipped

    positions = np.arange(len(anns), dtype=np.int64)
    problems: dict[int, str] = {}
    cols = _extract(anns)
    if cols is None:
        for pos, rec in enumerate(anns):
            reason = _record_problem(rec)
            if reason is not None:
                problems[pos] = reason
        positions = np.array([p for p in range(len(anns)) if p not in problems], dtype=np.int64)
        cols = _extract([anns[p] for p in positions]) if len(positions) else _empty()
        assert cols is not None
    sem, img_idx, cat_idx = _semantic_problems(cols, image_ids, cat_ids)
    for row, reason in sem.items():
        fixed = _fix_row(reason, positions) if "(first at row " in reason else reason
        problems[int(positions[row])] = fixed
    if problems and not skip_invalid:
        pos = min(problems)
        raise DataError(
            f"{where}: {_name('annotation', pos, anns[pos])}: {problems[pos]}; {_SKIP_HINT}"
            + (f" ({len(problems)} bad annotations in all)" if len(problems) > 1 else "")
        )
    keep = np.ones(len(positions), dtype=bool)
    bad_rows = np.array(sorted(sem), dtype=np.int64)
    keep[bad_rows] = False
    skipped = [
        Skipped(p, anns[p].get("id") if isinstance(anns[p], dict) else None, problems[p])
        for p in sorted(problems)
    ]
    out = {
        "ann_ids": cols["ann_ids"][keep], "ann_image": img_idx[keep].astype(np.int32),
        "ann_category": cat_idx[keep].astype(np.int32), "bbox": cols["bbox"][keep],
        "area": cols["area"][keep], "iscrowd": cols["iscrowd"][keep], "ann_pos": positions[keep],
    }
    return out, skipped


def _fix_row(reason: str, positions: np.ndarray) -> str:
    """Rewrite ``(first at row R)`` as ``(first at annotation #P)`` with the file position."""
    head, _, tail = reason.partition("(first at row ")
    row = int(tail.rstrip(")"))
    return f"{head}(first at annotation #{int(positions[row])})"


def typed_columns(cols: dict[str, Any], where: str) -> dict[str, Any] | None:
    """CocoIndex fields from :func:`tracker.coco.typed.decode`'s columns, or None.

    Runs the same uniqueness and semantic checks as the general path. None when an
    annotation has a problem: the caller then takes the general path, which names
    the record (or skips it with ``skip_invalid``).
    """
    img, cat, ann = cols["images"], cols["categories"], cols["annotations"]
    _check_unique("image", img["image_ids"], where)
    _check_unique("category", cat["ids"], where)
    order = np.argsort(cat["ids"], kind="stable")
    cat_ids = cat["ids"][order]
    problems, img_idx, cat_idx = _semantic_problems(ann, img["image_ids"], cat_ids)
    if problems:
        return None
    n = len(ann["ann_ids"])
    return {
        **img,
        "image_pos": np.arange(len(img["image_ids"]), dtype=np.int64),
        "cat_ids": cat_ids,
        "cat_names": [cat["names"][i] for i in order],
        "supercategories": [cat["supercategories"][i] for i in order],
        "ann_ids": ann["ann_ids"], "ann_image": img_idx.astype(np.int32),
        "ann_category": cat_idx.astype(np.int32), "bbox": ann["bbox"], "area": ann["area"],
        "iscrowd": ann["iscrowd"], "ann_pos": np.arange(n, dtype=np.int64),
    }
