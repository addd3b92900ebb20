"""COCO test data: the files in tests/data/coco, synthetic sets scaled from the train2017
class counts, and the check that the real COCO clients count what our stats count."""

from __future__ import annotations

from pathlib import Path

from faster_coco_eval import COCO as FastCOCO
from pycocotools.coco import COCO

from tracker import coco
from tracker.coco.synthetic import ClassCount, read_counts, scale_counts, write_synthetic

COCO_DATA = Path(__file__).resolve().parents[1] / "data" / "coco"
VAL100 = COCO_DATA / "instances_val2014_100.json"


def train2017_counts(share: float) -> list[ClassCount]:
    """The train2017 class counts scaled by ``share`` (at least 1 instance a class)."""
    return scale_counts(read_counts(COCO_DATA / "train2017_class_counts.json"), share)


def write_scaled_synthetic(path: Path, share: float, images: int, seed: int) -> Path:
    """A synthetic COCO file at ``path``: ``images`` images holding :func:`train2017_counts` of ``share``."""
    return write_synthetic(path, train2017_counts(share), images, seed=seed)


def check_with_real_clients(path: Path) -> None:
    """pycocotools and faster-coco-eval load ``path`` and count what our stats count."""
    ours = coco.stats(coco.load(path))
    for client in (COCO, FastCOCO):
        ref = client(str(path))
        assert len(ref.getImgIds()) == ours.num_images
        assert len(ref.getAnnIds()) == ours.num_annotations
        for row in ours.classes:
            assert len(ref.getAnnIds(catIds=[row.id], iscrowd=None)) == row.instances, client
            assert len(ref.getImgIds(catIds=[row.id])) == row.images if row.instances else True
