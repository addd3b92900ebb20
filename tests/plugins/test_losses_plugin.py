"""The built-in losses plugin: its hooks, formulas, numpy kernel internals and memory bound."""

from __future__ import annotations

import importlib.util
import tracemalloc
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plugins.losses as plugin
from tests.harness.hosts import host_fixture
from tracker.errors import ConfigError
from tracker.host import Host
from tracker.losses import Kernel, LossTerm, loss


host = host_fixture("plugins.losses")


def _inputs(n: int, c: int, seed: int = 0, dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c)) * 3).astype(dtype)
    y = (rng.random((n, c)) < 0.05).astype(dtype)
    return x, y


def test_hook_tracker_register_losses_gives_both_terms() -> None:
    got: list[Any] = []
    plugin.tracker_register_losses(register=got.append)
    assert [t.name for t in got] == ["class_weighted_bce", "sigmoid_focal"]
    assert all(isinstance(t, LossTerm) for t in got)
    for term in got:
        term.validate()


def test_hook_tracker_register_kernels_gives_numpy_and_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    got: list[Kernel] = []
    plugin.tracker_register_kernels(register=got.append)
    assert sorted(k.name for k in got) == [
        "class_weighted_bce/numpy",
        "class_weighted_bce/torch",
        "sigmoid_focal/numpy",
        "sigmoid_focal/torch",
    ]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    without: list[Kernel] = []
    plugin.tracker_register_kernels(register=without.append)
    assert sorted(k.name for k in without) == ["class_weighted_bce/numpy", "sigmoid_focal/numpy"]


def test_host_records_the_plugin_as_owner(host: Host) -> None:
    owners = host.registry("kernels").owners
    assert owners["class_weighted_bce/numpy"] == "losses"
    assert host.registry("losses").owners["sigmoid_focal"] == "losses"


def test_bce_is_the_stable_formula_with_class_weights(host: Host) -> None:
    x, y = _inputs(50, 6, dtype=np.float64)
    counts = [5, 50, 500, 0, 7, 1]
    w = plugin.resolve_weight(
        {**{p.name: p.default for p in plugin.WEIGHT_PARAMS}, "scheme": "inverse", "counts": counts}, 6
    )
    grad = np.zeros_like(x)
    result = loss("class_weighted_bce", backend="numpy", scheme="inverse", counts=counts, reduction="sum")(x, y, grad)
    elementwise = w.astype(np.float64) * (np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x))))
    assert result.loss == pytest.approx(elementwise.sum(), rel=1e-12)
    np.testing.assert_allclose(result.per_class, elementwise.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(grad, w * (1 / (1 + np.exp(-x)) - y), rtol=1e-10, atol=1e-14)
    assert np.isfinite(w).all() and w[3] == w.max()  # zero count: the rarest class's weight


def test_bce_pos_weight_scales_the_positive_part(host: Host) -> None:
    x, y = _inputs(40, 3, dtype=np.float64)
    pw = np.array([1.0, 3.0, 0.5])
    result = loss("class_weighted_bce", backend="numpy", pos_weight=pw.tolist(), reduction="none")(x, y)
    softplus = lambda z: np.log1p(np.exp(-np.abs(z))) + np.maximum(z, 0)  # noqa: E731
    expected = pw * y * softplus(-x) + (1 - y) * softplus(x)
    np.testing.assert_allclose(result.loss, expected.astype(np.float32), rtol=1e-6)


def test_focal_with_gamma_zero_and_no_alpha_is_bce(host: Host) -> None:
    x, y = _inputs(30, 4)
    focal = loss("sigmoid_focal", backend="numpy", gamma=0.0, alpha=-1.0)(x, y)
    bce = loss("class_weighted_bce", backend="numpy")(x, y)
    assert focal.loss == pytest.approx(bce.loss, rel=1e-6)


def test_numpy_kernel_results_do_not_depend_on_the_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = _inputs(4001, 80, seed=3)  # many chunks, a short last one, and enough work for threads
    w = np.linspace(0.5, 2.0, 80, dtype=np.float32)
    runs = []
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("TRACKER_NUM_THREADS", threads)
        grad = np.zeros_like(x)
        result = plugin.bce_numpy(x, y, grad, weight=w, pos_weight=None, reduction="mean")
        runs.append((result.loss, result.per_class, grad))
    for other in runs[1:]:
        assert other[0] == runs[0][0]
        np.testing.assert_array_equal(other[1], runs[0][1])
        np.testing.assert_array_equal(other[2], runs[0][2])
    reference = plugin.bce_reference(x, y, None, weight=w, pos_weight=None, reduction="mean")
    assert runs[0][0] == pytest.approx(reference.loss, rel=1e-6)


def test_bad_thread_count_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_NUM_THREADS", "many")
    with pytest.raises(ConfigError, match="TRACKER_NUM_THREADS is 'many'; expected a positive integer"):
        plugin.num_threads()


@pytest.mark.parametrize(
    ("kernel", "kwargs", "reduction", "dtype"),
    [
        (plugin.bce_numpy, {"pos_weight": None}, "mean", np.float32),
        (plugin.bce_numpy, {"pos_weight": np.full(80, 2.0, np.float32)}, "none", np.float32),
        (plugin.focal_numpy, {"alpha": 0.25, "gamma": 1.5}, "sum", np.float32),
        (plugin.focal_numpy, {"alpha": 0.25, "gamma": 2.0}, "mean", np.float16),
        (plugin.bce_numpy, {"pos_weight": None}, "mean", ml_dtypes.bfloat16),
    ],
)
def test_peak_extra_memory_is_at_most_three_times_the_logits(kernel, kwargs, reduction, dtype) -> None:
    x, y = _inputs(20000, 80, dtype=dtype)
    grad = np.zeros(x.shape, dtype=np.float32)
    w = np.ones(80, dtype=np.float32)
    kernel(x, y, grad, weight=w, reduction=reduction, **kwargs)  # warm the thread pool
    tracemalloc.start()
    try:
        result = kernel(x, y, grad, weight=w, reduction=reduction, **kwargs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 3 * x.nbytes, f"peak {peak} bytes > 3 x {x.nbytes}"
    assert np.isfinite(result.per_class).all()


def test_focal_kernels_refuse_negative_gamma() -> None:
    x, y = _inputs(2, 3)
    with pytest.raises(ConfigError, match="gamma is -1.0; expected a number >= 0"):
        plugin.focal_numpy(x, y, None, weight=np.ones(3, np.float32), alpha=0.25, gamma=-1.0, reduction="sum")


def test_kernels_refuse_unknown_reduction_and_parameters() -> None:
    x, y = _inputs(2, 3)
    with pytest.raises(ConfigError, match="reduction 'avg' is not one of mean, sum, none"):
        plugin.bce_numpy(x, y, None, weight=np.ones(3, np.float32), pos_weight=None, reduction="avg")
    with pytest.raises(TypeError):
        plugin.bce_numpy(x, y, None, weight=np.ones(3, np.float32), pos_weight=None, reduction="sum", beta=0.9)


def test_examples_cover_every_weight_path() -> None:
    schemes = {e.get("scheme", "none") for t in plugin.TERMS for e in t.examples(5)}
    assert {"none", "inverse", "inverse_sqrt", "effective_number", "power"} <= schemes
    for term in plugin.TERMS:
        for example in term.examples(5):
            resolved = term.resolved(term.check_params(example), 5)
            assert resolved["weight"].shape == (5,) and np.isfinite(resolved["weight"]).all()


def test_numpy_kernel_works_in_a_forked_child() -> None:
    import multiprocessing

    x, y = _inputs(4000, 80)
    w = np.ones(80, dtype=np.float32)
    parent = plugin.bce_numpy(x, y, None, weight=w, pos_weight=None, reduction="sum").loss  # starts the pool
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        child = pool.apply_async(plugin.bce_numpy, (x, y, None), {"weight": w, "pos_weight": None, "reduction": "sum"})
        assert child.get(timeout=60).loss == parent


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=700),
    c=st.integers(min_value=1, max_value=90),
    reduction=st.sampled_from(["mean", "sum", "none"]),
    focal=st.booleans(),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_numpy_kernels_agree_with_the_reference_on_any_shape(
    n: int, c: int, reduction: str, focal: bool, seed: int
) -> None:
    x, y = _inputs(n, c, seed=seed)
    w = np.random.default_rng(seed).uniform(0.1, 3.0, c).astype(np.float32)
    if focal:
        kwargs: dict[str, Any] = {"weight": w, "alpha": 0.25, "gamma": 1.5, "reduction": reduction}
        kernel, reference = plugin.focal_numpy, plugin.focal_reference
    else:
        kwargs = {"weight": w, "pos_weight": np.full(c, 1.7, np.float32), "reduction": reduction}
        kernel, reference = plugin.bce_numpy, plugin.bce_reference
    grad, ref_grad = np.zeros((n, c), np.float32), np.zeros((n, c))
    got, want = kernel(x, y, grad, **kwargs), reference(x, y, ref_grad, **kwargs)
    np.testing.assert_allclose(
        got.loss, want.loss, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(want.loss).max(initial=0)))
    )
    np.testing.assert_allclose(got.per_class, want.per_class, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(got.positives, want.positives)
    np.testing.assert_allclose(
        grad, ref_grad, rtol=1e-4, atol=1e-6 * max(1e-30, float(np.abs(ref_grad).max(initial=0)))
    )
