"""Written subsets: valid COCO for pycocotools and faster-coco-eval, bytes kept, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.harness.coco import VAL100, check_with_real_clients, train2017_counts, write_scaled_synthetic
from tracker import coco
from tracker.coco.io import atomic_writer
from tracker.errors import DataError


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_scaled_synthetic(tmp_path_factory.mktemp("syn") / "syn.json", 0.005, 600, seed=3)


def test_subset_keeps_records_ids_and_segmentation_bytes(synthetic: Path, tmp_path: Path) -> None:
    index = coco.load(synthetic)
    chosen = np.arange(0, index.num_images, 3)
    out = coco.write_subset(synthetic, index, chosen, tmp_path / "sub.json")
    src, dst = orjson.loads(synthetic.read_bytes()), orjson.loads(out.read_bytes())
    keep = set(index.image_ids[chosen].tolist())
    assert [i["id"] for i in dst["images"]] == [i["id"] for i in src["images"] if i["id"] in keep]
    assert dst["annotations"] == [a for a in src["annotations"] if a["image_id"] in keep]
    for key in ("info", "licenses", "categories"):
        assert dst[key] == src[key]
    polygon = json.dumps(dst["annotations"][0]["segmentation"], separators=(",", ":")).encode()
    assert polygon in synthetic.read_bytes()
    check_with_real_clients(out)


def test_subset_of_the_real_file_with_crowd_rle(tmp_path: Path) -> None:
    index = coco.load(VAL100)
    crowd_images = np.unique(index.ann_image[index.iscrowd])
    out = coco.write_subset(VAL100, index, crowd_images, tmp_path / "crowd.json")
    dst = orjson.loads(out.read_bytes())
    src = {a["id"]: a for a in orjson.loads(VAL100.read_bytes())["annotations"]}
    assert sum(a["iscrowd"] for a in dst["annotations"]) == 9
    assert all(a == src[a["id"]] for a in dst["annotations"])
    check_with_real_clients(out)


def test_lenient_subset_leaves_skipped_annotations_out(tmp_path: Path) -> None:
    data = orjson.loads(VAL100.read_bytes())
    data["annotations"][5]["category_id"] = 999
    data["annotations"][6]["bbox"] = [1, 2]
    src = tmp_path / "bad.json"
    src.write_bytes(orjson.dumps(data))
    index = coco.load(src, skip_invalid=True)
    assert len(index.skipped) == 2
    out = coco.write_subset(src, index, np.arange(index.num_images), tmp_path / "clean.json")
    assert len(orjson.loads(out.read_bytes())["annotations"]) == 837
    check_with_real_clients(out)


def test_atomic_writer_leaves_nothing_on_failure(tmp_path: Path) -> None:
    dest = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with atomic_writer(dest) as fh:
            fh.write(b"half")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_writer(dest) as fh:
            fh.write(b"new")
            raise RuntimeError("boom")
    assert dest.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.json"]
    with atomic_writer(dest) as fh:
        fh.write(b"new")
    assert dest.read_bytes() == b"new"


def test_atomic_writer_needs_an_existing_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist; create it first"):
        with atomic_writer(tmp_path / "no" / "x.json"):
            pass


def test_synthetic_file_has_the_requested_counts(synthetic: Path) -> None:
    counts = train2017_counts(0.005)
    got = coco.class_counts(synthetic)
    assert got == {c.name: c.instances for c in sorted(counts, key=lambda c: c.id)}
    stats = coco.stats(coco.load(synthetic))
    person_images = stats.by_name()["person"].images / stats.num_images
    assert 0.45 < person_images < 0.6
    check_with_real_clients(synthetic)
