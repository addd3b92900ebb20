"""The COCO index: columns, ids, segmentations, malformed input, lenient mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocotools.coco import COCO

from tracker import coco
from tracker.coco.index import parse_bytes
from tracker.errors import DataError

VAL100 = Path(__file__).resolve().parents[1] / "data" / "coco" / "instances_val2014_100.json"


def small() -> dict[str, Any]:
    """Three images (one empty), non-contiguous category ids, one absent category, a crowd."""
    return {
        "info": {"description": "test"},
        "licenses": [],
        "images": [
            {"id": 10, "width": 640, "height": 480, "file_name": "a.jpg"},
            {"id": 7, "width": 320, "height": 240, "file_name": "b.jpg"},
            {"id": 99, "width": 100, "height": 100, "file_name": "empty.jpg"},
        ],
        "categories": [
            {"id": 90, "name": "toothbrush", "supercategory": "indoor"},
            {"id": 1, "name": "person", "supercategory": "person"},
            {"id": 44, "name": "bottle", "supercategory": "kitchen"},
        ],
        "annotations": [
            {"id": 1, "image_id": 10, "category_id": 1, "bbox": [0, 0, 10, 20], "area": 150.0,
             "iscrowd": 0, "segmentation": [[0, 0, 10, 0, 10, 20]]},
            {"id": 2, "image_id": 10, "category_id": 90, "bbox": [1.5, 2, 3, 4], "area": 10,
             "iscrowd": 0, "segmentation": [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]},
            {"id": 3, "image_id": 7, "category_id": 1, "bbox": [0, 0, 50, 50], "area": 2000,
             "iscrowd": 1, "segmentation": {"counts": [5, 10, 2485], "size": [50, 50]}},
            {"id": 4, "image_id": 7, "category_id": 1, "bbox": [5, 5, 5, 5],
             "iscrowd": 0, "segmentation": [[5, 5, 10, 5, 10, 10]]},
        ],
    }


def write(tmp_path: Path, data: Any, name: str = "c.json") -> Path:
    path = tmp_path / name
    path.write_bytes(json.dumps(data).encode() if not isinstance(data, bytes) else data)
    return path


def test_columns_of_a_small_file(tmp_path: Path) -> None:
    index = coco.load(write(tmp_path, small()))
    assert index.num_images == 3 and index.num_annotations == 4 and index.num_categories == 3
    assert index.cat_ids.tolist() == [1, 44, 90]  # sorted: index = rank of the id
    assert index.cat_names == ["person", "bottle", "toothbrush"]
    assert index.category_index(90) == 2
    assert index.image_ids.tolist() == [10, 7, 99]
    assert index.ann_image.tolist() == [0, 0, 1, 1]
    assert index.ann_category.tolist() == [0, 2, 0, 0]
    assert index.iscrowd.tolist() == [False, False, True, False]
    assert index.bbox[1].tolist() == [1.5, 2.0, 3.0, 4.0]
    assert index.area[3] == 25.0  # missing area: width * height
    assert index.instances_per_class().tolist() == [3, 0, 1]
    assert index.segmentations is None


def test_unknown_category_id_names_the_choices(tmp_path: Path) -> None:
    index = coco.load(write(tmp_path, small()))
    with pytest.raises(DataError, match=r"Unknown category id 2; available: 1, 44, 90"):
        index.category_index(2)


def test_segmentations_are_kept_only_when_asked(tmp_path: Path) -> None:
    data = small()
    index = coco.load(write(tmp_path, data), keep_segmentation=True)
    assert index.segmentations == [a["segmentation"] for a in data["annotations"]]


def test_image_class_counts_and_csr(tmp_path: Path) -> None:
    index = coco.load(write(tmp_path, small()))
    img, cat, cnt = index.image_class_counts()
    assert list(zip(img.tolist(), cat.tolist(), cnt.tolist())) == [(0, 0, 1), (0, 2, 1), (1, 0, 2)]
    indptr, classes = index.image_classes()
    assert indptr.tolist() == [0, 2, 3, 3] and classes.tolist() == [0, 2, 0]


def test_real_file_agrees_with_pycocotools() -> None:
    index = coco.load(VAL100)
    ref = COCO(str(VAL100))
    assert index.num_images == len(ref.getImgIds()) == 100
    assert index.num_annotations == len(ref.getAnnIds()) == 839
    for pos, cid in enumerate(index.cat_ids.tolist()):
        assert index.instances_per_class()[pos] == len(ref.getAnnIds(catIds=[cid], iscrowd=None))
    assert int(index.iscrowd.sum()) == len([a for a in ref.dataset["annotations"] if a["iscrowd"]]) == 9
    assert int((index.instances_per_class() == 0).sum()) == 10
    by_id = {a["id"]: a for a in ref.dataset["annotations"]}
    for row in (0, 100, 838):
        ann = by_id[int(index.ann_ids[row])]
        assert index.bbox[row].tolist() == pytest.approx(ann["bbox"])
        assert index.image_ids[index.ann_image[row]] == ann["image_id"]
        assert index.cat_ids[index.ann_category[row]] == ann["category_id"]


def test_stripping_segmentations_does_not_change_the_rest() -> None:
    data = VAL100.read_bytes()
    stripped = parse_bytes(data, keep_segmentation=False)
    full = orjson.loads(data)
    for a, b in zip(stripped["annotations"], full["annotations"]):
        assert a["segmentation"] == 0
        assert {k: v for k, v in a.items() if k != "segmentation"} == {
            k: v for k, v in b.items() if k != "segmentation"}
    assert stripped["images"] == full["images"] and stripped["categories"] == full["categories"]


def test_stripping_is_exact_on_tricky_json() -> None:
    tricky = {
        "images": [{"id": 1, "file_name": 'x"segmentation": [[1]]'}],
        'key\\"segmentation': [[1, 2]],
        "annotations": [
            {"id": 1, "segmentation": {"counts": "a}]{[\\\"\\\\", "size": [1, 2]}, "bbox": [0, 0, 1, 1]},
            {"id": 2, "segmentation": [[[1, 2]], [None]], "bbox": [0, 0, 1, 1]},
            {"id": 3, "segmentation": [], "bbox": [0, 0, 1, 1]},
            {"id": 4, "segmentation": [[1e-3, -2.5E+2], [3]], "bbox": [0, 0, 1, 1]},
        ],
        "categories": [],
    }
    full = json.loads(json.dumps(tricky))
    out = parse_bytes(json.dumps(tricky).encode(), keep_segmentation=False)
    assert out["images"] == full["images"] and out['key\\"segmentation'] == [[1, 2]]
    for a, b in zip(out["annotations"], full["annotations"]):
        assert {k: v for k, v in a.items() if k != "segmentation"} == {
            k: v for k, v in b.items() if k != "segmentation"}
    assert [a["segmentation"] for a in out["annotations"]] == [0, [[[1, 2]], [None]], [], 0]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet='ab[]{}",:\\ segmtion', max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["segmentation", "id", "a", 'x\\"segmentation']), inner, max_size=3),
    max_leaves=15,
)


@settings(max_examples=150, deadline=None)
@given(_json)
def test_stripping_never_changes_anything_but_segmentation_values(value: Any) -> None:
    doc = {"annotations": [{"id": 1, "segmentation": value, "other": value}], "v": value}
    data = json.dumps(doc).encode()
    out = parse_bytes(data, keep_segmentation=False)
    full = json.loads(data)

    def drop(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: (None if k == "segmentation" else drop(v)) for k, v in x.items()}
        if isinstance(x, list):
            return [drop(v) for v in x]
        return x

    assert drop(out) == drop(full)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["annotations"][1].pop("category_id"),
     r"annotation #1 \(id 2\): missing field 'category_id'; expected an integer"),
    (lambda d: d["annotations"][2].update(category_id=5),
     r"annotation #2 \(id 3\): field 'category_id' is 5, which points to no category"),
    (lambda d: d["annotations"][0].update(image_id=12345),
     r"annotation #0 \(id 1\): field 'image_id' is 12345, which points to no image"),
    (lambda d: d["annotations"][3].update(bbox=[1, 2, 3]),
     r"annotation #3 \(id 4\): field 'bbox' is \[1, 2, 3\]; expected 4 numbers"),
    (lambda d: d["annotations"][3].update(bbox=[1, 2, -3, 4]),
     r"annotation #3 \(id 4\): field 'bbox' is \[1.0, 2.0, -3.0, 4.0\]; expected .*width and height >= 0"),
    (lambda d: d["annotations"][0].update(bbox=[1, 2, "3", 4]),
     r"annotation #0 \(id 1\): field 'bbox' is \[1, 2, '3', 4\]; expected 4 numbers"),
    (lambda d: d["annotations"][2].update(id=1),
     r"annotation #2 \(id 1\): duplicate annotation id 1 \(first at annotation #0\)"),
    (lambda d: d["annotations"][1].update(iscrowd=2),
     r"annotation #1 \(id 2\): field 'iscrowd' is 2; expected 0 or 1"),
    (lambda d: d["images"][2].update(id=10),
     r"image #2 \(id 10\): duplicate image id 10 \(also image #0\); expected unique ids"),
    (lambda d: d["categories"][1].update(id=90),
     r"category #1 \(id 90\): duplicate category id 90 \(also category #0\)"),
    (lambda d: d["images"][1].pop("id"), r"image #1: missing field 'id'; expected an integer"),
    (lambda d: d["categories"][0].update(name=None), r"category #0 \(id 90\): field 'name' is None"),
    (lambda d: d.pop("annotations"),
     r"not a COCO instances file: missing key 'annotations' \(top-level keys: categories, images, info"),
    (lambda d: d.update(images={"id": 1}), r"top-level 'images' is a dict; expected a list"),
])
def test_malformed_input_names_field_and_record(tmp_path: Path, mutate: Any, message: str) -> None:
    data = small()
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(DataError, match=message) as info:
        coco.load(path)
    assert str(path) in str(info.value)


def test_not_json_and_not_coco(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"is not valid JSON .*expected a COCO instances file"):
        coco.load(write(tmp_path, b'{"images": [1, 2'))
    with pytest.raises(DataError, match=r"top level is a list; expected an object"):
        coco.load(write(tmp_path, [1, 2, 3]))
    with pytest.raises(DataError, match=r"does not exist"):
        coco.load(tmp_path / "missing.json")


def test_lenient_mode_skips_and_counts_bad_annotations(tmp_path: Path) -> None:
    data = small()
    data["annotations"][0]["bbox"] = [0, 0, -1, 5]
    data["annotations"][2]["category_id"] = 1234
    data["annotations"].append("not a record")
    data["annotations"].append({"id": 4, "image_id": 10, "category_id": 44, "bbox": [0, 0, 1, 1]})
    path = write(tmp_path, data)
    with pytest.raises(DataError, match=r"annotation #0 \(id 1\).*\(4 bad annotations in all\)"):
        coco.load(path)
    index = coco.load(path, skip_invalid=True)
    assert [s.position for s in index.skipped] == [0, 2, 4, 5]
    assert "duplicate annotation id 4" in index.skipped[3].reason
    assert index.ann_ids.tolist() == [2, 4]
    assert index.ann_pos.tolist() == [1, 3]
    assert index.instances_per_class().tolist() == [1, 0, 1]


def test_empty_lists_load(tmp_path: Path) -> None:
    index = coco.load(write(tmp_path, {"images": [], "annotations": [], "categories": []}))
    assert index.num_images == index.num_annotations == index.num_categories == 0
    assert index.bbox.shape == (0, 4)
