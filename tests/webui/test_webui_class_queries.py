"""webui.class_queries without Streamlit: heatmap, ranking, shares, counts and groups."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tracker.errors import DataError
from webui import class_queries as cq

COCO_100 = Path(__file__).resolve().parents[1] / "data" / "coco" / "instances_val2014_100.json"
COCO_COUNTS = Path(__file__).resolve().parents[1] / "data" / "coco" / "train2017_class_counts.json"


def test_class_keys_and_names(store, seeded) -> None:
    assert cq.class_keys(store, "run-bce") == ["loss/cls"]
    assert cq.class_keys(store, "run-detr") == []
    view = cq.class_view(store, "run-bce", "loss/cls", buckets=200, last_steps=100)
    assert view.names == seeded.classes
    assert view.cells.height == 4 * 30
    assert view.ranked["points"].to_list() == [10, 10, 10, 10]  # steps 200..290


def test_heatmap_cells_are_bucket_means(store, seeded) -> None:
    cells = cq.heatmap(store, "run-bce", "loss/cls", buckets=5)
    assert cells.height == 4 * 5
    steps = np.arange(0, 300, 10)
    for row in cells.filter(pl.col("class_name") == "hair drier").iter_rows(named=True):
        inside = steps[(steps >= row["step"]) & (steps <= row["step_end"])]
        expected = np.mean([seeded.bce_classes(int(s))[3] for s in inside])
        assert row["value"] == pytest.approx(expected) and row["n"] == inside.size
    raw = cq.heatmap(store, "run-bce", "loss/cls", buckets=200)
    assert raw.filter(pl.col("class_index") == 0)["step"].to_list() == steps.tolist()


def test_heatmap_shows_only_visible_rows_after_resume(store, seeded) -> None:
    cells = cq.heatmap(store, "run-w", "loss/cls", buckets=200)
    assert cells["step"].max() == 140  # segment 0 rows from step 150 on are superseded by the resume
    zoom = cq.heatmap(store, "run-w", "loss/cls", lo=100, hi=120, buckets=200)
    assert sorted(set(zoom["step"])) == [100, 110, 120]


def test_ranking_over_the_last_steps(store, seeded) -> None:
    ranked = cq.ranking(store, "run-bce", "loss/cls", last_steps=50)
    assert ranked["class_name"].to_list() == ["hair drier", "bicycle", "car", "person"]
    last = [250, 260, 270, 280, 290]
    assert ranked["points"].to_list() == [5, 5, 5, 5]
    assert ranked["mean"][0] == pytest.approx(np.mean([seeded.bce_classes(s)[3] for s in last]))
    assert ranked["share"].sum() == pytest.approx(1.0)


def test_share_over_time_sums_to_one_and_keeps_top_classes(store) -> None:
    share = cq.shares(cq.heatmap(store, "run-bce", "loss/cls", buckets=6), top=2)
    assert set(share["class_name"]) == {"hair drier", "bicycle", "other"}
    sums = share.group_by("bucket").agg(pl.col("share").sum())["share"].to_numpy()
    np.testing.assert_allclose(sums, 1.0)
    first = share.filter(pl.col("bucket") == 0)
    other = first.filter(pl.col("class_name") == "other")["value"][0]
    assert other == pytest.approx(0.1 + 0.2)


def test_counts_and_weights_from_config(seeded) -> None:
    names = seeded.classes
    assert cq.counts_from_config({"class_counts": seeded.counts}, names).tolist() == seeded.counts
    by_name = cq.counts_from_config({"class_counts": {"car": 5, "person": 9}}, names)
    assert by_name[0] == 9 and by_name[2] == 5 and np.isnan(by_name[1])
    assert cq.counts_from_config({}, names) is None
    assert cq.weights_from_config({"class_weights": seeded.weights}, 4).tolist() == seeded.weights
    assert cq.weights_from_config({"class_weights": [1.0]}, 4) is None


def test_groups_split_by_count_thirds(store, seeded) -> None:
    ranked = cq.ranking(store, "run-w", "loss/cls", last_steps=1000)
    out = cq.with_counts(ranked, np.array(seeded.counts, float), np.array(seeded.weights))
    group = dict(zip(out["class_name"], out["group"]))
    assert group == {"hair drier": "rare", "bicycle": "rare", "car": "common", "person": "frequent"}
    assert dict(zip(out["class_name"], out["weight"]))["hair drier"] == 3.0
    cells = cq.heatmap(store, "run-w", "loss/cls", buckets=200)
    curves = cq.group_means(cells, {"rare": [1, 3], "frequent": [0]})
    rare0 = curves.filter((pl.col("group") == "rare") & (pl.col("step") == 0))["value"][0]
    assert rare0 == pytest.approx((seeded.w_classes(0)[1] + seeded.w_classes(0)[3]) / 2)


def test_counts_from_a_coco_instances_file_match_pycocotools() -> None:
    from pycocotools.coco import COCO

    counts = cq.load_counts_file(COCO_100)
    coco = COCO(str(COCO_100))
    for cat in coco.loadCats(coco.getCatIds()):
        assert counts[cat["name"]] == len(coco.getAnnIds(catIds=[cat["id"]], iscrowd=None))
    assert len(counts) == 80


def test_counts_from_the_train2017_count_file() -> None:
    counts = cq.load_counts_file(COCO_COUNTS)
    assert counts["person"] == 262465 and counts["hair drier"] == 198 and len(counts) == 80


def test_bad_counts_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        cq.load_counts_file(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        cq.load_counts_file(bad)
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"person": "many"}))
    with pytest.raises(DataError, match="person"):
        cq.load_counts_file(odd)
