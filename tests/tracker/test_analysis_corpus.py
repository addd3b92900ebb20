"""The labelled corpus: precision and recall per detector, divergence delay."""

from __future__ import annotations

import numpy as np
import pytest

from tracker.analysis.corpus import (
    DIVERGENCE_DEADLINE,
    KINDS,
    Label,
    Score,
    class_cases,
    evaluate,
    format_table,
    match,
    rank_cases,
    scalar_cases,
)
from tracker.errors import ConfigError
from tracker.events import Event

TARGET = 0.95


def test_corpus_is_seeded_and_labelled() -> None:
    a, b = scalar_cases(2, seed=3), scalar_cases(2, seed=3)
    assert [c.name for c in a] == [f"{k}-{i:03d}" for k in KINDS for i in range(2)]
    assert all(np.array_equal(x.values, y.values, equal_nan=True) for x, y in zip(a, b))
    assert not np.array_equal(a[0].values, scalar_cases(2, seed=4)[0].values)
    by_kind = {c.kind: c for c in a}
    assert by_kind["converging"].labels == []
    assert {lb.kind for lb in by_kind["diverging"].labels} == {"divergence"}
    nan_case = by_kind["non_finite"]
    assert all(not np.isfinite(nan_case.values[lb.onset]) for lb in nan_case.labels)
    spike_case = by_kind["spikes"]
    values = spike_case.values
    assert all(values[lb.onset] > 2 * np.median(values[lb.onset - 20 : lb.onset]) for lb in spike_case.labels)
    assert any(c.stagnant for c in class_cases(4)) and any(r.expected_steps for r in rank_cases(4))
    with pytest.raises(ConfigError, match="too short"):
        scalar_cases(1, length=100)


def test_match_counts_true_and_false_positives() -> None:
    score = Score("spike")
    labels = [Label("spike", 10, 10, 10), Label("spike", 50, 50, 50)]
    events = [Event(10, "spike", ""), Event(11, "spike", ""), Event(99, "plateau", "")]
    match(events, labels, score)
    assert (score.tp, score.fp, score.fn) == (1, 1, 1)
    assert score.precision == 0.5 and score.recall == 0.5


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_every_detector_meets_the_precision_and_recall_targets(seed: int) -> None:
    scores = evaluate(per_kind=30, seed=seed)
    print("\n" + format_table(scores))
    for name, score in scores.items():
        assert score.tp + score.fn > 0, name
        assert score.precision >= TARGET, (name, score.to_dict())
        assert score.recall >= TARGET, (name, score.to_dict())
    delays = scores["divergence"].delays
    assert len(delays) == 30 and min(delays) >= 0 and max(delays) <= DIVERGENCE_DEADLINE
