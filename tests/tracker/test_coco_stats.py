"""Class statistics and class_counts, checked against pycocotools and the published counts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pycocotools.coco import COCO

from tracker import coco
from tracker.errors import DataError

COCO_DATA = Path(__file__).resolve().parents[1] / "data" / "coco"
VAL100 = COCO_DATA / "instances_val2014_100.json"
COUNTS = COCO_DATA / "train2017_class_counts.json"


def test_stats_of_the_real_file_match_pycocotools() -> None:
    result = coco.stats(coco.load(VAL100))
    ref = COCO(str(VAL100))
    anns = ref.dataset["annotations"]
    assert result.num_images == 100 and result.num_annotations == len(anns)
    total = len(anns)
    for row in result.classes:
        mine = [a for a in anns if a["category_id"] == row.id]
        assert row.name == ref.loadCats(row.id)[0]["name"]
        assert row.instances == len(mine)
        assert row.images == len(ref.getImgIds(catIds=[row.id])) if mine else row.images == 0
        assert row.crowd == sum(a["iscrowd"] for a in mine)
        assert row.share == pytest.approx(len(mine) / total)
    present = [r.instances for r in result.classes if r.instances]
    assert result.imbalance_ratio == pytest.approx(max(present) / min(present))
    assert result.absent_classes == 80 - len(present) == 10
    with_ann = {a["image_id"] for a in anns}
    assert result.images_without_annotations == len(set(ref.getImgIds()) - with_ann)


def test_entropy_and_ratio_of_train2017_are_the_published_figures() -> None:
    counts = coco.class_counts(COUNTS)
    assert len(counts) == 80 and sum(counts.values()) == 860001
    values = list(counts.values())
    assert round(coco.normalized_entropy(values), 3) == 0.785
    assert round(coco.imbalance_ratio(values)) == 1326
    assert counts["person"] / sum(values) == pytest.approx(0.305, abs=5e-4)


def test_class_counts_of_a_coco_file_are_in_category_id_order() -> None:
    counts = coco.class_counts(VAL100)
    ref = COCO(str(VAL100))
    ids = sorted(ref.getCatIds())
    assert list(counts) == [ref.loadCats(i)[0]["name"] for i in ids]
    assert list(counts.values()) == [len(ref.getAnnIds(catIds=[i], iscrowd=None)) for i in ids]


def test_bad_counts_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "counts.json"
    bad.write_text(json.dumps({"categories": [{"id": 1, "name": "person", "instances": -3}]}))
    with pytest.raises(DataError, match=r"counts file .*counts.json.*-3.*expected .*>= 0"):
        coco.class_counts(bad)


@given(st.lists(st.integers(0, 1000), min_size=2, max_size=30))
def test_entropy_is_between_zero_and_one_and_one_only_when_uniform(counts: list[int]) -> None:
    h = coco.normalized_entropy(counts)
    assert 0.0 <= h <= 1.0 + 1e-12
    if sum(counts) and len(set(counts)) == 1:
        assert h == pytest.approx(1.0)
    p = np.array(counts, dtype=float)
    if p.sum():
        p = p[p > 0] / p.sum()
        assert h == pytest.approx(float(-(p * np.log(p)).sum() / math.log(len(counts))))


def test_ratio_ignores_absent_classes() -> None:
    assert coco.imbalance_ratio([0, 2, 10]) == 5.0
    assert math.isinf(coco.imbalance_ratio([0, 0]))


def test_stats_count_empty_images_crowd_and_absent_classes(tmp_path: Path) -> None:
    data = {
        "images": [{"id": 3}, {"id": 4}, {"id": 5}],
        "categories": [{"id": 2, "name": "b"}, {"id": 70, "name": "a"}],
        "annotations": [
            {"id": 1, "image_id": 3, "category_id": 2, "bbox": [0, 0, 1, 1], "iscrowd": 1},
            {"id": 2, "image_id": 3, "category_id": 2, "bbox": [0, 0, 1, 1]},
            {"id": 3, "image_id": 5, "category_id": 2, "bbox": [0, 0, 2, 1]},
        ],
    }
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(data))
    result = coco.file_stats(path)
    b, a = result.classes
    assert (b.id, b.instances, b.images, b.crowd, b.share) == (2, 3, 2, 1, 1.0)
    assert (a.id, a.instances, a.images, a.crowd, a.share) == (70, 0, 0, 0, 0.0)
    assert result.images_without_annotations == 1 and result.absent_classes == 1
    assert result.imbalance_ratio == 1.0 and result.normalized_entropy == 0.0
