"""The balanced subset builder and the stratified split."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracker import coco
from tracker.coco.synthetic import read_counts, scale_counts, write_synthetic
from tracker.errors import ConfigError

COCO_DATA = Path(__file__).resolve().parents[1] / "data" / "coco"
balance_mod = importlib.import_module("tracker.coco.balance")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> coco.CocoIndex:
    counts = scale_counts(read_counts(COCO_DATA / "train2017_class_counts.json"), 0.02)
    path = write_synthetic(tmp_path_factory.mktemp("bal") / "syn.json", counts, 2400, seed=5)
    return coco.load(path)


def subset_counts(index: coco.CocoIndex, images: np.ndarray) -> np.ndarray:
    mask = np.zeros(index.num_images, dtype=bool)
    mask[images] = True
    return np.bincount(index.ann_category[mask[index.ann_image]], minlength=index.num_categories)


def test_max_images_balances_far_better_than_random(index: coco.CocoIndex) -> None:
    result = coco.balance(index, max_images=600, min_per_class=20)
    assert result.num_images == 600 and len(np.unique(result.images)) == 600
    after = subset_counts(index, result.images)
    assert after.tolist() == result.after.tolist()
    rng = np.random.default_rng(0)
    random = subset_counts(index, rng.choice(index.num_images, 600, replace=False))
    person = index.category_index(1)
    assert after[person] / after.sum() < 0.10 < random[person] / random.sum()
    assert coco.normalized_entropy(after) > 0.95 > coco.normalized_entropy(random)
    assert coco.imbalance_ratio(after) < coco.imbalance_ratio(random) / 5
    assert (after >= np.minimum(index.instances_per_class(), 20)).all()


def test_seed_changes_ties_not_quality_and_is_deterministic(index: coco.CocoIndex) -> None:
    a = coco.balance(index, max_images=300, seed=1)
    b = coco.balance(index, max_images=300, seed=1)
    c = coco.balance(index, max_images=300, seed=2)
    assert a.images.tolist() == b.images.tolist()
    assert a.images.tolist() != c.images.tolist()
    assert abs(coco.normalized_entropy(a.after) - coco.normalized_entropy(c.after)) < 0.02


def test_per_class_caps_and_sqrt_target(index: coco.CocoIndex) -> None:
    result = coco.balance(index, per_class=40)
    totals = index.instances_per_class()
    target = np.minimum(totals, 40)
    assert result.target.tolist() == target.tolist()
    after = result.after
    assert np.median(np.abs(after - target) / np.maximum(target, 1)) < 0.3
    assert after.max() <= 2 * 40 < totals.max()
    assert after.sum() < 1.2 * target.sum()
    sqrt = coco.balance(index, max_images=600, target="sqrt")
    uniform = coco.balance(index, max_images=600)
    assert sqrt.after.max() / sqrt.after.sum() > uniform.after.max() / uniform.after.sum()
    big, small = int(np.argmax(totals)), int(np.argmin(np.where(totals > 0, totals, 10**9)))
    assert sqrt.target[big] / max(sqrt.target[small], 1) > uniform.target[big] / max(uniform.target[small], 1)


def test_budget_larger_than_the_file_takes_every_annotated_image(index: coco.CocoIndex) -> None:
    result = coco.balance(index, max_images=10**6)
    annotated = np.unique(index.ann_image)
    assert result.images.tolist() == annotated.tolist()


@pytest.mark.parametrize("kwargs, message", [
    ({}, r"needs --per-class N or --max-images M"),
    ({"per_class": 0}, r"per_class 0 must be >= 1"),
    ({"max_images": -1}, r"max_images -1 must be >= 1"),
    ({"max_images": 5, "target": "log"}, r"Unknown target 'log'; available: uniform, sqrt"),
])
def test_bad_arguments(index: coco.CocoIndex, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        coco.balance(index, **kwargs)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 500), min_size=1, max_size=12), st.floats(0, 3000), st.booleans())
def test_waterfill_meets_the_budget_under_the_totals(totals: list[int], budget: float, sqrt: bool) -> None:
    t = np.array(totals, dtype=float)
    q = np.sqrt(t) if sqrt else (t > 0).astype(float)
    out = coco.waterfill(t, q, budget)
    assert (out <= t + 1e-9).all() and (out >= 0).all()
    assert out.sum() == pytest.approx(min(budget, t.sum()), rel=1e-9, abs=1e-6)
    uncapped = (out < t - 1e-9) & (q > 0)
    if uncapped.sum() > 1:
        level = out[uncapped] / q[uncapped]
        assert level.max() == pytest.approx(level.min())


def test_gains_are_the_exact_change_of_the_objective(index: coco.CocoIndex) -> None:
    problem = balance_mod._problem(index, "uniform")
    target = np.maximum(1.0, np.minimum(problem.totals, 30.0))
    problem.add(np.arange(0, 200))
    base = balance_mod.objective(problem.counts, target)
    gains = problem.gains(target)
    for image in (250, 400, 999):
        problem.add(np.array([image]))
        assert base - balance_mod.objective(problem.counts, target) == pytest.approx(gains[image])
        problem.remove(np.array([image]))


def test_stratified_split_partitions_and_stratifies(index: coco.CocoIndex) -> None:
    result = coco.stratified_split(index, val=0.2, seed=0)
    both = np.concatenate([result.train, result.val])
    assert sorted(both.tolist()) == list(range(index.num_images))
    assert abs(len(result.val) - 0.2 * index.num_images) <= 2
    indptr, classes = index.image_classes()
    holds = np.bincount(classes, minlength=index.num_categories)
    in_val = np.zeros(index.num_images, dtype=bool)
    in_val[result.val] = True
    img_of = np.repeat(np.arange(index.num_images), np.diff(indptr))
    val_holds = np.bincount(classes[in_val[img_of]], minlength=index.num_categories)
    ok = holds >= 10
    err = np.abs(val_holds[ok] / holds[ok] - 0.2)
    rng = np.random.default_rng(0)
    rand_val = np.zeros(index.num_images, dtype=bool)
    rand_val[rng.choice(index.num_images, len(result.val), replace=False)] = True
    rand_err = np.abs(np.bincount(classes[rand_val[img_of]], minlength=index.num_categories)[ok] / holds[ok] - 0.2)
    assert err.max() < 0.06 and err.mean() < rand_err.mean() / 2
    again = coco.stratified_split(index, val=0.2, seed=0)
    assert again.val.tolist() == result.val.tolist()


@pytest.mark.parametrize("val", [0.0, 1.0, -0.1, 1.5])
def test_split_rejects_bad_fractions(index: coco.CocoIndex, val: float) -> None:
    with pytest.raises(ConfigError, match=r"strictly between 0 and 1"):
        coco.stratified_split(index, val=val)
