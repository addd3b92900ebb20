"""The PyTorch bridge (tracker.torch), and every backend against real peers (torch BCE, torchvision focal loss)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.harness.hosts import host_fixture
from tracker.errors import ConfigError
from tracker.host import Host
from tracker.losses import loss
from tracker.torch import ClassWeightedBCEWithLogits, SigmoidFocalLoss

try:  # torchvision is the peer when it imports; its formula, transcribed, otherwise
    from torchvision.ops import sigmoid_focal_loss as torchvision_focal
except Exception:  # torchvision does not import beside this torch build
    torchvision_focal = None


def focal_peer(inputs: torch.Tensor, targets: torch.Tensor, alpha: float, gamma: float, reduction: str) -> torch.Tensor:
    """``torchvision.ops.sigmoid_focal_loss`` (the library, or its formula line for line)."""
    if torchvision_focal is not None:
        return torchvision_focal(inputs, targets, alpha=alpha, gamma=gamma, reduction=reduction)
    p = torch.sigmoid(inputs)
    ce_loss = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    out = ce_loss * ((1 - p_t) ** gamma)
    if alpha >= 0:
        alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
        out = alpha_t * out
    return out.mean() if reduction == "mean" else out.sum() if reduction == "sum" else out


host = host_fixture("plugins.losses")


def _data(
    n: int = 24, c: int = 7, dtype: torch.dtype = torch.float32, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, generator=gen, dtype=torch.float64) * 3
    y = (torch.rand(n, c, generator=gen, dtype=torch.float64) < 0.3).to(torch.float64)
    y[0, :3] = torch.tensor([0.25, 0.5, 0.9], dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


def _value_and_grad(fn: Any, x: torch.Tensor, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.detach().clone().requires_grad_(True)
    out = fn(leaf, *args)
    (out if out.ndim == 0 else out.sum()).backward()
    return out.detach(), leaf.grad


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_unweighted_module_equals_bce_with_logits_loss(reduction: str) -> None:
    x, y = _data(64, 80)
    ours, g_ours = _value_and_grad(ClassWeightedBCEWithLogits(reduction=reduction), x, y)
    peer, g_peer = _value_and_grad(torch.nn.BCEWithLogitsLoss(reduction=reduction), x, y)
    assert ours.dtype == torch.float32
    # elementwise, float32 rounding is relative to the logits' size (|x| up to ~12 here)
    torch.testing.assert_close(ours, peer, rtol=2e-6, atol=1e-6 if reduction == "none" else 1e-7)
    torch.testing.assert_close(g_ours, g_peer, rtol=2e-6, atol=1e-9)


def test_weighted_module_equals_functional_bce_with_weight_and_pos_weight() -> None:
    x, y = _data(30, 5)
    counts = [100.0, 5.0, 0.0, 40.0, 7.0]
    module = ClassWeightedBCEWithLogits("inverse", counts, pos_weight=[1.0, 2.0, 3.0, 0.5, 1.5])
    ours, g_ours = _value_and_grad(module, x, y)
    peer, g_peer = _value_and_grad(
        lambda a, b: F.binary_cross_entropy_with_logits(a, b, weight=module.weight, pos_weight=module.pos_weight), x, y
    )
    torch.testing.assert_close(ours, peer, rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(g_ours, g_peer, rtol=2e-6, atol=1e-9)


def _rel(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("backend", ["reference", "numpy", "torch"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_bce_backends_agree_with_torch_in_float64(host: Host, backend: str, reduction: str) -> None:
    x, y = _data(40, 6, torch.float64)
    counts = [10.0, 200.0, 3.0, 0.0, 55.0, 1.0]
    pos_weight = [0.5, 1.0, 2.0, 4.0, 1.5, 3.0]
    call = loss(
        "class_weighted_bce",
        backend=backend,
        scheme="effective_number",
        counts=counts,
        beta=0.99,
        pos_weight=pos_weight,
        reduction=reduction,
    )
    weight = torch.from_numpy(call.resolved(6)["weight"].astype(np.float64))
    grad = np.zeros((40, 6))
    ours = call(x.numpy(), y.numpy(), grad)
    peer, g_peer = _value_and_grad(
        lambda a, b: F.binary_cross_entropy_with_logits(
            a, b, weight=weight, pos_weight=torch.tensor(pos_weight, dtype=torch.float64), reduction=reduction
        ),
        x,
        y,
    )
    assert _rel(ours.loss, peer) <= 1e-6
    assert _rel(grad, g_peer) <= 1e-6


@pytest.mark.parametrize("backend", ["reference", "numpy", "torch"])
@pytest.mark.parametrize(("alpha", "gamma"), [(0.25, 2.0), (-1.0, 0.0), (0.6, 0.5), (0.25, 1.5)])
def test_focal_backends_agree_with_torchvision_in_float64(host: Host, backend: str, alpha: float, gamma: float) -> None:
    x, y = _data(40, 6, torch.float64)
    grad = np.zeros((40, 6))
    ours = loss("sigmoid_focal", backend=backend, alpha=alpha, gamma=gamma, reduction="sum")(x.numpy(), y.numpy(), grad)
    peer, g_peer = _value_and_grad(lambda a, b: focal_peer(a, b, alpha, gamma, "sum"), x, y)
    assert _rel(ours.loss, peer) <= 1e-6
    assert _rel(grad, g_peer) <= 1e-6


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_focal_module_agrees_with_torchvision(reduction: str) -> None:
    x, y = _data(32, 9, torch.float64)
    ours, g_ours = _value_and_grad(SigmoidFocalLoss(alpha=0.3, gamma=1.5, reduction=reduction), x, y)
    peer, g_peer = _value_and_grad(lambda a, b: focal_peer(a, b, 0.3, 1.5, reduction), x, y)
    torch.testing.assert_close(ours, peer, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_ours, g_peer, rtol=1e-10, atol=1e-12)


def test_modules_pass_torch_gradcheck() -> None:
    x, y = _data(5, 4, torch.float64)
    x.requires_grad_(True)
    for module in (
        ClassWeightedBCEWithLogits("power", [3.0, 30.0, 300.0, 0.0], power=0.7, pos_weight=2.0),
        SigmoidFocalLoss(alpha=0.25, gamma=0.5, scheme="inverse_sqrt", counts=[3.0, 30.0, 300.0, 1.0]),
        SigmoidFocalLoss(gamma=0.0, reduction="none"),
    ):
        assert torch.autograd.gradcheck(lambda a, module=module: module(a, y), (x,))


def test_focal_gradient_stays_finite_where_float32_saturates() -> None:
    x = torch.tensor([[40.0, -40.0, 120.0, -120.0, 1e4, -1e4]], requires_grad=True)
    for y in (torch.ones(1, 6), torch.zeros(1, 6)):
        for gamma in (0.0, 0.5, 2.0):
            x.grad = None
            SigmoidFocalLoss(gamma=gamma, reduction="sum")(x, y).backward()
            assert torch.isfinite(x.grad).all(), (y, gamma, x.grad)


def test_autocast_bfloat16_runs_with_float32_accumulation() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 80)
    inputs = torch.randn(64, 16)
    targets = (torch.rand(64, 80) < 0.05).float()
    module = ClassWeightedBCEWithLogits()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = layer(inputs)
        value = module(logits, targets)
    assert logits.dtype == torch.bfloat16 and value.dtype == torch.float32
    value.backward()
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()
    expected = F.binary_cross_entropy_with_logits(logits.detach().float(), targets)
    torch.testing.assert_close(value.detach(), expected, rtol=2e-6, atol=1e-7)


def test_last_per_class_and_positives_give_the_breakdown() -> None:
    x, y = _data(20, 6)
    module = SigmoidFocalLoss(scheme="inverse", counts=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    value = module(x.reshape(4, 5, 6), y.reshape(4, 5, 6))
    assert module.last_per_class is not None and module.last_positives is not None
    assert module.last_per_class.shape == (6,) and module.last_per_class.dtype == torch.float64
    assert not module.last_per_class.requires_grad
    assert float(module.last_per_class.sum()) / x.numel() == pytest.approx(float(value), rel=1e-6)
    torch.testing.assert_close(module.last_positives, (y > 0).sum(dim=0))


def test_module_buffers_and_shape_errors() -> None:
    module = ClassWeightedBCEWithLogits("inverse", [1.0, 2.0, 3.0])
    assert set(dict(module.named_buffers())) == {"weight"}
    with pytest.raises(ConfigError, match="logits have 4 classes; the class weights have 3"):
        module(torch.zeros(2, 4), torch.zeros(2, 4))
    with pytest.raises(ConfigError, match=r"targets shape \(2, 3\) does not match logits; expected \(2, 4\)"):
        ClassWeightedBCEWithLogits()(torch.zeros(2, 4), torch.zeros(2, 3))


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: ClassWeightedBCEWithLogits(reduction="avg"), "reduction 'avg' is not one of mean, sum, none"),
        (lambda: ClassWeightedBCEWithLogits(pos_weight=-1.0), "pos_weight is -1.0; expected a number or a 1-D vector"),
        (lambda: SigmoidFocalLoss(gamma=-2.0), "gamma=-2.0"),
        (lambda: ClassWeightedBCEWithLogits("inverse"), "scheme 'inverse' needs class counts"),
    ],
)
def test_bad_module_arguments(factory: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        factory()


def test_no_gradient_is_kept_when_logits_do_not_require_it() -> None:
    x, y = _data(8, 3)
    value = SigmoidFocalLoss()(x, y)
    assert not value.requires_grad and value.grad_fn is None


def test_torch_kernel_accepts_half_and_bfloat16_numpy_arrays(host: Host) -> None:
    import ml_dtypes

    x, y = _data(50, 5)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        xd = x.numpy().astype(dtype)
        grad = np.zeros((50, 5), np.float32)
        ours = loss("class_weighted_bce", backend="torch")(xd, y.numpy(), grad)
        ref_grad = np.zeros((50, 5))
        want = loss("class_weighted_bce", backend="reference")(xd.astype(np.float64), y.numpy(), ref_grad)
        assert ours.loss == pytest.approx(want.loss, rel=1e-6)
        np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-9)
