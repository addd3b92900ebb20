"""The COCO index: an instances JSON file as columnar numpy arrays.

Loading rules:

* Without ``keep_segmentation``, a file is first decoded by the typed fast path
  (:mod:`tracker.coco.typed`: msgspec record types, nothing but the needed fields
  ever becomes a Python object); a file it cannot take as is goes the general way
  below, which also gives the precise errors.
* The general way: the file is read as bytes and parsed with ``orjson`` while Python's cyclic
  garbage collector is paused (a COCO file is millions of small containers; the
  collector would otherwise rescan them over and over, several times the parse).
* Unless ``keep_segmentation=True``, every ``"segmentation"`` value that is a list
  of number lists (polygons) or a flat object (RLE) is cut out of the bytes before
  parsing, so the polygons of a train2017-sized file never become Python objects.
  The cut is exact: it only matches the key ``"segmentation"`` outside strings and
  a value whose brackets balance; anything else is parsed as usual and ignored.
* Records become columns at once: images (id, width, height, file name),
  annotations (id, image, category, bbox, area, iscrowd) and categories (id, name,
  supercategory). Categories are ordered by id, so a category's *index* (0..K-1)
  is its rank among the ids; COCO's ids (1..90 with gaps) map to 0..79.
* ``image_pos`` / ``ann_pos`` keep each record's position in the source lists, so
  writers can copy the original records (segmentations included) untouched.

Validation: a malformed file raises :class:`~tracker.errors.DataError` naming the
field, the record (``annotation #12 (id 903)``) and what was expected. With
``skip_invalid=True`` bad *annotations* are skipped and counted in ``skipped``;
bad images or categories (duplicate ids, missing keys) always fail, since no
annotation could be trusted to refer to them.
"""

from __future__ import annotations

import gc
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import orjson

from tracker.errors import DataError

Progress = Callable[[str, float], None]
"""``progress(phase, fraction_done)``: called as long work advances."""

SEGMENTATION_KEY = rb'"segmentation"(?<!\\"segmentation")\s*+:\s*+'
SEGMENTATION_VALUE = (
    rb"(?:\[\s*+\[[-+0-9.eE,\s]*+\](?:\s*+,\s*+\[[-+0-9.eE,\s]*+\])*+\s*+\]"  # polygons
    rb'|\{(?:[^{}"]++|"(?:[^"\\]++|\\.)*+")*+\})'  # RLE: an object without nested objects
)
_SEGMENTATION = re.compile(SEGMENTATION_KEY + SEGMENTATION_VALUE)


@dataclass(frozen=True)
class Skipped:
    """An annotation left out by a lenient load: its position, id (if any) and why."""

    position: int
    id: Any
    reason: str


@dataclass
class CocoIndex:
    """A COCO instances file as columns. Category indices are ranks of the sorted ids."""

    image_ids: np.ndarray
    image_width: np.ndarray
    image_height: np.ndarray
    file_names: list[str]
    cat_ids: np.ndarray
    cat_names: list[str]
    supercategories: list[str]
    ann_ids: np.ndarray
    ann_image: np.ndarray
    ann_category: np.ndarray
    bbox: np.ndarray
    area: np.ndarray
    iscrowd: np.ndarray
    image_pos: np.ndarray
    ann_pos: np.ndarray
    path: Path | None = None
    segmentations: list[Any] | None = None
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def num_images(self) -> int:
        """Number of images."""
        return int(len(self.image_ids))

    @property
    def num_annotations(self) -> int:
        """Number of annotations kept."""
        return int(len(self.ann_ids))

    @property
    def num_categories(self) -> int:
        """Number of categories declared (with or without annotations)."""
        return int(len(self.cat_ids))

    def instances_per_class(self) -> np.ndarray:
        """Annotations per category index (crowd included)."""
        return np.bincount(self.ann_category, minlength=self.num_categories).astype(np.int64)

    def image_class_counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(image, category, count)`` for every pair present, sorted by image then category."""
        key = np.sort(self.ann_image.astype(np.int64) * self.num_categories + self.ann_category)
        starts = np.flatnonzero(np.diff(key, prepend=-1))
        counts = np.diff(starts, append=len(key))
        img, cat = np.divmod(key[starts], self.num_categories)
        return img, cat, counts.astype(np.int64)

    def image_classes(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR form of the classes in each image: ``(indptr, categories)``."""
        img, cat, _ = self.image_class_counts()
        indptr = np.zeros(self.num_images + 1, dtype=np.int64)
        np.cumsum(np.bincount(img, minlength=self.num_images), out=indptr[1:])
        return indptr, cat

    def category_index(self, cat_id: int) -> int:
        """The index (0..K-1) of COCO category id ``cat_id``."""
        pos = int(np.searchsorted(self.cat_ids, cat_id))
        if pos >= len(self.cat_ids) or self.cat_ids[pos] != cat_id:
            raise DataError(
                f"Unknown category id {cat_id!r}; available: "
                f"{', '.join(str(int(c)) for c in self.cat_ids)}"
            )
        return pos


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector inside the block (nesting is safe).

    Parsed COCO files are millions of containers without cycles; while they are
    alive the collector would rescan them again and again for nothing.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _where(path: Path | None) -> str:
    return f"COCO file {str(path)!r}" if path is not None else "COCO data"


def parse_bytes(data: bytes, path: Path | None = None, keep_segmentation: bool = True) -> Any:
    """Parse COCO JSON bytes (optionally cutting segmentations out first)."""
    with gc_paused():
        if not keep_segmentation:
            try:
                return orjson.loads(_SEGMENTATION.sub(b'"segmentation":0', data))
            except orjson.JSONDecodeError:
                pass  # report the error against the original bytes below
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise DataError(
                f"{_where(path)} is not valid JSON ({exc}); expected a COCO instances file"
            ) from None


def read_json(path: str | os.PathLike[str], keep_segmentation: bool = True,
              progress: Progress | None = None) -> Any:
    """Read and parse a JSON file, naming the file in every error."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise DataError(f"COCO file {str(p)!r} does not exist; check the path") from None
    except OSError as exc:
        raise DataError(f"COCO file {str(p)!r} cannot be read: {exc}") from None
    if progress:
        progress("parsing", 0.2)
    raw = parse_bytes(data, p, keep_segmentation)
    del data
    if progress:
        progress("indexing", 0.8)
    return raw


def load(
    path: str | os.PathLike[str], skip_invalid: bool = False, keep_segmentation: bool = False,
    progress: Progress | None = None,
) -> CocoIndex:
    """Load a COCO instances file into a :class:`CocoIndex`.

    Segmentations are dropped unless ``keep_segmentation``; with ``skip_invalid``
    bad annotations are skipped and listed in ``index.skipped`` instead of raising.
    """
    if not keep_segmentation:
        index = _load_typed(Path(path), progress)
        if index is not None:
            return index
    with gc_paused():
        raw = read_json(path, keep_segmentation=keep_segmentation, progress=progress)
        index = from_dict(raw, skip_invalid=skip_invalid, keep_segmentation=keep_segmentation,
                          path=Path(path))
        del raw
    if progress:
        progress("indexed", 1.0)
    return index


def _load_typed(path: Path, progress: Progress | None) -> CocoIndex | None:
    """The fast path (:mod:`tracker.coco.typed`), or None to take the general one."""
    from tracker.coco.typed import decode
    from tracker.coco.validate import typed_columns

    try:
        data = path.read_bytes()
    except OSError:
        return None  # the general path names the problem
    if progress:
        progress("parsing", 0.2)
    with gc_paused():
        cols = decode(data)
        del data
        fields = None if cols is None else typed_columns(cols, _where(path))
    if fields is None:
        return None
    if progress:
        progress("indexed", 1.0)
    return CocoIndex(**fields, path=path)


def from_dict(
    raw: Any, skip_invalid: bool = False, keep_segmentation: bool = False, path: Path | None = None,
) -> CocoIndex:
    """Build a :class:`CocoIndex` from an already parsed COCO dict."""
    from tracker.coco.validate import annotation_columns, category_columns, image_columns

    where = _where(path)
    lists = _top_level(raw, where)
    with gc_paused():
        images = image_columns(lists["images"], where)
        cats = category_columns(lists["categories"], where)
        anns, skipped = annotation_columns(
            lists["annotations"], images["image_ids"], cats["cat_ids"], where, skip_invalid
        )
    segs = None
    if keep_segmentation:
        source = lists["annotations"]
        segs = [source[int(p)].get("segmentation") for p in anns["ann_pos"]]
    return CocoIndex(**images, **cats, **anns, path=path, segmentations=segs, skipped=skipped)


def _top_level(raw: Any, where: str) -> dict[str, list[Any]]:
    if not isinstance(raw, dict):
        raise DataError(
            f"{where} is JSON but not a COCO instances file: the top level is a "
            f"{type(raw).__name__}; expected an object with 'images', 'annotations' and 'categories'"
        )
    out: dict[str, list[Any]] = {}
    for key in ("images", "annotations", "categories"):
        if key not in raw:
            present = ", ".join(sorted(map(str, raw))) or "none"
            raise DataError(
                f"{where} is JSON but not a COCO instances file: missing key {key!r} "
                f"(top-level keys: {present}); expected 'images', 'annotations' and 'categories' lists"
            )
        if not isinstance(raw[key], list):
            raise DataError(
                f"{where}: top-level {key!r} is a {type(raw[key]).__name__}; expected a list of records"
            )
        out[key] = raw[key]
    return out
