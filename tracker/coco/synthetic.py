"""Seeded generator of synthetic COCO-format instance files.

The files are synthetic: no image exists behind them. They copy what matters for
class statistics, balancing and loading speed from a set of per-class instance
counts (``train2017_class_counts.json`` gives MS COCO train2017's), and nothing else.

How a file is made (every draw comes from one ``numpy`` generator seeded by ``seed``):

* a share of the images (``empty_share``, 0.86% as in train2017) has no annotation;
* ``person`` (or the most frequent class) is put in ``person_share`` of the images
  (54% in train2017) with a heavy-tailed number of instances per image, so crowds
  of people occur beside one image of a single person;
* every other class gets ``round(N / m)`` images, where ``m`` grows slowly with
  the class total ``N`` (about 1.1 instances per image for the rarest classes,
  3 for the most common). A share of those images (by COCO supercategory: 90% for
  sports and accessories, 25% for animals, ...) also holds people: this is the
  co-occurrence that makes balancing hard;
* the instances of a class are spread over its images (one each, the rest by a
  multinomial with log-normal weights), so the per-class totals are exact;
* 1% of the annotations are crowd annotations with an uncompressed RLE mask; the
  others carry one polygon of 10 to 40 points inside their box, so a file at the
  scale of train2017 weighs a realistic few hundred MB.

The output is written in chunks with ``orjson``, so memory stays bounded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Sequence

import numpy as np
import orjson

from tracker.coco.io import atomic_writer
from tracker.errors import ConfigError, DataError

# COCO supercategory of a category id, and the share of its images that also hold people.
_SUPER: tuple[tuple[int, int, str, float], ...] = (
    (1, 1, "person", 1.0),
    (2, 9, "vehicle", 0.6),
    (10, 15, "outdoor", 0.5),
    (16, 25, "animal", 0.25),
    (26, 33, "accessory", 0.9),
    (34, 43, "sports", 0.9),
    (44, 51, "kitchen", 0.5),
    (52, 61, "food", 0.35),
    (62, 71, "furniture", 0.5),
    (72, 77, "electronic", 0.55),
    (78, 83, "appliance", 0.35),
    (84, 91, "indoor", 0.45),
)
_SIZES = np.array([[640, 480], [480, 640], [640, 427], [427, 640], [640, 360], [500, 375]])
_CHUNK = 20_000


@dataclass(frozen=True)
class ClassCount:
    """One category of a counts file: COCO id, name and instance total."""

    id: int
    name: str
    instances: int


def read_counts(path: str | os.PathLike[str]) -> list[ClassCount]:
    """Read a counts file (``{"categories": [{"id", "name", "instances"}, ...]}``)."""
    try:
        raw = orjson.loads(Path(path).read_bytes())
        cats = raw["categories"]
        return [ClassCount(int(c["id"]), str(c["name"]), int(c["instances"])) for c in cats]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise DataError(
            f"counts file {str(path)!r} is not a list of categories with id, name and "
            f"instances ({type(exc).__name__}: {exc}); expected "
            '{"categories": [{"id": 1, "name": "person", "instances": 262465}, ...]}'
        ) from None


def scale_counts(counts: Sequence[ClassCount], factor: float) -> list[ClassCount]:
    """The same classes with every total multiplied by ``factor`` (at least 1 each)."""
    if factor <= 0:
        raise ConfigError(f"scale factor {factor!r} must be > 0")
    return [ClassCount(c.id, c.name, max(1, round(c.instances * factor))) for c in counts]


def _supercategory(cat_id: int) -> tuple[str, float]:
    for lo, hi, name, share in _SUPER:
        if lo <= cat_id <= hi:
            return name, share
    return "other", 0.5


def _spread(rng: np.random.Generator, images: np.ndarray, total: int, sigma: float) -> np.ndarray:
    """Instances per image: one each, the remainder multinomial with log-normal weights."""
    weights = rng.lognormal(0.0, sigma, size=len(images))
    extra = rng.multinomial(total - len(images), weights / weights.sum())
    return 1 + extra


def _assign(
    rng: np.random.Generator, counts: Sequence[ClassCount], n_images: int,
    person_share: float, empty_share: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Per annotation: (image index, category position), with exact per-class totals."""
    order = rng.permutation(n_images)
    n_empty = int(round(n_images * empty_share))
    pool = order[n_empty:]
    main = int(np.argmax([c.instances for c in counts]))
    n_person = min(len(pool), max(1, int(round(n_images * person_share))))
    person_imgs = rng.choice(pool, size=n_person, replace=False)
    is_person = np.zeros(n_images, dtype=bool)
    is_person[person_imgs] = True
    others = pool[~is_person[pool]]
    img_parts: list[np.ndarray] = []
    cat_parts: list[np.ndarray] = []
    for pos, c in enumerate(counts):
        if pos == main:
            imgs = person_imgs[: min(n_person, c.instances)]
            sigma = 1.1
        else:
            per_image = 1.0 + 0.35 * max(0.0, np.log(c.instances / 150.0))
            k = int(min(len(pool), max(1, round(c.instances / per_image))))
            share = _supercategory(c.id)[1]
            k_p = min(n_person, int(round(k * share)), k)
            k_o = min(len(others), k - k_p)
            k_p = min(n_person, k - k_o)
            imgs = np.concatenate([
                rng.choice(person_imgs, size=k_p, replace=False),
                rng.choice(others, size=k_o, replace=False),
            ])
            sigma = 0.8
        per = _spread(rng, imgs, c.instances, sigma)
        img_parts.append(np.repeat(imgs, per))
        cat_parts.append(np.full(int(per.sum()), pos, dtype=np.int32))
    img = np.concatenate(img_parts)
    cat = np.concatenate(cat_parts)
    shuffle = rng.permutation(len(img))
    img, cat = img[shuffle], cat[shuffle]
    by_image = np.argsort(img, kind="stable")
    return img[by_image], cat[by_image]


def _polygons(rng: np.random.Generator, boxes: np.ndarray) -> list[np.ndarray]:
    """One polygon of 10 to 40 points inside each box, rounded to 2 decimals."""
    k = rng.integers(10, 41, size=len(boxes))
    owner = np.repeat(np.arange(len(boxes)), k)
    t = np.sort(owner * 8.0 + rng.uniform(0, 2 * np.pi, size=len(owner))) - owner * 8.0
    r = rng.uniform(0.6, 1.0, size=len(owner))
    b = boxes[owner]
    x = b[:, 0] + b[:, 2] * (0.5 + 0.5 * r * np.cos(t))
    y = b[:, 1] + b[:, 3] * (0.5 + 0.5 * r * np.sin(t))
    flat = np.round(np.stack([x, y], axis=1).ravel(), 2)
    return np.split(flat, 2 * np.cumsum(k)[:-1])


def _annotations(
    rng: np.random.Generator, img: np.ndarray, cat: np.ndarray, cat_ids: np.ndarray,
    sizes: np.ndarray, image_ids: np.ndarray, start: int,
) -> list[dict[str, object]]:
    n = len(img)
    wh = sizes[img].astype(np.float64)
    bw = np.maximum(1.0, np.round(wh[:, 0] * rng.uniform(0.02, 0.6, n), 2))
    bh = np.maximum(1.0, np.round(wh[:, 1] * rng.uniform(0.02, 0.6, n), 2))
    bx = np.round(rng.uniform(0, 1, n) * (wh[:, 0] - bw), 2)
    by = np.round(rng.uniform(0, 1, n) * (wh[:, 1] - bh), 2)
    boxes = np.stack([bx, by, bw, bh], axis=1)
    area = np.round(bw * bh * rng.uniform(0.4, 0.8, n), 2).tolist()
    crowd = (rng.random(n) < 0.01).tolist()
    polygons = _polygons(rng, boxes)
    img_ids = image_ids[img].tolist()
    cats = cat_ids[cat].tolist()
    out: list[dict[str, object]] = []
    for i in range(n):
        seg: object = [polygons[i]]
        if crowd[i]:
            h, w = int(wh[i, 1]), int(wh[i, 0])
            runs = rng.integers(1, 400, size=int(rng.integers(4, 20))).tolist()
            seg = {"counts": runs + [max(0, h * w - sum(runs))], "size": [h, w]}
        out.append({
            "segmentation": seg, "area": area[i], "iscrowd": int(crowd[i]),
            "image_id": img_ids[i], "bbox": boxes[i], "category_id": cats[i],
            "id": start + i + 1,
        })
    return out


def _write_list(fh: BinaryIO, key: bytes, chunks: Iterable[list[dict[str, object]]]) -> None:
    fh.write(b'"' + key + b'":[')
    first = True
    for chunk in chunks:
        body = orjson.dumps(chunk, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
        if not body:
            continue
        if not first:
            fh.write(b",")
        fh.write(body)
        first = False
    fh.write(b"]")


def write_synthetic(
    path: str | os.PathLike[str], counts: Sequence[ClassCount], n_images: int, seed: int = 0,
    person_share: float = 0.54, empty_share: float = 0.0086,
) -> Path:
    """Write a synthetic COCO instances file with exactly ``counts`` instances per class.

    Image ids are ``1..n_images``; annotation ids ``1..sum(counts)``. Returns the path.
    """
    if n_images < 1 or not counts:
        raise ConfigError(f"need n_images >= 1 and at least one class; got {n_images!r}, {len(counts)}")
    rng = np.random.default_rng(seed)
    img, cat = _assign(rng, counts, n_images, person_share, empty_share)
    sizes = _SIZES[rng.integers(0, len(_SIZES), size=n_images)]
    image_ids = np.arange(1, n_images + 1)
    cat_ids = np.array([c.id for c in counts], dtype=np.int64)
    images = [
        {"license": 1, "file_name": f"{i:012d}.jpg", "height": int(sizes[i - 1, 1]),
         "width": int(sizes[i - 1, 0]), "id": int(i)}
        for i in image_ids
    ]
    categories = [
        {"supercategory": _supercategory(c.id)[0], "id": c.id, "name": c.name} for c in counts
    ]
    info = {"description": "synthetic COCO-format instances (tracker.coco.synthetic)",
            "version": "1.0", "year": 2017, "seed": seed}

    def chunks() -> Iterator[list[dict[str, object]]]:
        for lo in range(0, len(img), _CHUNK):
            hi = min(len(img), lo + _CHUNK)
            yield _annotations(rng, img[lo:hi], cat[lo:hi], cat_ids, sizes, image_ids, lo)

    out = Path(path)
    with atomic_writer(out) as fh:
        fh.write(b'{"info":' + orjson.dumps(info) + b',"licenses":[{"id":1,"name":"synthetic","url":""}],')
        _write_list(fh, b"images", [images])
        fh.write(b",")
        _write_list(fh, b"annotations", chunks())
        fh.write(b',"categories":' + orjson.dumps(categories) + b"}")
    return out
