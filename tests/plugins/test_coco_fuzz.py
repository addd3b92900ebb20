"""A fuzz of ``tracker coco stats|balance|split`` over generated valid and invalid files.

For every generated file and option set: no traceback (only click's own exit), exit
status 0 exactly when the file and the options are valid, and on failure one error
line on stderr, nothing on stdout and no output file. On success the output files
are COCO files holding a subset of the input's images and annotations. The profile
is fixed (derandomized, a set number of examples), so a run takes about half a minute.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracker.cli import build_cli

settings.register_profile(
    "coco-fuzz", max_examples=200, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile("coco-fuzz")

NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)
BOX = st.lists(st.floats(0, 1e4, allow_nan=False), min_size=4, max_size=4)


@st.composite
def valid_coco(draw: st.DrawFn) -> dict[str, Any]:
    image_ids = draw(st.lists(st.integers(-3, 2**40), unique=True, max_size=10))
    cat_ids = draw(st.lists(st.integers(0, 300), unique=True, max_size=5))
    images = [{"id": i, "width": draw(st.integers(1, 5000)), "height": draw(st.integers(1, 5000)),
               "file_name": f"{i}.jpg"} for i in image_ids]
    categories = [{"id": c, "name": draw(NAMES), "supercategory": draw(NAMES)} for c in cat_ids]
    annotations = []
    if image_ids and cat_ids:
        ann_ids = draw(st.lists(st.integers(0, 2**50), unique=True, max_size=25))
        for a in ann_ids:
            ann: dict[str, Any] = {"id": a, "image_id": draw(st.sampled_from(image_ids)),
                                   "category_id": draw(st.sampled_from(cat_ids)), "bbox": draw(BOX)}
            if draw(st.booleans()):
                ann["area"] = draw(st.floats(0, 1e8, allow_nan=False))
            if draw(st.booleans()):
                ann["iscrowd"] = draw(st.sampled_from([0, 1]))
            if draw(st.booleans()):
                ann["segmentation"] = [[0.0, 0.0, 1.0, 0.0, 1.0, 1.0]]
            annotations.append(ann)
    return {"info": {}, "images": images, "annotations": annotations, "categories": categories}


def _break(coco: dict[str, Any], how: str) -> Any:
    """``coco`` made invalid in one way (some ways need a record of a kind)."""
    images, anns, cats = coco["images"], coco["annotations"], coco["categories"]
    if how == "top level list":
        return [coco]
    if how.startswith("missing "):
        return {k: v for k, v in coco.items() if k != how.split()[1]}
    if how == "images not a list":
        return {**coco, "images": {"0": images}}
    if how == "image id a string" and images:
        images[0]["id"] = str(images[0]["id"])
    elif how == "duplicate image id" and images:
        images.append(dict(images[0]))
    elif how == "image width a float" and images:
        images[0]["width"] = 1.5
    elif how == "category name not a string" and cats:
        cats[0]["name"] = 7
    elif how == "duplicate category id" and cats:
        cats.append(dict(cats[0]))
    elif how == "category not an object" and cats:
        cats[0] = "person"
    elif how == "annotation image unknown" and anns:
        anns[0]["image_id"] = max(i["id"] for i in images) + 1
    elif how == "annotation category unknown" and anns:
        anns[0]["category_id"] = max(c["id"] for c in cats) + 1
    elif how == "bbox of three" and anns:
        anns[0]["bbox"] = anns[0]["bbox"][:3]
    elif how == "negative width" and anns:
        anns[0]["bbox"][2] = -1.0
    elif how == "iscrowd 2" and anns:
        anns[0]["iscrowd"] = 2
    elif how == "duplicate annotation id" and anns:
        anns.append(dict(anns[0]))
    elif how == "annotation id too large" and anns:
        anns[0]["id"] = 2**70
    elif how == "annotation not an object" and anns:
        anns[0] = [1, 2]
    elif how == "area negative" and anns:
        anns[0]["area"] = -3.0
    else:
        return [] if how != "empty object" else {}
    return coco


BREAKS = ("top level list", "missing images", "missing annotations", "missing categories",
          "images not a list", "image id a string", "duplicate image id", "image width a float",
          "category name not a string", "duplicate category id", "category not an object",
          "annotation image unknown", "annotation category unknown", "bbox of three", "negative width",
          "iscrowd 2", "duplicate annotation id", "annotation id too large", "annotation not an object",
          "area negative", "empty object")
RAW_BAD = st.sampled_from([b"", b"{", b"[1, 2", b"\xff\xfe\x00", b"null", b'{"images": [], "annotations": []}'])


@dataclass
class Case:
    content: bytes
    valid_file: bool


@st.composite
def coco_file(draw: st.DrawFn) -> Case:
    kind = draw(st.sampled_from(["valid", "valid", "broken", "raw"]))
    if kind == "raw":
        return Case(draw(RAW_BAD), False)
    coco = draw(valid_coco())
    if kind == "valid":
        return Case(json.dumps(coco).encode(), True)
    how = draw(st.sampled_from(BREAKS))
    return Case(json.dumps(_break(coco, how)).encode(), False)


OPTIONAL_INT = st.one_of(st.none(), st.integers(-2, 30))


def _subset_of(out: Path, source: dict[str, Any]) -> None:
    got = json.loads(out.read_bytes())
    assert {i["id"] for i in got["images"]} <= {i["id"] for i in source["images"]}
    assert {a["id"] for a in got["annotations"]} <= {a["id"] for a in source["annotations"]}
    assert {a["image_id"] for a in got["annotations"]} <= {i["id"] for i in got["images"]}


def _check(args: list[str], valid: bool, outputs: list[Path], case: Case) -> None:
    res = CliRunner().invoke(build_cli(), args)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        raise AssertionError(
            f"{args} raised {res.exception!r} on {case.content[:300]!r}:\n"
            + "".join(traceback.format_exception(res.exception))
        )
    assert "Traceback" not in res.output
    if valid:
        assert res.exit_code == 0, (args, res.output, case.content[:300])
        for out in outputs:
            _subset_of(out, json.loads(case.content))
    else:
        assert res.exit_code != 0, (args, res.output, case.content[:300])
        assert res.stdout == "", res.stdout
        assert "Error" in res.stderr
        assert not any(out.exists() for out in outputs)


@FUZZ
@given(case=coco_file(), fmt=st.sampled_from(["table", "csv", "json"]))
def test_fuzz_stats(case: Case, fmt: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.json"
        src.write_bytes(case.content)
        _check(["coco", "stats", str(src), "--format", fmt], case.valid_file, [], case)


@FUZZ
@given(case=coco_file(), per_class=OPTIONAL_INT, max_images=OPTIONAL_INT, min_per_class=OPTIONAL_INT,
       target=st.sampled_from(["uniform", "sqrt"]), seed=st.integers(0, 3))
def test_fuzz_balance(case: Case, per_class: int | None, max_images: int | None, min_per_class: int | None,
                      target: str, seed: int) -> None:
    options_ok = (per_class is not None or max_images is not None) and (per_class is None or per_class >= 1) \
        and (max_images is None or max_images >= 1) and (min_per_class is None or min_per_class >= 0)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_bytes(case.content)
        args = ["coco", "balance", str(src), "--out", str(out), "--target", target, "--seed", str(seed)]
        for flag, value in (("--per-class", per_class), ("--max-images", max_images),
                            ("--min-per-class", min_per_class)):
            if value is not None:
                args += [flag, str(value)]
        _check(args, case.valid_file and options_ok, [out], case)


@FUZZ
@given(case=coco_file(), val=st.sampled_from([0.1, 0.5, 0.9, 0.0, 1.0, -0.2, 2.0, math.nan]), seed=st.integers(0, 3))
def test_fuzz_split(case: Case, val: float, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src, out_dir = Path(tmp) / "in.json", Path(tmp) / "split"
        src.write_bytes(case.content)
        outputs = [out_dir / "in_train.json", out_dir / "in_val.json"]
        args = ["coco", "split", str(src), "--val", str(val), "--out-dir", str(out_dir), "--seed", str(seed)]
        _check(args, case.valid_file and 0 < val < 1, outputs, case)


def test_balance_of_a_valid_file_without_annotations_writes_an_empty_subset(tmp_path: Path) -> None:
    src, out = tmp_path / "in.json", tmp_path / "out.json"
    src.write_text(json.dumps({"images": [{"id": 1, "width": 4, "height": 4, "file_name": "a.jpg"}],
                               "annotations": [], "categories": [{"id": 1, "name": "person"}]}))
    for extra in (["--max-images", "1"], ["--per-class", "3", "--target", "sqrt"]):
        res = CliRunner().invoke(build_cli(), ["coco", "balance", str(src), "--out", str(out), *extra])
        assert res.exit_code == 0 and res.exception is None, res.output
        assert json.loads(out.read_text())["images"] == [] and "0 images" in res.stdout
