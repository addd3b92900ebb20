"""The paired estimator of bench/assign_cost.py: per-block ratios, their median and its interval."""

from __future__ import annotations

import statistics

import pytest

from bench._threads import block_ratios, median_interval, outliers


def test_a_drift_between_blocks_cancels_in_the_block_ratios() -> None:
    base = [0.080, 0.081, 0.079, 0.082]
    a_blocks, b_blocks = [], []
    for speed in (1.0, 1.3, 0.9, 1.5):  # the machine's speed changes from block to block
        b_blocks.append([x * speed for x in base])
        a_blocks.append([x * speed * 1.01 for x in base])  # 1% slower within every block
    ratios = block_ratios(a_blocks, b_blocks)
    assert ratios == pytest.approx([0.01] * 4)
    assert max(map(max, a_blocks)) / min(map(min, a_blocks)) > 1.6  # the steps themselves swing by 60%
    med, lo, hi = median_interval(ratios)
    assert med == pytest.approx(0.01) and lo == pytest.approx(0.01) and hi == pytest.approx(0.01)


def test_the_interval_brackets_the_median_and_narrows_with_more_blocks() -> None:
    few = [0.02, -0.01, 0.03, 0.00, 0.01]
    med, lo, hi = median_interval(few)
    assert med == 0.01 and lo <= med <= hi and hi - lo > 0
    many = few * 8
    _, lo8, hi8 = median_interval(many)
    assert hi8 - lo8 < hi - lo


def test_means_are_paired_too_and_blocks_must_pair_up() -> None:
    assert block_ratios([[1.0, 3.0]], [[1.0, 1.0]], statistics.fmean) == [1.0]
    with pytest.raises(ValueError, match="pair up"):
        block_ratios([[1.0]], [[1.0], [2.0]])
    assert median_interval([]) != median_interval([])  # NaNs: nothing to estimate


def test_slow_steps_are_counted_with_their_share_of_the_time() -> None:
    steps = [0.1] * 9 + [0.4]
    n, share = outliers(steps)
    assert n == 1 and share == pytest.approx(0.3 / 1.3)
    assert outliers([0.1] * 10) == (0, 0.0)
