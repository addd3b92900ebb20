"""The loss registry API: tracker.losses(), tracker.loss(), input checks, dtypes, backend choice."""

from __future__ import annotations

import sys
from typing import Any, Iterator

import ml_dtypes
import numpy as np
import pytest
import torch

import tracker
from tracker import hookimpl
from tracker.errors import ConfigError, PluginError
from tracker.host import Host, make_plugin_manager, set_host
from tracker.losses import (
    BACKEND_PREFERENCE,
    Kernel,
    LossResult,
    LossTerm,
    Param,
    auto_kernel,
    get_kernel,
    kernels,
    loss,
    losses,
    reduce_elementwise,
)


def squared_reference(
    logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, *, scale: float, reduction: str
) -> LossResult:
    """A tiny third-party term: scale * (x - y)**2."""
    x, y = logits.astype(np.float64), targets.astype(np.float64)
    return reduce_elementwise(scale * (x - y) ** 2, 2 * scale * (x - y), y, grad, reduction)


SQUARED = LossTerm(
    name="squared",
    reference=squared_reference,
    params=(Param("scale", "float", 1.0, minimum=0.0),),
    description="scale * (x - y)**2",
)


class Recorder:
    """Kernel function that records the dtypes it was given, then defers to the reference."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **kw: Any) -> LossResult:
        self.seen.append((logits.dtype.name, targets.dtype.name))
        return squared_reference(logits, targets, grad, **kw)


class TinyPlugin:
    """A third-party plugin with one term and kernels on several backends."""

    def __init__(self, unavailable: set[str]) -> None:
        self.recorders = {b: Recorder() for b in ("numpy", "torch", "vulkan", "zzz")}
        self.unavailable = unavailable

    @hookimpl
    def tracker_register_losses(self, register: Any) -> None:
        register(SQUARED)

    @hookimpl
    def tracker_register_kernels(self, register: Any) -> None:
        for backend, recorder in self.recorders.items():
            reason = "no device here" if backend in self.unavailable else None
            register(Kernel("squared", backend, recorder, ("float32",), lambda reason=reason: reason))


def _host(*plugins: tuple[object, str], defaults: tuple[str, ...] = ("plugins.losses",)) -> Host:
    pm = make_plugin_manager(default_plugins=defaults, entry_points=False)
    for plugin, name in plugins:
        pm.register(plugin, name=name)
    return Host(pm)


@pytest.fixture
def host() -> Iterator[Host]:
    fresh = _host()
    old = set_host(fresh)
    yield fresh
    set_host(old)


def _inputs(shape: tuple[int, ...] = (6, 5), seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 2, shape).astype(np.float32)
    y = (rng.random(shape) < 0.3).astype(np.float32)
    return x, y


def test_losses_lists_the_built_in_terms(host: Host) -> None:
    terms = tracker.losses()
    assert list(terms) == ["class_weighted_bce", "sigmoid_focal"]
    assert all(isinstance(t, LossTerm) for t in terms.values())
    assert losses() == terms


def test_unknown_loss_names_the_available_ones(host: Host) -> None:
    with pytest.raises(ConfigError) as info:
        tracker.loss("bce2")
    assert str(info.value) == "Unknown loss 'bce2'; available: class_weighted_bce, sigmoid_focal"


def test_unknown_and_bad_parameters(host: Host) -> None:
    with pytest.raises(ConfigError, match="Unknown parameter 'gama' for loss 'sigmoid_focal'; available: alpha"):
        loss("sigmoid_focal", gama=2.0)
    with pytest.raises(ConfigError, match=r"parameter 'gamma' is -1.0; expected a number in \[0.0, 100.0\]"):
        loss("sigmoid_focal", gamma=-1)
    with pytest.raises(ConfigError, match="parameter 'reduction' is 'avg'; expected one of mean, sum, none"):
        loss("class_weighted_bce", reduction="avg")
    with pytest.raises(ConfigError, match="parameter 'alpha' is 'x'; expected a number"):
        loss("sigmoid_focal", alpha="x")
    with pytest.raises(ConfigError, match=r"parameter 'counts'\[1\] is -3.0; expected values in"):
        loss("class_weighted_bce", scheme="inverse", counts=[1, -3])


def test_counts_and_pos_weight_must_match_the_class_axis(host: Host) -> None:
    x, y = _inputs((4, 5))
    with pytest.raises(ConfigError, match="counts has 3 entries; expected 5"):
        loss("class_weighted_bce", scheme="inverse", counts=[1, 2, 3])(x, y)
    with pytest.raises(ConfigError, match="pos_weight has 2 entries; expected 5"):
        loss("class_weighted_bce", pos_weight=[1.0, 2.0])(x, y)


def test_call_adds_into_grad_and_matches_the_reference(host: Host) -> None:
    x, y = _inputs((3, 7, 5))
    params = {"scheme": "effective_number", "counts": [10, 0, 3, 900, 5], "beta": 0.99, "pos_weight": 2.0}
    grad = np.full(x.shape, 0.5, dtype=np.float32)
    first = loss("class_weighted_bce", backend="numpy", **params)(x, y, grad)
    ref_grad = np.zeros(x.shape)
    want = loss("class_weighted_bce", backend="reference", **params)(x, y, ref_grad)
    np.testing.assert_allclose(grad - 0.5, ref_grad, rtol=1e-5, atol=2e-7)
    assert first.loss == pytest.approx(want.loss, rel=1e-6)
    np.testing.assert_allclose(first.per_class, want.per_class, rtol=1e-5)
    np.testing.assert_array_equal(first.positives, np.count_nonzero(y.reshape(-1, 5) > 0, axis=0))
    loss("class_weighted_bce", backend="numpy", **params)(x, y, grad)
    np.testing.assert_allclose(grad - 0.5, 2 * ref_grad, rtol=1e-5, atol=2e-7)


def test_reduction_none_keeps_the_leading_shape(host: Host) -> None:
    x, y = _inputs((2, 3, 4, 5))
    result = loss("sigmoid_focal", reduction="none")(x, y)
    assert result.loss.shape == x.shape and result.loss.dtype == np.float32
    assert result.per_class.shape == (5,) and result.per_class.dtype == np.float64
    np.testing.assert_allclose(result.loss.reshape(-1, 5).sum(axis=0), result.per_class, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_half_precision_inputs_agree_with_float64_on_the_same_values(host: Host, dtype: Any) -> None:
    x, y = _inputs((40, 5))
    xd, yd = x.astype(dtype), y.astype(dtype)
    grad = np.zeros(x.shape, dtype=np.float32)
    got = loss("sigmoid_focal", backend="numpy", gamma=1.5)(xd, yd, grad)
    ref_grad = np.zeros(x.shape)
    want = loss("sigmoid_focal", backend="reference", gamma=1.5)(xd.astype(np.float64), yd.astype(np.float64), ref_grad)
    assert got.loss == pytest.approx(want.loss, rel=1e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-7)


def test_torch_tensors_are_accepted_and_grad_tensor_is_written_in_place(host: Host) -> None:
    x, y = _inputs((8, 5))
    xt = torch.from_numpy(x).to(torch.bfloat16).requires_grad_(True)
    grad = torch.zeros(8, 5)
    result = loss("class_weighted_bce")(xt, torch.from_numpy(y), grad)
    ref_grad = np.zeros((8, 5))
    x_bf16 = xt.detach().float().numpy()
    want = loss("class_weighted_bce", backend="reference")(x_bf16, y, ref_grad)
    assert result.loss == pytest.approx(want.loss, rel=1e-5)
    np.testing.assert_allclose(grad.numpy(), ref_grad, rtol=1e-4, atol=1e-8)


def test_lists_and_bool_targets_are_accepted(host: Host) -> None:
    result = loss("class_weighted_bce", reduction="sum")([[0.0, 2.0]], np.array([[True, False]]))
    expected = np.log1p(np.exp(-0.0)) + np.log1p(np.exp(2.0))
    assert result.loss == pytest.approx(expected, rel=1e-6)
    np.testing.assert_array_equal(result.positives, [1, 0])


@pytest.mark.parametrize(
    ("logits", "targets", "grad", "message"),
    [
        (
            np.zeros((4, 5), np.int64),
            np.zeros((4, 5)),
            None,
            "logits dtype int64 is not supported; expected one of float16",
        ),
        (
            np.zeros((4, 5), np.float32),
            np.zeros((4, 6)),
            None,
            r"targets shape \(4, 6\) does not match logits; expected \(4, 5\)",
        ),
        (np.zeros((4, 5), np.float32), np.array([["a"] * 5] * 4), None, "targets dtype <U1 is not numeric"),
        (
            np.zeros((4, 5), np.float32),
            np.zeros((4, 5)),
            np.zeros((4, 5), np.float16),
            "grad dtype float16 is not supported",
        ),
        (
            np.zeros((4, 5), np.float32),
            np.zeros((4, 5)),
            np.zeros((5, 4), np.float32),
            r"grad shape \(5, 4\) does not match logits",
        ),
        (np.zeros((4, 5), np.float32), np.zeros((4, 5)), np.zeros((5, 4), np.float32).T, "writeable C-contiguous"),
        (
            np.zeros((4, 5), np.float32),
            np.zeros((4, 5)),
            [[0.0] * 5] * 4,
            "grad is a list; expected a numpy float32/float64",
        ),
        (np.float32(1.0), np.float32(1.0), None, r"logits shape \(\) has no class axis"),
    ],
)
def test_bad_inputs_name_the_argument_and_the_expected_value(host: Host, logits, targets, grad, message) -> None:
    with pytest.raises(ConfigError, match=message):
        loss("class_weighted_bce")(logits, targets, grad)


def test_read_only_grad_is_refused(host: Host) -> None:
    grad = np.zeros((4, 5), np.float32)
    grad.flags.writeable = False
    with pytest.raises(ConfigError, match="writeable"):
        loss("class_weighted_bce")(np.zeros((4, 5), np.float32), np.zeros((4, 5)), grad)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_empty_batch(host: Host, reduction: str) -> None:
    grad = np.zeros((0, 3, 5), np.float32)
    result = loss("sigmoid_focal", reduction=reduction)(np.zeros((0, 3, 5), np.float16), np.zeros((0, 3, 5)), grad)
    if reduction == "none":
        assert result.loss.shape == (0, 3, 5)
    else:
        assert result.loss == 0.0
    np.testing.assert_array_equal(result.per_class, np.zeros(5))
    np.testing.assert_array_equal(result.positives, np.zeros(5))


def test_auto_prefers_backends_in_the_documented_order() -> None:
    assert BACKEND_PREFERENCE == ("vulkan", "numpy", "torch")
    plugin = TinyPlugin(unavailable=set())
    old = set_host(_host((plugin, "tiny"), defaults=()))
    try:
        assert list(kernels("squared")) == ["vulkan", "numpy", "torch", "zzz"]
        assert auto_kernel("squared").backend == "vulkan"
        x, y = _inputs()
        loss("squared")(x, y)
        assert plugin.recorders["vulkan"].seen and not plugin.recorders["numpy"].seen
    finally:
        set_host(old)


def test_auto_skips_unavailable_kernels_and_falls_back_to_the_reference() -> None:
    old = set_host(_host((TinyPlugin(unavailable={"vulkan"}), "tiny"), defaults=()))
    try:
        assert auto_kernel("squared").backend == "numpy"
        with pytest.raises(
            PluginError, match="Backend 'vulkan' for loss 'squared' is unavailable here: no device here"
        ):
            loss("squared", backend="vulkan")
        with pytest.raises(
            ConfigError, match="Unknown backend 'cuda' for loss 'squared'; available: vulkan, numpy, torch, zzz"
        ):
            get_kernel("squared", "cuda")
    finally:
        set_host(old)
    old = set_host(_host((TinyPlugin(unavailable={"vulkan", "numpy", "torch", "zzz"}), "tiny"), defaults=()))
    try:
        assert auto_kernel("squared").backend == "reference"
        x, y = _inputs()
        result = loss("squared", scale=2.0, reduction="sum")(x, y)
        assert result.loss == pytest.approx(2.0 * float(((x.astype(np.float64) - y) ** 2).sum()))
    finally:
        set_host(old)


def test_inputs_are_converted_to_float32_for_a_kernel_that_lists_only_float32() -> None:
    plugin = TinyPlugin(unavailable=set())
    old = set_host(_host((plugin, "tiny"), defaults=()))
    try:
        x, y = _inputs()
        call = loss("squared", backend="numpy")
        call(x.astype(np.float16), y.astype(np.float64))
        call(x.astype(ml_dtypes.bfloat16), y.astype(bool))
        call(x.astype(np.float64), y.astype(np.float16))
        assert plugin.recorders["numpy"].seen == [("float32", "float32")] * 3
    finally:
        set_host(old)


def test_term_call_shortcut(host: Host) -> None:
    x, y = _inputs()
    term = tracker.losses()["sigmoid_focal"]
    direct = term(x, y, backend="numpy", gamma=1.0, alpha=-1.0)
    bound = loss("sigmoid_focal", backend="numpy", gamma=1.0, alpha=-1.0)(x, y)
    assert direct.loss == bound.loss


def _register_and_get_failure(item: Any, kind: str = "losses") -> str:
    class Bad:
        @hookimpl
        def tracker_register_losses(self, register: Any) -> None:
            if kind == "losses":
                register(item)

        @hookimpl
        def tracker_register_kernels(self, register: Any) -> None:
            if kind == "kernels":
                register(item)

    host = _host((Bad(), "bad"), defaults=())
    host.items(kind)
    return host.failures["bad"]


@pytest.mark.parametrize(
    ("term", "message"),
    [
        (LossTerm("t", squared_reference, (Param("a", "float"), Param("a", "float"))), "must be unique"),
        (LossTerm("t", squared_reference, (Param("reduction", "str"),)), "must not include 'reduction'"),
        (LossTerm("t", squared_reference, (Param("a", "complex"),)), "parameter 'a' has kind 'complex'"),
        (LossTerm("t", squared_reference, (Param("a", "float", default="x"),)), "default of 'a' is 'x'"),
        (LossTerm("t", "not callable"), "reference, resolve and examples must be callable"),  # type: ignore[arg-type]
    ],
)
def test_malformed_terms_are_refused_at_registration(term: LossTerm, message: str) -> None:
    assert message in _register_and_get_failure(term)


@pytest.mark.parametrize(
    ("kernel", "message"),
    [
        (Kernel("t", "numpy", squared_reference, ("float16",)), "must include 'float32'"),
        (Kernel("t", "numpy", squared_reference, ("float32", "int8")), "must include 'float32' and use only"),
        (Kernel("t", "reference", squared_reference), "backend name 'reference' is reserved"),
        (Kernel("t", "numpy", 42), "fn 42 is not callable"),  # type: ignore[arg-type]
    ],
)
def test_malformed_kernels_are_refused_at_registration(kernel: Kernel, message: str) -> None:
    assert message in _register_and_get_failure(kernel, "kernels")


def test_duplicate_kernel_names_both_plugins() -> None:
    class Twin:
        @hookimpl
        def tracker_register_kernels(self, register: Any) -> None:
            register(Kernel("class_weighted_bce", "numpy", squared_reference))

    host = _host((Twin(), "twin"))
    assert "class_weighted_bce/numpy" in host.items("kernels")
    assert "registered by plugin 'losses' and again by plugin 'twin'" in host.failures["twin"]


def test_kernel_availability_check_that_raises_counts_as_a_reason() -> None:
    def boom() -> str | None:
        raise RuntimeError("driver crashed")

    kernel = Kernel("t", "vulkan", squared_reference, available=boom)
    assert kernel.unavailable() == "availability check raised RuntimeError: driver crashed"
    assert kernel.name == "t/vulkan"


def test_torch_bfloat16_without_ml_dtypes_goes_through_float32(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = _inputs((8, 5))
    xt = torch.from_numpy(x).to(torch.bfloat16)
    with_ml_dtypes = loss("sigmoid_focal", backend="numpy")(xt, y)
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    without = loss("sigmoid_focal", backend="numpy")(xt, y)
    assert without.loss == with_ml_dtypes.loss
