"""Class-weight schemes, normalisation, zero counts and counts files (tracker.weights)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracker.errors import ConfigError, DataError
from tracker.weights import SCHEMES, class_weights, load_counts

COCO_COUNTS = Path(__file__).resolve().parents[1] / "data/coco/train2017_class_counts.json"


def _coco() -> np.ndarray:
    return load_counts(COCO_COUNTS).counts


@pytest.mark.parametrize(
    ("scheme", "kwargs", "formula"),
    [
        ("inverse", {}, lambda n: 1 / n),
        ("inverse_sqrt", {}, lambda n: n**-0.5),
        ("effective_number", {"beta": 0.99}, lambda n: (1 - 0.99) / (1 - 0.99**n)),
        ("power", {"power": 0.3}, lambda n: (1 / n) ** 0.3),
        ("none", {}, lambda n: np.ones_like(n)),
    ],
)
def test_schemes_follow_their_formula_up_to_normalisation(scheme, kwargs, formula) -> None:
    counts = np.array([5.0, 50.0, 500.0, 1.0, 12345.0])
    raw = formula(counts)
    got = class_weights(counts, scheme, normalize="none", **kwargs)
    np.testing.assert_allclose(got, raw, rtol=1e-12)
    mean_one = class_weights(counts, scheme, **kwargs)
    np.testing.assert_allclose(mean_one, raw * len(raw) / raw.sum(), rtol=1e-12)
    assert mean_one.mean() == pytest.approx(1.0)


def test_normalisations_mean_sum_instances() -> None:
    counts = np.array([10.0, 1000.0, 3.0])
    mean = class_weights(counts, "inverse", normalize="mean")
    total = class_weights(counts, "inverse", normalize="sum")
    np.testing.assert_allclose(mean, total)
    assert total.sum() == pytest.approx(3.0)
    instances = class_weights(counts, "inverse", normalize="instances")
    assert (instances * counts).sum() / counts.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(instances / instances[0], mean / mean[0])


def test_power_one_is_inverse_and_half_is_inverse_sqrt() -> None:
    counts = _coco()
    np.testing.assert_allclose(class_weights(counts, "power", power=1.0), class_weights(counts, "inverse"))
    np.testing.assert_allclose(class_weights(counts, "power", power=0.5), class_weights(counts, "inverse_sqrt"))


def test_coco_inverse_ratio_matches_the_instance_ratio() -> None:
    counts = _coco()
    w = class_weights(counts, "inverse")
    assert w.max() / w.min() == pytest.approx(counts.max() / counts.min())
    assert np.argmin(w) == int(np.argmax(counts))  # person gets the smallest weight


@pytest.mark.parametrize("scheme", ["inverse", "inverse_sqrt", "effective_number", "power"])
def test_zero_count_gets_the_rarest_present_class_weight(scheme: str) -> None:
    counts = np.array([100.0, 0.0, 7.0, 0.0])
    w = class_weights(counts, scheme, normalize="none")
    assert np.all(np.isfinite(w))
    assert w[1] == w[3] == w[2] == w.max()


def test_all_zero_counts_give_ones() -> None:
    np.testing.assert_array_equal(class_weights([0, 0, 0], "inverse"), np.ones(3))


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(min_value=0, max_value=10**7), min_size=1, max_size=90),
    scheme=st.sampled_from(["inverse", "inverse_sqrt", "effective_number", "power"]),
    beta=st.floats(min_value=0.0, max_value=0.99999),
    power=st.floats(min_value=0.0, max_value=4.0),
    normalize=st.sampled_from(["mean", "none"]),
)
def test_weights_are_always_finite_and_positive(counts, scheme, beta, power, normalize) -> None:
    w = class_weights(counts, scheme, beta=beta, power=power, normalize=normalize)
    assert w.shape == (len(counts),)
    assert np.all(np.isfinite(w)) and np.all(w > 0)


def test_manual_weights_are_normalised_or_kept() -> None:
    np.testing.assert_allclose(class_weights(scheme="manual", weights=[1, 3]), [0.5, 1.5])
    np.testing.assert_allclose(class_weights(scheme="manual", weights=[1, 3], normalize="none"), [1, 3])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scheme": "bogus", "counts": [1]}, "Unknown weight scheme 'bogus'; available: none, inverse"),
        ({"scheme": "inverse"}, "needs class counts"),
        ({"scheme": "inverse", "counts": [1, -2]}, "counts[1] is -2.0; expected finite numbers >= 0"),
        ({"scheme": "inverse", "counts": [1, float("nan")]}, "counts[1] is nan"),
        ({"scheme": "effective_number", "counts": [1], "beta": 1.0}, "beta is 1.0; expected 0 <= beta < 1"),
        ({"scheme": "power", "counts": [1], "power": -1.0}, "power is -1.0"),
        ({"scheme": "manual"}, "scheme 'manual' needs weights"),
        ({"scheme": "manual", "weights": [0, 0]}, "weights are all zero"),
        ({"scheme": "inverse", "counts": [1], "weights": [1]}, "weights are only used with scheme 'manual'"),
        ({"scheme": "inverse", "counts": [1, 2], "num_classes": 3}, "counts has 2 entries; expected 3"),
        ({"scheme": "inverse", "counts": [1], "normalize": "max"}, "normalize is 'max'; expected one of mean"),
        ({"scheme": "none"}, "needs num_classes or counts"),
    ],
)
def test_bad_arguments_name_the_value_and_the_fix(kwargs, message) -> None:
    with pytest.raises(ConfigError) as info:
        class_weights(**kwargs)
    assert message in str(info.value)


def test_scheme_list_is_complete() -> None:
    assert set(SCHEMES) == {"none", "inverse", "inverse_sqrt", "effective_number", "power", "manual"}


def test_load_counts_reads_the_coco_counts_file() -> None:
    loaded = load_counts(COCO_COUNTS)
    raw = json.loads(COCO_COUNTS.read_text())
    assert loaded.names == [c["name"] for c in raw["categories"]]
    assert loaded.counts.sum() == raw["annotations"]
    assert loaded.names[0] == "person" and loaded.counts[0] == max(loaded.counts)


@pytest.mark.parametrize(
    "payload",
    [
        {"cat": 3, "dog": 5},
        [3, 5],
        [["cat", 3], ["dog", 5]],
        [{"name": "cat", "count": 3}, {"name": "dog", "count": 5}],
    ],
)
def test_load_counts_accepts_mappings_and_lists(tmp_path: Path, payload) -> None:
    path = tmp_path / "counts.json"
    path.write_text(json.dumps(payload))
    loaded = load_counts(path)
    np.testing.assert_array_equal(loaded.counts, [3, 5])
    assert len(loaded.names) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        ('"text"', "holds a str; expected class counts (accepted: a COCO instances file"),
        ("[]", "lists no classes"),
        ('{"cat": "many"}', "count of 'cat' is 'many'"),
        ('{"cat": -1}', "counts[0] is -1.0"),
        ('[{"name": "cat"}]', "expected a count under 'instances' or 'count'"),
    ],
)
def test_load_counts_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "counts.json"
    path.write_text(content)
    with pytest.raises(DataError) as info:
        load_counts(path)
    assert message in str(info.value)


def test_load_counts_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_counts(tmp_path / "nope.json")


COCO_INSTANCES = Path(__file__).resolve().parents[1] / "data/coco/instances_val2014_100.json"


def test_load_counts_counts_the_instances_of_a_coco_file() -> None:
    data = json.loads(COCO_INSTANCES.read_text())
    expected = {c["name"]: 0 for c in data["categories"]}
    names = {c["id"]: c["name"] for c in data["categories"]}
    for ann in data["annotations"]:
        expected[names[ann["category_id"]]] += 1
    loaded = load_counts(COCO_INSTANCES)
    assert loaded.names == [c["name"] for c in data["categories"]]
    assert dict(zip(loaded.names, loaded.counts.tolist())) == expected
    assert len(loaded.names) == 80 and loaded.counts.sum() == len(data["annotations"])


def test_weights_command_reads_a_coco_instances_file() -> None:
    from click.testing import CliRunner

    from tracker.cli import build_cli

    res = CliRunner().invoke(build_cli(), ["weights", "--counts", str(COCO_INSTANCES), "--format", "json"])
    assert res.exit_code == 0, res.output
    classes = json.loads(res.output)["classes"]
    loaded = load_counts(COCO_INSTANCES)
    assert [c["class"] for c in classes] == loaded.names
    assert [c["count"] for c in classes] == [int(n) for n in loaded.counts]


def test_a_refused_counts_file_lists_the_accepted_formats(tmp_path: Path) -> None:
    path = tmp_path / "categories.json"
    path.write_text(json.dumps([{"id": 1, "name": "person", "supercategory": "person"}]))
    with pytest.raises(DataError) as info:
        load_counts(path)
    message = str(info.value)
    assert f"counts file {str(path)!r} entry 0 has keys ['id', 'name', 'supercategory']" in message
    for accepted in ("a COCO instances file", '{"categories": [{"name": ..., "instances": n}, ...]}',
                     "{name: count}", "[count, ...]", "[[name, count], ...]"):
        assert accepted in message
