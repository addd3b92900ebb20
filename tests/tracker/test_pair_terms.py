"""Pair terms (embeddings, student/teacher logits): the contract, the conformance checks catching
broken kernels, the tracker.loss() call, and the torch modules of the SSL losses."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tracker
from plugins.ssl_losses import TERMS, negative_cosine_reference, nt_xent_reference
from tracker.errors import ConfigError, PluginError
from tracker.losses import Kernel, LossTerm, Param
from tracker.testing import check_kernel, check_loss_term
from tracker.torch_ssl import BarlowTwinsLoss, DINOLoss, NegativeCosineLoss, NTXentLoss, VICRegLoss

NT_XENT = next(t for t in TERMS if t.name == "nt_xent")
COSINE = next(t for t in TERMS if t.name == "negative_cosine")


def _failures(term: LossTerm, fn: Any) -> dict[str, str]:
    report = check_kernel(term, Kernel(term.name, "broken", fn, ("float32", "float64")), raise_on_failure=False)
    return {r.check: r.message for r in report.failures}


def test_a_kernel_that_assigns_the_gradient_is_caught() -> None:
    def assigns(a: Any, b: Any, grad: Any, **kw: Any) -> Any:
        fresh = None if grad is None else tuple(None if g is None else np.zeros_like(g) for g in grad)
        result = nt_xent_reference(a, b, fresh, **kw)
        if grad is not None:
            for g, f in zip(grad, fresh):
                if g is not None:
                    g[...] = f
        return result

    failures = _failures(NT_XENT, assigns)
    assert set(failures) == {"accumulation"}
    assert "OVERWROTE" in failures["accumulation"] and "grad[0]" in failures["accumulation"]


def test_a_wrong_gradient_and_a_leaking_stop_gradient_are_caught() -> None:
    def doubled(a: Any, b: Any, grad: Any, **kw: Any) -> Any:
        if grad is not None and grad[0] is not None:
            nt_xent_reference(a, b, (grad[0], None), **kw)
        return nt_xent_reference(a, b, grad, **kw)

    assert {"gradient", "agreement"} <= set(_failures(NT_XENT, doubled))

    def leaks(a: Any, b: Any, grad: Any, *, stop_gradient: str, reduction: str) -> Any:
        return negative_cosine_reference(a, b, grad, stop_gradient="none", reduction=reduction)

    failures = _failures(COSINE, leaks)
    assert "stop-gradient: untouched" in failures["gradient"]

    def leaks_one_row(a: Any, b: Any, grad: Any, **kw: Any) -> Any:
        result = negative_cosine_reference(a, b, grad, **kw)
        if grad is not None and grad[1] is not None and kw["stop_gradient"] == "target" and len(b) > 2:
            grad[1][2, 1] += 1e-3  # one element of the constant's gradient written
        return result

    assert "grad_b (stop-gradient: untouched)[2, 1]" in _failures(COSINE, leaks_one_row)["gradient"]


def test_components_that_do_not_add_up_and_a_loss_on_empty_input_are_caught() -> None:
    def halves(a: Any, b: Any, grad: Any, **kw: Any) -> Any:
        result = nt_xent_reference(a, b, grad, **kw)
        result.per_class = result.per_class / 2
        if a.shape[0] == 0:
            result.loss = 1.0
        return result

    term = LossTerm("halves", halves, NT_XENT.params, inputs="views", components=("alignment", "uniformity"),
                    examples=NT_XENT.examples)
    failed = {r.check for r in check_loss_term(term, raise_on_failure=False).failures}
    assert {"result", "empty"} <= failed


def test_pair_term_declarations_are_validated() -> None:
    with pytest.raises(PluginError, match="names its loss components"):
        LossTerm("x", nt_xent_reference, inputs="views").validate()
    with pytest.raises(PluginError, match="must include 'mean' and 'sum'"):
        LossTerm("x", nt_xent_reference, inputs="views", components=("c",), reductions=("mean",)).validate()
    with pytest.raises(PluginError, match="inputs 'pixels' is not one of logits, views, student_teacher"):
        LossTerm("x", nt_xent_reference, inputs="pixels", components=("c",)).validate()
    with pytest.raises(ConfigError, match="expected one of mean, sum"):
        tracker.loss("vicreg", reduction="none")


def test_tracker_loss_flattens_pairs_and_adds_into_gradient_pairs() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(2, 6, 8)).astype(np.float32)
    b = a + 0.3 * rng.normal(size=a.shape).astype(np.float32)
    ga, gb = np.ones_like(a), np.zeros_like(b)
    r = tracker.loss("nt_xent", temperature=0.2)(a, b, grad=(ga, gb))
    flat = nt_xent_reference(a.reshape(12, 8).astype(np.float64), b.reshape(12, 8).astype(np.float64), None,
                             temperature=0.2, reduction="mean")
    assert r.loss == pytest.approx(flat.loss, rel=1e-5) and r.per_class.shape == (2,)
    assert np.abs(ga - 1).max() > 0 and np.abs(gb).max() > 0  # added into the prefilled ga
    per_sample = tracker.loss("negative_cosine", reduction="none")(torch.from_numpy(a), b)
    assert per_sample.loss.shape == (2, 6)
    with pytest.raises(ConfigError, match="grad of a pair term is a pair"):
        tracker.loss("nt_xent")(a, b, grad=ga)
    with pytest.raises(ConfigError, match="second input shape"):
        tracker.loss("nt_xent")(a, b[:, :3])
    with pytest.raises(ConfigError, match="center has 3 entries; expected 8"):
        tracker.loss("dino", center=[0.0, 1.0, 2.0])(a, b)


def _inputs(n: int = 32, d: int = 16, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    z1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    return z1.to(dtype).requires_grad_(True), (z1 + 0.4 * torch.randn(n, d, generator=g, dtype=torch.float64)).to(
        dtype
    ).requires_grad_(True)


@pytest.mark.parametrize(
    "module, term, params",
    [
        (NTXentLoss(0.3), "nt_xent", {"temperature": 0.3}),
        (NegativeCosineLoss(), "negative_cosine", {}),
        (VICRegLoss(lambd=10.0), "vicreg", {"lambd": 10.0}),
        (BarlowTwinsLoss(), "barlow_twins", {}),
    ],
)
def test_torch_modules_equal_the_references_and_train_in_bfloat16(module: Any, term: str, params: dict) -> None:
    z1, z2 = _inputs()
    loss = module(z1, z2)
    ref = tracker.loss(term, backend="reference", **params)(z1.detach().numpy(), z2.detach().numpy())
    assert loss.item() == pytest.approx(ref.loss, rel=1e-5)
    assert module.last_components.sum().item() == pytest.approx(ref.loss, rel=1e-5)
    loss.backward()
    assert z1.grad is not None and torch.isfinite(z1.grad).all()
    assert (z2.grad is None) == (term == "negative_cosine")  # the target is detached
    b1, b2 = _inputs(dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = module(b1, b2)
    assert low.dtype == torch.float32 and abs(low.item() - ref.loss) < 0.05 * max(1.0, abs(ref.loss))
    low.backward()
    assert b1.grad is not None and b1.grad.dtype == torch.bfloat16


def test_dino_keeps_its_centre_and_detaches_the_teacher() -> None:
    student, teacher = _inputs(d=10)
    dino = DINOLoss(10, center_momentum=0.5)
    loss = dino(student, teacher)
    ref = tracker.loss("dino", backend="reference")(student.detach().numpy(), teacher.detach().numpy())
    assert loss.item() == pytest.approx(ref.loss, rel=1e-5)
    assert torch.allclose(dino.center, 0.5 * teacher.detach().float().mean(dim=0))
    loss.backward()
    assert teacher.grad is None and student.grad is not None
    second = dino(student, teacher)
    centred = tracker.loss("dino", backend="reference", center=(0.5 * teacher.detach().mean(dim=0)).numpy())
    assert second.item() == pytest.approx(centred(student.detach().numpy(), teacher.detach().numpy()).loss, rel=1e-5)


def test_the_ssl_terms_are_listed_with_their_inputs() -> None:
    terms = tracker.losses()
    assert {"nt_xent", "negative_cosine", "vicreg", "barlow_twins", "dino"} <= set(terms)
    assert terms["dino"].inputs == "student_teacher" and terms["vicreg"].components == (
        "invariance", "variance", "covariance")
    assert isinstance(terms["nt_xent"].schema()["temperature"], Param)


def test_a_pair_term_cannot_stand_in_for_a_detectors_classification_loss() -> None:
    from tracker.integrations.ultralytics_loss import check_loss

    with pytest.raises(ConfigError, match="'nt_xent' takes views .* needs a logits term such as class_weighted_bce"):
        check_loss("nt_xent", {})


def test_a_zero_tolerance_comparison_fails_on_any_difference() -> None:
    from tracker.testing.conformance import _Failure, _worst

    with pytest.raises(_Failure, match=r"positives\[0\] = 1"):
        _worst("positives", np.array([1, 0]), np.array([0, 0]), 0.0, 0.0)  # one exact match must not hide it
    _worst("positives", np.array([2, 0]), np.array([2, 0]), 0.0, 0.0)
