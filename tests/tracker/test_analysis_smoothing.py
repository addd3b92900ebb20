"""Smoothing, robust statistics and the trend test, against plain reference loops."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracker.analysis.smoothing import BLOCK, BlockMedian, Ema, RollingMedian, bucket_medians, ema, mad
from tracker.analysis.trend import mann_kendall, sens_slope, trend
from tracker.errors import ConfigError


def tensorboard_smoothing(values: list[float], weight: float) -> list[float]:
    """TensorBoard's scalar smoothing, written as its dashboard does it."""
    out, last, n = [], 0.0, 0
    for v in values:
        if not math.isfinite(v):
            out.append(v)
            continue
        last = last * weight + (1 - weight) * v
        n += 1
        out.append(last / (1 - weight**n))
    return out


def feed_in_chunks(stream: object, values: np.ndarray, cuts: list[int]) -> np.ndarray:
    bounds = sorted({0, values.size, *[c % (values.size + 1) for c in cuts]})
    return np.concatenate([stream.update(values[a:b]) for a, b in zip(bounds, bounds[1:])] or [np.empty(0)])


@pytest.mark.parametrize("weight", [0.0, 0.6, 0.9, 0.99, 0.999])
def test_ema_matches_tensorboard(weight: float) -> None:
    rng = np.random.default_rng(1)
    values = rng.lognormal(size=3 * BLOCK + 17)
    values[[5, 300, 301]] = [np.nan, np.inf, -np.inf]
    got = ema(values, weight)
    want = np.array(tensorboard_smoothing(values.tolist(), weight))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert np.isnan(got[5]) and got[300] == np.inf and got[301] == -np.inf


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 3 * BLOCK + 5),
    weight=st.sampled_from([0.5, 0.9, 0.95, 0.99]),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
    seed=st.integers(0, 2**16),
)
def test_ema_is_bit_identical_whatever_the_chunking(n: int, weight: float, cuts: list[int], seed: int) -> None:
    values = np.random.default_rng(seed).normal(3.0, 1.0, n)
    one = Ema(weight).update(values)
    many = feed_in_chunks(Ema(weight), values, cuts)
    assert np.array_equal(one, many)


def test_ema_rejects_a_weight_outside_zero_one() -> None:
    with pytest.raises(ConfigError, match="smoothing weight 1.0"):
        Ema(1.0)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3 * BLOCK), cuts=st.lists(st.integers(0, 10_000), max_size=8), seed=st.integers(0, 999))
def test_block_median_uses_the_previous_whole_block_whatever_the_chunking(n: int, cuts: list[int], seed: int) -> None:
    values = np.random.default_rng(seed).normal(size=n)
    got = feed_in_chunks(BlockMedian(), values, cuts)
    for i in range(n):
        block = i // BLOCK
        want = np.median(values[(block - 1) * BLOCK : block * BLOCK]) if block else np.nan
        assert got[i] == want or (np.isnan(want) and np.isnan(got[i]))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60), width=st.sampled_from([1, 3, 5, 7]),
    cuts=st.lists(st.integers(0, 100), max_size=8), seed=st.integers(0, 999),
)
def test_rolling_median_is_the_trailing_median(n: int, width: int, cuts: list[int], seed: int) -> None:
    values = np.random.default_rng(seed).normal(size=n)
    got = feed_in_chunks(RollingMedian(width), values, cuts)
    want = [np.median(values[max(0, i - width + 1) : i + 1]) for i in range(n)]
    np.testing.assert_array_equal(got, want)


def test_rolling_median_removes_an_isolated_spike_and_keeps_a_level_shift() -> None:
    values = np.ones(20)
    values[5] = 1000.0
    values[12:] = 3.0
    out = RollingMedian(5).update(values)
    assert out.max() == 3.0 and out[5] == 1.0
    assert out[14] == 3.0 and out[13] == 1.0


def test_rolling_median_width_must_be_odd() -> None:
    with pytest.raises(ConfigError, match="odd"):
        RollingMedian(4)


def test_mad_scales_to_the_normal_sd() -> None:
    values = np.random.default_rng(0).normal(0, 2.0, 200_000)
    assert mad(values) == pytest.approx(2.0, rel=0.02)
    assert math.isnan(mad(np.array([np.nan])))


def test_bucket_medians_downsamples_finite_points() -> None:
    steps = np.arange(1000)
    values = np.where(steps % 100 == 7, np.nan, steps.astype(float))
    xs, ys = bucket_medians(steps, values, 50)
    assert xs.size <= 50 and np.all(np.isfinite(ys)) and np.all(np.diff(xs) > 0)
    assert ys[0] == pytest.approx(np.median(values[np.isfinite(values)][:20]))
    with pytest.raises(ConfigError, match="at least 3"):
        bucket_medians(steps, values, 2)


def brute_force_s(x: list[float]) -> float:
    return float(sum(np.sign(x[j] - x[i]) for i in range(len(x)) for j in range(i + 1, len(x))))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=3, max_size=40))
def test_mann_kendall_s_matches_the_pairwise_sum(values: list[int]) -> None:
    s, _, _, p = mann_kendall(np.array(values, dtype=float))
    assert s == brute_force_s(values)
    assert 0.0 <= p <= 1.0


@pytest.mark.parametrize("values", [[1, 2, 2, 3, 3, 3, 5], [4, 4, 1, 2, 9, 9], [1, 2, 3, 4, 5, 6]])
def test_tie_corrected_variance_is_the_permutation_variance(values: list[int]) -> None:
    x = np.array(values, dtype=float)
    _, var, _, _ = mann_kendall(x)
    perms = {p for p in itertools.permutations(values)}
    ss = np.array([brute_force_s(list(p)) for p in perms])
    assert var == pytest.approx(float(ss.var()), rel=1e-12)


def test_mann_kendall_p_value_follows_the_normal_approximation() -> None:
    x = np.array([5.0, 3.0, 4.0, 2.0, 1.0, 0.5, 0.7, 0.2])
    s, var, z, p = mann_kendall(x)
    assert z == pytest.approx((s + 1) / math.sqrt(var))
    assert p == pytest.approx(math.erfc(abs(z) / math.sqrt(2)))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=25), st.integers(0, 999))
def test_sens_slope_is_the_median_pairwise_slope(values: list[float], seed: int) -> None:
    t = np.sort(np.random.default_rng(seed).choice(1000, size=len(values), replace=False)).astype(float)
    slopes = [
        (values[j] - values[i]) / (t[j] - t[i]) for i in range(len(values)) for j in range(i + 1, len(values))
    ]
    assert sens_slope(t, np.array(values)) == pytest.approx(float(np.median(slopes)))


def test_trend_directions_and_too_short() -> None:
    rng = np.random.default_rng(3)
    steps = np.arange(5000)
    falling = trend(steps, 2.0 * (1 + steps / 300) ** -0.5 * rng.lognormal(0, 0.1, 5000))
    flat = trend(steps, rng.lognormal(0, 0.2, 5000))
    rising = trend(steps, 1.0 + steps / 2000 + rng.normal(0, 0.1, 5000))
    assert falling is not None and falling.direction == "decreasing" and falling.confidence > 0.999
    assert falling.relative_slope < 0 and falling.tau < -0.5 and falling.n <= 500
    assert flat is not None and flat.direction == "none"
    assert rising is not None and rising.direction == "increasing" and rising.slope == pytest.approx(1 / 2000, rel=0.1)
    assert trend(steps[:5], steps[:5].astype(float)) is None
