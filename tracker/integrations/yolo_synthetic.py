"""A small synthetic detection dataset in YOLO format with COCO train2017's long tail.

``make_dataset(root, train=32, val=8)`` draws images of ``imgsz x imgsz`` pixels
holding one to three objects each. An object's class is drawn with probability
proportional to its instance count in COCO train2017 (person about 30%, the
rarest classes below 0.03%), so a few dozen images hold a handful of frequent
classes and a long tail of absent or single-instance ones, as a real imbalanced
set does. Each class has its own look (a colour from a hue wheel and one of four
shapes), so a detector can learn it. Images are PNG files written by Pillow;
labels are YOLO text files (``class cx cy w h``, normalised); ``data.yaml`` names
the 80 COCO classes and uses absolute paths.

Pillow comes with Ultralytics; this module imports nothing else beyond numpy.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracker.coco.counts import coco_train2017_counts
from tracker.errors import ConfigError

SHAPES = ("box", "ellipse", "cross", "frame")


@dataclass(frozen=True)
class SyntheticDataset:
    """Where a generated dataset lies and what it holds."""

    root: Path
    yaml: Path
    names: list[str]
    train_counts: np.ndarray  # instances per class in the training split
    train_images: int
    val_images: int


def _colour(index: int) -> tuple[int, int, int]:
    hue = (index * 0.618033988749895) % 1.0  # golden-ratio steps: neighbours differ in hue
    value = 0.95 if index % 2 == 0 else 0.7
    r, g, b = colorsys.hsv_to_rgb(hue, 0.85, value)
    return int(r * 255), int(g * 255), int(b * 255)


def _draw(image: np.ndarray, box: tuple[int, int, int, int], colour: tuple[int, int, int], shape: str) -> None:
    x0, y0, x1, y1 = box
    h, w = y1 - y0, x1 - x0
    yy, xx = np.mgrid[0:h, 0:w]
    if shape == "box":
        mask = np.ones((h, w), bool)
    elif shape == "ellipse":
        mask = ((yy - (h - 1) / 2) / (h / 2)) ** 2 + ((xx - (w - 1) / 2) / (w / 2)) ** 2 <= 1.0
    elif shape == "cross":
        mask = (np.abs(yy - h // 2) <= max(1, h // 6)) | (np.abs(xx - w // 2) <= max(1, w // 6))
    else:  # frame
        t = max(2, min(h, w) // 5)
        mask = (yy < t) | (yy >= h - t) | (xx < t) | (xx >= w - t)
    image[y0:y1, x0:x1][mask] = colour


def _sample_image(rng: np.random.Generator, p: np.ndarray, imgsz: int, max_objects: int) -> tuple[np.ndarray, list]:
    image = rng.integers(90, 140, (imgsz, imgsz, 3), dtype=np.uint8)
    image = (image + rng.normal(0, 6, image.shape)).clip(0, 255).astype(np.uint8)
    labels = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        cls = int(rng.choice(len(p), p=p))
        w, h = (int(v) for v in rng.integers(imgsz // 5, imgsz // 2 + 1, 2))
        x0, y0 = int(rng.integers(0, imgsz - w + 1)), int(rng.integers(0, imgsz - h + 1))
        _draw(image, (x0, y0, x0 + w, y0 + h), _colour(cls), SHAPES[cls % len(SHAPES)])
        labels.append((cls, (x0 + w / 2) / imgsz, (y0 + h / 2) / imgsz, w / imgsz, h / imgsz))
    return image, labels


def _write_split(root: Path, split: str, n: int, rng: np.random.Generator, p: np.ndarray,
                 imgsz: int, max_objects: int) -> np.ndarray:
    from PIL import Image

    images, labels = root / "images" / split, root / "labels" / split
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    counts = np.zeros(len(p), np.int64)
    for i in range(n):
        image, objects = _sample_image(rng, p, imgsz, max_objects)
        Image.fromarray(image).save(images / f"{split}_{i:05d}.png")
        lines = [f"{c} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}" for c, cx, cy, w, h in objects]
        (labels / f"{split}_{i:05d}.txt").write_text("\n".join(lines) + "\n")
        for c, *_ in objects:
            counts[c] += 1
    return counts


def make_dataset(root: str | Path, *, train: int = 32, val: int = 8, imgsz: int = 64, seed: int = 0,
                 max_objects: int = 3) -> SyntheticDataset:
    """Write a YOLO-format dataset under ``root`` (created; must be empty or absent) and return its description."""
    if train < 1 or val < 1:
        raise ConfigError(f"train={train!r}, val={val!r} images; expected at least 1 of each")
    if imgsz < 32:
        raise ConfigError(f"imgsz {imgsz!r} is too small to draw objects in; expected >= 32")
    root = Path(root).resolve()
    if root.exists() and any(root.iterdir()):
        raise ConfigError(f"dataset folder {str(root)!r} is not empty; pass a new folder")
    names, coco = coco_train2017_counts()
    p = coco / coco.sum()
    rng = np.random.default_rng(seed)
    counts = _write_split(root, "train", train, rng, p, imgsz, max_objects)
    _write_split(root, "val", val, rng, p, imgsz, max_objects)
    yaml = root / "data.yaml"
    lines = [f"path: {root}", "train: images/train", "val: images/val", f"nc: {len(names)}", "names:"]
    lines += [f"  {i}: {name}" for i, name in enumerate(names)]
    yaml.write_text("\n".join(lines) + "\n")
    return SyntheticDataset(root=root, yaml=yaml, names=names, train_counts=counts,
                            train_images=train, val_images=val)
