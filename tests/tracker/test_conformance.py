"""The conformance checks fail broken kernels with precise messages and pass good third-party ones."""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import plugins.losses as builtin
from tests.harness.hosts import host_fixture
from tracker import hookimpl
from tracker.host import Host, make_plugin_manager, set_host
from tracker.losses import Kernel, LossResult, LossTerm, Param, reduce_elementwise
from tracker.testing import ConformanceError, check_all, check_kernel, check_loss_term

pytest_plugins = ["pytester"]

DTYPES = ("float16", "float32", "float64")


host = host_fixture("plugins.losses")


def overwrite_grad(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **kw: Any) -> LossResult:
    """The bug this suite exists to catch: the gradient is assigned, not added."""
    if grad is None:
        return builtin.bce_numpy(logits, targets, None, **kw)
    g = np.zeros_like(grad)
    result = builtin.bce_numpy(logits, targets, g, **kw)
    grad[...] = g
    return result


def _failed_checks(term: str, fn: Callable[..., LossResult], dtypes: tuple[str, ...] = DTYPES) -> tuple[set[str], str]:
    report = check_kernel(term, Kernel(term, "broken", fn, dtypes), raise_on_failure=False)
    return {r.check for r in report.failures}, "\n".join(r.message for r in report.failures)


def test_built_in_kernels_pass(host: Host) -> None:
    for term in ("class_weighted_bce", "sigmoid_focal"):
        assert check_kernel(term, "numpy").ok


def test_overwriting_kernel_fails_the_accumulation_check_only(host: Host) -> None:
    checks, message = _failed_checks("class_weighted_bce", overwrite_grad)
    assert checks == {"accumulation"}
    assert re.search(
        r"class_weighted_bce/broken: check 'accumulation' failed \(example 0 \{\}, prefilled grad, called twice\): "
        r"the kernel OVERWROTE the gradient instead of adding into it: .* A kernel must ADD dL/dlogits into `grad` "
        r"\(`grad \+= g`\), never assign it \(`grad\[\.\.\.\] = g`.*"
        r"\(worst element grad after one call - prefill\[\d+, \d+\] = -?[\d.e-]+, expected -?[\d.e-]+ \(\|error\| ",
        message,
    ), message
    with pytest.raises(ConformanceError, match="check 'accumulation' failed"):
        check_kernel("class_weighted_bce", Kernel("class_weighted_bce", "broken", overwrite_grad, DTYPES))


def test_kernel_that_zeroes_the_buffer_before_adding_fails_accumulation(host: Host) -> None:
    def zero_then_add(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **kw: Any) -> LossResult:
        if grad is not None:
            grad.fill(0.0)
        return builtin.focal_numpy(logits, targets, grad, **kw)

    checks, message = _failed_checks("sigmoid_focal", zero_then_add)
    assert checks == {"accumulation"}
    assert "sigmoid_focal/broken: check 'accumulation' failed" in message


def test_wrong_gradient_fails_finite_differences_and_agreement(host: Host) -> None:
    def sign_flipped(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **kw: Any) -> LossResult:
        if grad is None:
            return builtin.bce_numpy(logits, targets, None, **kw)
        g = np.zeros_like(grad)
        result = builtin.bce_numpy(logits, targets, g, **kw)
        grad -= g
        return result

    checks, message = _failed_checks("class_weighted_bce", sign_flipped)
    assert {"gradient", "agreement"} <= checks
    assert "class_weighted_bce/broken: check 'gradient' failed (example 0 {}, float64, central differences)" in message


def test_naive_formula_fails_the_extremes_check(host: Host) -> None:
    def naive(
        logits: np.ndarray,
        targets: np.ndarray,
        grad: np.ndarray | None,
        *,
        weight: Any,
        pos_weight: Any,
        reduction: str,
    ) -> LossResult:
        x, y = logits.astype(np.float32), targets.astype(np.float32)
        with np.errstate(all="ignore"):
            elementwise = weight * (np.log(1 + np.exp(x)) - x * y)
            gradient = weight * (1 / (1 + np.exp(-x)) - y)
        return reduce_elementwise(elementwise.astype(np.float64), gradient, y, grad, reduction)

    checks, message = _failed_checks("class_weighted_bce", naive, ("float32",))
    assert "extremes" in checks
    assert "check 'extremes' failed" in message and "expected a finite value" in message


def test_per_class_mean_instead_of_sum_fails_the_result_check(host: Host) -> None:
    def mean_per_class(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **kw: Any) -> LossResult:
        result = builtin.bce_numpy(logits, targets, grad, **kw)
        result.per_class = result.per_class / max(1, len(logits))
        return result

    checks, message = _failed_checks("class_weighted_bce", mean_per_class)
    assert "result" in checks and "agreement" in checks
    assert "worst element per_class[" in message


def test_nan_on_empty_input_fails_the_empty_check(host: Host) -> None:
    def nan_when_empty(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **kw: Any) -> LossResult:
        result = builtin.focal_numpy(logits, targets, grad, **kw)
        if len(logits) == 0 and kw["reduction"] == "mean":
            result.loss = float("nan")
        return result

    checks, message = _failed_checks("sigmoid_focal", nan_when_empty)
    assert checks == {"empty"}
    assert "N = 0, reduction 'mean'" in message and "worst element loss = nan" in message


def test_kernel_that_swallows_unknown_parameters_fails_the_signature_check(host: Host) -> None:
    def lenient(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **kw: Any) -> LossResult:
        kw.pop("no_such_param", None)
        return builtin.focal_numpy(logits, targets, grad, **kw)

    checks, message = _failed_checks("sigmoid_focal", lenient)
    assert checks == {"signature"}
    assert "an unknown keyword parameter was accepted" in message


def test_kernel_that_writes_its_inputs_fails(host: Host) -> None:
    def scribbler(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **kw: Any) -> LossResult:
        result = builtin.bce_numpy(logits, targets, grad, **kw)
        if logits.size:
            logits[-1, -1] = 123.0
        return result

    checks, _ = _failed_checks("class_weighted_bce", scribbler)
    assert "inputs_unchanged" in checks


def test_unavailable_kernel_is_skipped_with_its_reason(host: Host) -> None:
    kernel = Kernel("sigmoid_focal", "vulkan", builtin.focal_numpy, available=lambda: "no Vulkan device")
    report = check_kernel("sigmoid_focal", kernel)
    assert [(r.check, r.status, r.message) for r in report.results] == [("available", "skipped", "no Vulkan device")]


def test_unknown_backend_is_an_error(host: Host) -> None:
    with pytest.raises(
        ConformanceError, match="Unknown backend 'cuda' for loss 'sigmoid_focal'; available: numpy, torch"
    ):
        check_kernel("sigmoid_focal", "cuda")


def hinge_reference(
    logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, *, margin: float, reduction: str
) -> LossResult:
    """Third-party term: smooth hinge softplus(margin - (2y-1) x)."""
    x, y = logits.astype(np.float64), targets.astype(np.float64)
    s = 2 * y - 1
    z = margin - s * x
    elementwise = np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))
    e = np.exp(-np.abs(z))
    gradient = -s * np.where(z >= 0, 1.0, e) / (1 + e)
    return reduce_elementwise(elementwise, gradient, y, grad, reduction)


def hinge_float32(
    logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, *, margin: float, reduction: str
) -> LossResult:
    """A float32 kernel of the third-party term (reuses the reference, rounds like a real kernel)."""
    g64 = None if grad is None else np.zeros(grad.shape)
    result = hinge_reference(
        logits.astype(np.float32), targets.astype(np.float32), g64, margin=margin, reduction=reduction
    )
    if grad is not None and g64 is not None:
        grad += g64.astype(np.float32)
    return result


HINGE = LossTerm(
    "smooth_hinge",
    hinge_reference,
    params=(Param("margin", "float", 1.0, minimum=0.0),),
    examples=lambda c: [{}, {"margin": 0.25}],
)


class ThirdParty:
    """An installed plugin adding a term and two kernels, one of them broken."""

    @hookimpl
    def tracker_register_losses(self, register: Any) -> None:
        register(HINGE)

    @hookimpl
    def tracker_register_kernels(self, register: Any) -> None:
        register(Kernel("smooth_hinge", "numpy", hinge_float32, ("float32",)))

        def assigning(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **kw: Any) -> LossResult:
            if grad is None:
                return hinge_float32(logits, targets, None, **kw)
            g = np.zeros_like(grad)
            result = hinge_float32(logits, targets, g, **kw)
            grad[...] = g
            return result

        register(Kernel("smooth_hinge", "assign", assigning, ("float32",)))


@pytest.fixture
def third_party() -> Iterator[Host]:
    pm = make_plugin_manager(default_plugins=(), entry_points=False)
    pm.register(ThirdParty(), name="thirdparty")
    fresh = Host(pm)
    old = set_host(fresh)
    yield fresh
    set_host(old)


def test_third_party_term_and_kernel_are_checked_like_built_ins(third_party: Host) -> None:
    assert check_loss_term("smooth_hinge").ok
    assert check_kernel("smooth_hinge", "numpy").ok
    report = check_all()
    failed = {(r.term, r.backend, r.check) for r in report.failures}
    assert failed == {("smooth_hinge", "assign", "accumulation")}


def test_third_party_reference_with_a_wrong_gradient_fails() -> None:
    def half_gradient(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **kw: Any) -> LossResult:
        g = None if grad is None else np.zeros(grad.shape)
        result = hinge_reference(logits, targets, g, **kw)
        if grad is not None and g is not None:
            grad += 0.5 * g
        return result

    report = check_loss_term(LossTerm("half", half_gradient, HINGE.params), raise_on_failure=False)
    assert {r.check for r in report.failures} == {"gradient"}
    assert report.failures[0].message.startswith("half/reference: check 'gradient' failed (example 0 {}, float64")


def test_term_whose_examples_do_not_resolve_fails_the_schema_check() -> None:
    term = LossTerm("odd", hinge_reference, HINGE.params, examples=lambda c: [{"margin": -1.0}])
    report = check_loss_term(term, raise_on_failure=False)
    assert [r.check for r in report.failures] == ["schema"]
    assert "parameter 'margin' is -1.0" in report.failures[0].message


def test_pytest_plugin_makes_one_test_per_term_and_kernel(third_party: Host, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_generated="""
        from tracker.testing.pytest_plugin import test_tracker_kernel, test_tracker_loss_term
        """
    )
    result = pytester.runpytest_inprocess("-p", "tracker.testing.pytest_plugin", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    output = result.stdout.str()
    assert "test_tracker_kernel[smooth_hinge/assign]" in output
    assert "smooth_hinge/assign (plugin 'thirdparty'): check 'accumulation' failed" in output
