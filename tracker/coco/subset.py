"""Writing subsets of a COCO file: the original records, untouched, for chosen images.

Rules:

* Every top-level key of the source (``info``, ``licenses``, ``categories`` and any
  other) is written as it was; ``images`` and ``annotations`` keep the records of
  the chosen images, in their original order, with their ids.
* Only annotations that the index kept are written (a lenient load's skipped
  annotations are left out), so every ``image_id`` and ``category_id`` points to
  a written record.
* Segmentations are copied byte for byte from the source: before parsing, each
  one is replaced by a unique placeholder string that remembers its byte span, and
  the chosen ones are put back into the output. Nothing of the polygons is
  parsed, so a train2017-sized source costs little memory.
* Files are written atomically (:mod:`tracker.coco.io`).
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import orjson

from tracker.coco.index import (
    SEGMENTATION_KEY,
    SEGMENTATION_VALUE,
    CocoIndex,
    Progress,
    from_dict,
    gc_paused,
    parse_bytes,
)
from tracker.coco.io import atomic_write_bytes
from tracker.errors import DataError

_SPLIT = re.compile(b"(" + SEGMENTATION_KEY + b")(" + SEGMENTATION_VALUE + b")")


@dataclass
class Source:
    """A parsed source file whose segmentations are placeholders into ``data``."""

    data: bytes
    raw: dict[str, Any]
    spans: list[tuple[int, int]]
    token: bytes


def read_source(path: str | os.PathLike[str]) -> Source:
    """Read ``path`` for writing subsets of it."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise DataError(f"COCO file {str(p)!r} cannot be read: {exc}") from None
    token = b"@seg-" + secrets.token_hex(8).encode() + b"-"
    while token in data:  # pragma: no cover - 64 random bits
        token = b"@seg-" + secrets.token_hex(8).encode() + b"-"
    spans: list[tuple[int, int]] = []

    def cut(m: re.Match[bytes]) -> bytes:
        spans.append(m.span(2))
        return m.group(1) + b'"' + token + str(len(spans) - 1).encode() + b'"'

    raw = parse_bytes(_SPLIT.sub(cut, data), p, keep_segmentation=True)
    if not isinstance(raw, dict):
        raise DataError(f"COCO file {str(p)!r} is not a COCO instances file; expected an object")
    return Source(data, raw, spans, token)


def load_for_writing(
    path: str | os.PathLike[str], skip_invalid: bool = False, progress: Progress | None = None,
) -> tuple[Source, CocoIndex]:
    """Read ``path`` once: the source to write subsets from, and its index."""
    if progress:
        progress("parsing", 0.1)
    with gc_paused():
        source = read_source(path)
        if progress:
            progress("indexing", 0.8)
        index = from_dict(source.raw, skip_invalid=skip_invalid, path=Path(path))
    if progress:
        progress("indexed", 1.0)
    return source, index


def render(source: Source, index: CocoIndex, images: np.ndarray) -> bytes:
    """The bytes of a COCO file holding ``images`` (indices into ``index``) and their annotations."""
    chosen = np.zeros(index.num_images, dtype=bool)
    chosen[np.asarray(images, dtype=np.int64)] = True
    raw = source.raw
    img_pos = np.sort(index.image_pos[chosen])
    ann_pos = np.sort(index.ann_pos[chosen[index.ann_image]])
    out = dict(raw)
    out["images"] = [raw["images"][int(i)] for i in img_pos]
    out["annotations"] = [raw["annotations"][int(i)] for i in ann_pos]
    body = orjson.dumps(out)
    pattern = re.compile(b'"' + re.escape(source.token) + rb'(\d+)"')
    return pattern.sub(lambda m: source.data.__getitem__(slice(*source.spans[int(m.group(1))])), body)


def write_subsets(
    path: str | os.PathLike[str] | Source, index: CocoIndex,
    parts: Mapping[str | os.PathLike[str], np.ndarray],
) -> list[Path]:
    """Write one subset file per ``{out_path: image indices}``, reading the source once.

    ``path`` may be a :class:`Source` already read (see :func:`load_for_writing`).
    """
    with gc_paused():
        source = path if isinstance(path, Source) else read_source(path)
        return [atomic_write_bytes(out, render(source, index, images)) for out, images in parts.items()]


def write_subset(path: str | os.PathLike[str] | Source, index: CocoIndex, images: np.ndarray,
                 out: str | os.PathLike[str]) -> Path:
    """Write the subset of ``path`` holding ``images`` (indices into ``index``) to ``out``."""
    return write_subsets(path, index, {out: images})[0]
