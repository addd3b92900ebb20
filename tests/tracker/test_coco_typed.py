"""The typed fast path of the COCO loader agrees with the general path, and steps aside on bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracker import coco
from tracker.coco import typed
from tracker.coco.index import from_dict
from tracker.errors import DataError

VAL100 = Path(__file__).resolve().parents[1] / "data" / "coco" / "instances_val2014_100.json"
FIELDS = ("image_ids", "image_width", "image_height", "cat_ids", "ann_ids", "ann_image", "ann_category",
          "bbox", "area", "iscrowd", "image_pos", "ann_pos")


def assert_same(a: coco.CocoIndex, b: coco.CocoIndex) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    assert a.file_names == b.file_names
    assert a.cat_names == b.cat_names and a.supercategories == b.supercategories


def general(path: Path) -> coco.CocoIndex:
    return from_dict(json.loads(path.read_bytes()), path=path)


def test_real_file_same_columns_as_the_general_path() -> None:
    assert typed.decode(VAL100.read_bytes()) is not None  # the fast path takes it
    assert_same(coco.load(VAL100), general(VAL100))


numbers = st.one_of(st.integers(0, 1000), st.floats(0, 1000, allow_nan=False))
annotation = st.fixed_dictionaries(
    {"image_id": st.integers(0, 4), "category_id": st.sampled_from([1, 3, 90]),
     "bbox": st.lists(numbers, min_size=4, max_size=4)},
    optional={"area": numbers, "iscrowd": st.sampled_from([0, 1, True, False]),
              "segmentation": st.lists(st.lists(numbers, max_size=6), max_size=2)},
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(anns=st.lists(annotation, max_size=12), extra=st.booleans())
def test_generated_files_same_columns(tmp_path: Path, anns: list[dict[str, Any]], extra: bool) -> None:
    doc: dict[str, Any] = {
        "images": [{"id": i, "width": 10 + i, "height": 20, "file_name": f"{i}.jpg"} for i in range(5)],
        "categories": [{"id": c, "name": f"c{c}", "supercategory": "s"} for c in (90, 3, 1)],
        "annotations": [{"id": 100 + i, **a} for i, a in enumerate(anns)],
    }
    if extra:
        doc["info"] = {"year": 2017}
        doc["licenses"] = [{"id": 1, "name": "x"}]
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    assert typed.decode(path.read_bytes()) is not None
    assert_same(coco.load(path), general(path))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["annotations"][1].update(iscrowd=2), "field 'iscrowd' is 2"),
        (lambda d: d["annotations"][1].update(category_id="1"), "field 'category_id' is '1'"),
        (lambda d: d["annotations"][1].update(bbox=[1, 2, 3]), "field 'bbox' is [1, 2, 3]"),
        (lambda d: d["annotations"][1].update(image_id=12345), "points to no image"),
        (lambda d: d["annotations"][1].update(id=0), "duplicate annotation id 0"),
        (lambda d: d["annotations"][1].pop("bbox"), "missing field 'bbox'"),
        (lambda d: d["images"][0].update(width="wide"), "field 'width' is 'wide'"),
        (lambda d: d["annotations"][1].update(id=2**64), "field .id. is"),
    ],
)
def test_bad_records_get_the_general_paths_message(tmp_path: Path, change: Any, message: str) -> None:
    doc: dict[str, Any] = {
        "images": [{"id": 1, "width": 4, "height": 4, "file_name": "a.jpg"}],
        "categories": [{"id": 1, "name": "person"}],
        "annotations": [{"id": i, "image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1]} for i in range(3)],
    }
    change(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    assert typed.decode(path.read_bytes()) is None or "duplicate" in message or "no image" in message
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]")):
        coco.load(path)


def test_lenient_load_still_skips_bad_annotations(tmp_path: Path) -> None:
    doc = {
        "images": [{"id": 1}],
        "categories": [{"id": 1, "name": "person"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1]},
                        {"id": 2, "image_id": 9, "category_id": 1, "bbox": [0, 0, 1, 1]}],
    }
    path = tmp_path / "lenient.json"
    path.write_text(json.dumps(doc))
    index = coco.load(path, skip_invalid=True)
    assert index.ann_ids.tolist() == [1] and [s.id for s in index.skipped] == [2]


def test_invalid_json_is_named(tmp_path: Path) -> None:
    path = tmp_path / "torn.json"
    path.write_bytes(b'{"images": [')
    assert typed.decode(path.read_bytes()) is None
    with pytest.raises(DataError, match="torn.json.*not valid JSON"):
        coco.load(path)
