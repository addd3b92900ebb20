"""Conformance checks for loss terms and kernels, built-in or third-party.

:func:`check_loss_term` holds a term's float64 reference to its own contract;
:func:`check_kernel` holds a kernel to the contract and to the reference. Checks:

* ``signature``: an unknown keyword parameter raises;
* ``result``: shapes and dtypes of the result, ``positives`` equal to the count of
  targets > 0, ``per_class`` summing to the loss;
* ``reductions``: ``mean`` is ``sum / (N*C)``, ``none`` sums to ``sum``, and their
  gradients scale alike;
* ``gradient``: the gradient agrees with central finite differences in float64
  (kernels that accept float64, and every reference);
* ``accumulation``: the gradient is ADDED into a prefilled buffer, twice gives
  twice, and two parameter sets on one buffer give the sum of their gradients
  (this fails a kernel that writes ``grad[...] = g``);
* ``agreement``: loss, per-class sums, positives and gradient equal the reference
  for every parameter example, reduction and dtype the kernel lists, and on a
  large input that spans many chunks;
* ``extremes``: finite and correct results for |logits| up to 1e4 (float32, and
  float16/bfloat16 where listed);
* ``empty``: N = 0 gives loss 0.0 (an empty array for ``none``), zero vectors and
  an untouched gradient;
* ``inputs_unchanged``: logits and targets are not written.

Every failure message names the term, the backend, the check, the case (parameter
example, reduction, dtype) and the worst element. Pair terms (inputs ``views`` or
``student_teacher``) get the same checks on the inputs they take:
:mod:`tracker.testing.pair_checks`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from tracker.errors import TrackerError
from tracker.losses import REDUCTIONS, Kernel, LossResult, LossTerm, get_term, kernels, reference_kernel

NUM_CLASSES = 5
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-11),
    "float32": (1e-4, 1e-5),
    "float16": (1e-4, 1e-5),
    "bfloat16": (1e-4, 1e-5),
}
EXTREMES = np.array([1e4, -1e4, 1e3, -1e3, 100.0, -100.0, 30.0, -30.0, 17.0, -17.0, 0.0, 1e-3, -1e-3, 5.0, -5.0])


class ConformanceError(TrackerError):
    """A term or kernel failed one or more conformance checks."""


@dataclass
class CheckResult:
    """The outcome of one check of one term on one backend."""

    term: str
    backend: str
    check: str
    status: str
    message: str = ""


@dataclass
class ConformanceReport:
    """All check results of a run; ``ok`` when none failed."""

    results: list[CheckResult] = field(default_factory=list)

    @property
    def failures(self) -> list[CheckResult]:
        """The failed checks."""
        return [r for r in self.results if r.status == "failed"]

    @property
    def ok(self) -> bool:
        """True when no check failed."""
        return not self.failures

    def extend(self, other: "ConformanceReport") -> None:
        """Append the results of ``other``."""
        self.results.extend(other.results)

    def raise_if_failed(self) -> None:
        """Raise ConformanceError listing every failure."""
        if self.failures:
            raise ConformanceError("\n".join(r.message for r in self.failures))


class _Failure(Exception):
    pass


@dataclass
class _Case:
    label: str
    resolved: dict[str, Any]


def _testable(dtypes: tuple[str, ...]) -> list[str]:
    """``dtypes`` that can be built here (bfloat16 needs ml_dtypes)."""
    return [d for d in dtypes if d != "bfloat16" or importlib.util.find_spec("ml_dtypes") is not None]


def _numpy_dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def _data(rng: np.random.Generator, n: int, c: int, dtype: str = "float64") -> tuple[np.ndarray, np.ndarray]:
    """Logits ~ N(0, 3) and targets mostly 0/1 with some soft values, rounded to ``dtype``."""
    x = rng.normal(0.0, 3.0, (n, c))
    y = (rng.random((n, c)) < 0.3).astype(np.float64)
    soft = rng.random((n, c)) < 0.2
    y[soft] = rng.choice([0.25, 0.5, 0.75], size=int(soft.sum()))
    np_dtype = _numpy_dtype(dtype)
    return np.ascontiguousarray(x.astype(np_dtype)), np.ascontiguousarray(y.astype(np_dtype))


def _short(params: dict[str, Any]) -> str:
    parts = []
    for key, value in params.items():
        shown = f"[{len(value)} values]" if np.ndim(value) == 1 else repr(value)
        parts.append(f"{key}={shown}")
    return "{" + ", ".join(parts) + "}"


def _cases(term: LossTerm, num_classes: int) -> list[_Case]:
    """One case per parameter example of the term (reduction set by each check)."""
    cases = []
    for i, example in enumerate(term.examples(num_classes)):
        checked = term.check_params({**example, "reduction": "sum"})
        cases.append(_Case(f"example {i} {_short(example)}", term.resolved(checked, num_classes)))
    return cases


def _worst(what: str, got: Any, expected: Any, rtol: float, atol: float, scale: Any = None) -> None:
    """Raise _Failure naming the worst element when ``got`` is not close to ``expected``."""
    got_a, exp_a = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if got_a.shape != exp_a.shape:
        raise _Failure(f"{what} has shape {got_a.shape}; expected {exp_a.shape}")
    if got_a.size == 0:
        return
    ref = np.abs(exp_a) if scale is None else np.abs(np.asarray(scale, dtype=np.float64))
    tol = atol * max(float(ref.max()), 1e-30) + rtol * np.abs(exp_a)
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.abs(got_a - exp_a)
        err = np.where(np.isfinite(got_a), err, np.inf)
        ratio = np.where(err == 0.0, 0.0, err / tol)  # 0/0 would be NaN, which argmax picks over a failure
    idx = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    if ratio[idx] > 1.0:
        where = f"{what}[{', '.join(map(str, idx))}]" if got_a.ndim else what
        raise _Failure(
            f"worst element {where} = {float(got_a[idx]):.9g}, expected {float(exp_a[idx]):.9g} "
            f"(|error| {err[idx]:.3g} > tol {tol[idx]:.3g})"
        )


def _close(got: Any, expected: Any, rtol: float, atol: float, scale: Any = None) -> bool:
    """True when ``got`` equals ``expected`` within the tolerances of :func:`_worst`."""
    try:
        _worst("", got, expected, rtol, atol, scale)
    except _Failure:
        return False
    return True


def _owner(term: LossTerm, kernel: Kernel | None) -> str | None:
    """The plugin that registered ``term`` (or ``kernel``) with the process-wide host, if any."""
    from tracker.host import get_host

    if kernel is None:
        return get_host().owner("losses", term.name, term)
    return get_host().owner("kernels", f"{term.name}/{kernel.backend}", kernel)


def _call(
    kernel: Kernel, x: np.ndarray, y: np.ndarray, grad: np.ndarray | None, resolved: dict[str, Any], reduction: str
) -> LossResult:
    result = kernel.fn(x, y, grad, **{**resolved, "reduction": reduction})
    if not isinstance(result, LossResult):
        raise _Failure(f"returned {type(result).__name__}; expected tracker.losses.LossResult")
    return result


def _grad_of(
    kernel: Kernel, x: np.ndarray, y: np.ndarray, resolved: dict[str, Any], reduction: str, dtype: Any = None
) -> tuple[LossResult, np.ndarray]:
    """Call with a zeroed grad buffer (float64 for float64 logits, else float32 unless ``dtype``)."""
    grad = np.zeros(x.shape, dtype=dtype or (np.float64 if x.dtype == np.float64 else np.float32))
    return _call(kernel, x, y, grad, resolved, reduction), grad


class _Checker:
    """Runs named checks for one term on one backend, collecting results."""

    def __init__(self, term: LossTerm, kernel: Kernel, reference: Kernel | None):
        self.term, self.kernel, self.reference = term, kernel, reference
        self.plugin = _owner(term, kernel if reference is not None else None)
        self.report = ConformanceReport()
        self.cases = _cases(term, NUM_CLASSES)
        self.float_dtype = "float64" if reference is None else "float32"

    def run(self, check: str, fn: Callable[[], Iterator[str]]) -> None:
        """Run one check; record it passed, or failed with the case it was on."""
        label = ""
        try:
            for step in fn():
                label = step
            self.report.results.append(CheckResult(self.term.name, self.kernel.backend, check, "passed"))
        except _Failure as exc:
            self._fail(check, label, str(exc))
        except Exception as exc:
            self._fail(check, label, f"raised {type(exc).__name__}: {exc}")

    def _fail(self, check: str, label: str, detail: str) -> None:
        who = f" (plugin {self.plugin!r})" if self.plugin else ""
        message = f"{self.term.name}/{self.kernel.backend}{who}: check {check!r} failed ({label or 'setup'}): {detail}"
        self.report.results.append(CheckResult(self.term.name, self.kernel.backend, check, "failed", message))

    def _tol(self, dtype: str) -> tuple[float, float]:
        return TOLERANCES[dtype]

    def signature(self) -> Iterator[str]:
        """An unknown keyword parameter raises."""
        x, y = _data(np.random.default_rng(1), 3, NUM_CLASSES, self.float_dtype)
        yield "unknown keyword 'no_such_param'"
        try:
            self.kernel.fn(x, y, None, **{**self.cases[0].resolved, "reduction": "sum", "no_such_param": 1.0})
        except Exception:
            return
        raise _Failure("an unknown keyword parameter was accepted; expected the kernel to raise")

    def result(self) -> Iterator[str]:
        """Result shapes and dtypes, positives, per-class sums adding up to the loss."""
        x, y = _data(np.random.default_rng(2), 9, NUM_CLASSES, self.float_dtype)
        rtol, atol = self._tol(self.float_dtype)
        for case in self.cases:
            for reduction in REDUCTIONS:
                yield f"{case.label}, reduction {reduction!r}"
                r = _call(self.kernel, x, y, None, case.resolved, reduction)
                per_class, positives = np.asarray(r.per_class), np.asarray(r.positives)
                if per_class.shape != (NUM_CLASSES,) or positives.shape != (NUM_CLASSES,):
                    shapes = f"per_class shape {per_class.shape}, positives shape {positives.shape}"
                    raise _Failure(f"{shapes}; expected ({NUM_CLASSES},)")
                if positives.dtype.kind not in "iu" or per_class.dtype.kind != "f":
                    raise _Failure(
                        f"per_class dtype {per_class.dtype}, positives dtype {positives.dtype}; expected float64, int64"
                    )
                _worst("positives", positives, np.count_nonzero(y.astype(np.float64) > 0, axis=0), 0.0, 0.0)
                if reduction == "none":
                    _worst("loss", np.asarray(r.loss).sum(axis=0), per_class, *TOLERANCES["float32"])
                else:
                    if not isinstance(r.loss, float):
                        raise _Failure(f"loss is {type(r.loss).__name__}; expected a Python float")
                    scale = x.size if reduction == "mean" else 1
                    _worst("loss", r.loss * scale, per_class.sum(), rtol, atol)

    def reductions(self) -> Iterator[str]:
        """mean = sum / (N*C), none sums to sum, and the gradients scale alike."""
        x, y = _data(np.random.default_rng(3), 8, NUM_CLASSES, self.float_dtype)
        rtol, atol = self._tol(self.float_dtype)
        for case in self.cases:
            yield case.label
            r_sum, g_sum = _grad_of(self.kernel, x, y, case.resolved, "sum")
            r_mean, g_mean = _grad_of(self.kernel, x, y, case.resolved, "mean")
            r_none, g_none = _grad_of(self.kernel, x, y, case.resolved, "none")
            _worst("mean loss * N*C", r_mean.loss * x.size, r_sum.loss, rtol, atol)
            none_sum = np.asarray(r_none.loss, dtype=np.float64).sum()
            _worst("sum of 'none' loss (float32)", none_sum, r_sum.loss, *TOLERANCES["float32"])
            _worst("mean grad * N*C", g_mean * x.size, g_sum, rtol, atol)
            _worst("'none' grad", g_none, g_sum, rtol, atol)

    def gradient(self) -> Iterator[str]:
        """The float64 gradient matches central finite differences."""
        if "float64" not in self.kernel.dtypes:
            yield "kernel does not accept float64 (covered by 'agreement')"
            return
        x, y = _data(np.random.default_rng(4), 6, NUM_CLASSES, "float64")
        for case in self.cases:
            yield f"{case.label}, float64, central differences"
            _, analytic = _grad_of(self.kernel, x, y, case.resolved, "sum")
            numeric = np.zeros_like(x)
            for idx in np.ndindex(*x.shape):
                h = 1e-6 * max(1.0, abs(float(x[idx])))
                xp, xm = x.copy(), x.copy()
                xp[idx] += h
                xm[idx] -= h
                up = _call(self.kernel, xp, y, None, case.resolved, "sum").loss
                down = _call(self.kernel, xm, y, None, case.resolved, "sum").loss
                numeric[idx] = (up - down) / (2 * h)
            _worst("grad", analytic, numeric, 1e-5, 1e-6)

    def accumulation(self) -> Iterator[str]:
        """Gradients are added: prefilled buffer, twice, and two terms on one buffer."""
        rng = np.random.default_rng(5)
        x, y = _data(rng, 7, NUM_CLASSES, self.float_dtype)
        rtol, atol = self._tol(self.float_dtype)
        for case in self.cases:
            yield f"{case.label}, prefilled grad, called twice"
            _, g = _grad_of(self.kernel, x, y, case.resolved, "sum")
            start = rng.normal(0.0, 1.0, x.shape).astype(g.dtype)
            buffer = start.copy()
            _call(self.kernel, x, y, buffer, case.resolved, "sum")
            scale = np.maximum(np.abs(start), np.abs(g))
            if _close(buffer, g, rtol, atol, scale):
                try:
                    _worst("grad after one call - prefill", buffer.astype(np.float64) - start, g, rtol, atol, scale)
                except _Failure as detail:
                    raise _Failure(f"{self._overwrote('a buffer that already held other gradients')} ({detail})")
            _worst("grad after one call - prefill", buffer.astype(np.float64) - start, g, rtol, atol, scale)
            _call(self.kernel, x, y, buffer, case.resolved, "sum")
            _worst("grad after two calls - prefill", buffer.astype(np.float64) - start, 2.0 * g, rtol, atol, scale)
        first, last = self.cases[0], self.cases[-1]
        yield f"two terms ({first.label} with 'sum', {last.label} with 'mean') on one buffer"
        _, g_first = _grad_of(self.kernel, x, y, first.resolved, "sum")
        _, g_last = _grad_of(self.kernel, x, y, last.resolved, "mean")
        buffer = np.zeros(x.shape, dtype=g_first.dtype)
        _call(self.kernel, x, y, buffer, first.resolved, "sum")
        _call(self.kernel, x, y, buffer, last.resolved, "mean")
        if not _close(g_first, 0.0 * g_first, rtol, atol) and _close(buffer, g_last, rtol, atol):
            raise _Failure(self._overwrote("a buffer that held the first term's gradient"))
        _worst("grad of both terms", buffer, g_first + g_last, rtol, atol)

    def _overwrote(self, what: str) -> str:
        """The plugin author's explanation of a kernel that assigns its gradient."""
        owner = f"plugin {self.plugin!r}" if self.plugin else "the plugin"
        return (
            f"the kernel OVERWROTE the gradient instead of adding into it: called on {what}, it left "
            f"only its own gradient there, so the gradients already in the buffer were lost. A kernel "
            f"must ADD dL/dlogits into `grad` (`grad += g`), never assign it (`grad[...] = g`, "
            f"`grad.fill(0)`, `np.copyto(grad, g)`): one buffer collects the gradients of every loss "
            f"term on the same logits. Fix the {self.kernel.backend!r} kernel of {self.term.name!r} "
            f"in {owner}."
        )

    def agreement(self) -> Iterator[str]:
        """Loss, per-class sums, positives and gradient equal the reference."""
        assert self.reference is not None
        rng = np.random.default_rng(6)
        for dtype in _testable(self.kernel.dtypes):
            x, y = _data(rng, 11, NUM_CLASSES, dtype)
            targets = [y, y.astype(np.float32)] if dtype != "float32" else [y]
            for case in self.cases:
                for reduction in REDUCTIONS if dtype == "float32" else ("sum",):
                    for yy in targets:
                        yield f"{case.label}, reduction {reduction!r}, logits {dtype}, targets {yy.dtype}"
                        self._agree(x, yy, case.resolved, reduction, dtype)
        x, y = _data(rng, 11, NUM_CLASSES, "float32")
        yield f"{self.cases[-1].label}, reduction 'sum', logits float32, grad buffer float64"
        self._agree(x, y, self.cases[-1].resolved, "sum", "float32", np.float64)
        x, y = _data(rng, 4000, 80, "float32")
        for case in _cases(self.term, 80)[:: max(1, len(self.cases) - 1)]:
            yield f"{case.label}, large input 4000 x 80, reduction 'mean', float32"
            self._agree(x, y, case.resolved, "mean", "float32")

    def _agree(
        self,
        x: np.ndarray,
        y: np.ndarray,
        resolved: dict[str, Any],
        reduction: str,
        dtype: str,
        grad_dtype: Any = None,
        computed: tuple[LossResult, np.ndarray] | None = None,
    ) -> None:
        """Compare the kernel (or its ``computed`` result and gradient) with the reference."""
        assert self.reference is not None
        rtol, atol = self._tol(dtype)
        got, g = computed or _grad_of(self.kernel, x, y, resolved, reduction, grad_dtype)
        want, g_ref = _grad_of(
            self.reference, x.astype(np.float64), y.astype(np.float64), resolved, reduction, np.float64
        )
        _worst("loss", got.loss, want.loss, rtol, atol)
        if computed is None and dtype == "float32":
            plain = _call(self.kernel, x, y, None, resolved, reduction)
            _worst("loss without grad", plain.loss, want.loss, rtol, atol)
        _worst("per_class", got.per_class, want.per_class, rtol, atol)
        _worst("positives", got.positives, want.positives, 0.0, 0.0)
        _worst("grad", g, g_ref, rtol, atol)

    def extremes(self) -> Iterator[str]:
        """Finite (and correct) results for |logits| up to 1e4, in every listed dtype."""
        rng = np.random.default_rng(7)
        values = np.resize(EXTREMES, (6, NUM_CLASSES * 3))[:, : NUM_CLASSES * 3].reshape(-1, NUM_CLASSES)
        dtypes = [d for d in ("float32", "float16", "bfloat16", "float64") if d in _testable(self.kernel.dtypes)]
        for dtype in dtypes:
            x = np.ascontiguousarray(values.astype(_numpy_dtype(dtype)))
            y = np.ascontiguousarray(rng.choice([0.0, 1.0, 0.5], size=x.shape).astype(_numpy_dtype(dtype)))
            for case in self.cases:
                for reduction in ("sum", "none"):
                    yield f"{case.label}, reduction {reduction!r}, logits {dtype} up to |1e4|"
                    r, g = _grad_of(self.kernel, x, y, case.resolved, reduction)
                    for what, value in (("loss", r.loss), ("per_class", r.per_class), ("grad", g)):
                        array = np.asarray(value, dtype=np.float64)
                        bad = np.argwhere(~np.isfinite(array))
                        if bad.size:
                            idx = tuple(int(i) for i in bad[0])
                            raise _Failure(f"worst element {what}{list(idx)} = {array[idx]!r}; expected a finite value")
                    if self.reference is not None:
                        self._agree(x, y, case.resolved, reduction, dtype, computed=(r, g))

    def empty(self) -> Iterator[str]:
        """N = 0 gives a zero loss and zero vectors."""
        x, y = _data(np.random.default_rng(8), 0, NUM_CLASSES, self.float_dtype)
        for case in self.cases:
            for reduction in REDUCTIONS:
                yield f"{case.label}, N = 0, reduction {reduction!r}"
                grad = np.zeros((0, NUM_CLASSES), dtype=np.float32)
                r = _call(self.kernel, x, y, grad, case.resolved, reduction)
                expected_loss = np.zeros((0, NUM_CLASSES)) if reduction == "none" else 0.0
                _worst("loss", r.loss, expected_loss, 0.0, 0.0)
                _worst("per_class", r.per_class, np.zeros(NUM_CLASSES), 0.0, 0.0)
                _worst("positives", r.positives, np.zeros(NUM_CLASSES), 0.0, 0.0)

    def inputs_unchanged(self) -> Iterator[str]:
        """Logits and targets are not written."""
        x, y = _data(np.random.default_rng(9), 5, NUM_CLASSES, self.float_dtype)
        for case in self.cases:
            yield case.label
            x0, y0 = x.copy(), y.copy()
            _grad_of(self.kernel, x, y, case.resolved, "mean")
            if not (np.array_equal(x, x0) and np.array_equal(y, y0)):
                raise _Failure("the call wrote into its logits or targets; expected them untouched")


_REFERENCE_CHECKS = (
    "signature",
    "result",
    "reductions",
    "gradient",
    "accumulation",
    "extremes",
    "empty",
    "inputs_unchanged",
)
_KERNEL_CHECKS = (*_REFERENCE_CHECKS[:4], "accumulation", "agreement", "extremes", "empty", "inputs_unchanged")


def _schema_report(term: LossTerm) -> ConformanceReport | None:
    report = ConformanceReport()
    try:
        term.validate()
        _cases(term, NUM_CLASSES)
    except Exception as exc:
        message = f"{term.name}/reference: check 'schema' failed: {type(exc).__name__}: {exc}"
        report.results.append(CheckResult(term.name, "reference", "schema", "failed", message))
        return report
    return None


def _checker_class(term: LossTerm) -> type[_Checker]:
    if term.inputs == "logits":
        return _Checker
    from tracker.testing.pair_checks import PairChecker

    return PairChecker


def check_loss_term(term: LossTerm | str, *, raise_on_failure: bool = True) -> ConformanceReport:
    """Run the conformance checks on ``term``'s float64 reference.

    Raises ConformanceError naming every failure unless ``raise_on_failure`` is
    False; returns the report.
    """
    loss_term = get_term(term)
    report = _schema_report(loss_term)
    if report is None:
        checker = _checker_class(loss_term)(loss_term, reference_kernel(loss_term), None)
        checker.report.results.append(CheckResult(loss_term.name, "reference", "schema", "passed"))
        for check in _REFERENCE_CHECKS:
            checker.run(check, getattr(checker, check))
        report = checker.report
    if raise_on_failure:
        report.raise_if_failed()
    return report


def check_kernel(term: LossTerm | str, backend: str | Kernel, *, raise_on_failure: bool = True) -> ConformanceReport:
    """Run the conformance checks on the kernel of ``term`` on ``backend`` (a name or a Kernel).

    An unavailable kernel gives one ``skipped`` result naming the reason.
    """
    loss_term = get_term(term)
    if isinstance(backend, Kernel):
        kernel = backend
    else:
        found = kernels(loss_term)
        if backend not in found:
            available = ", ".join(found) or "none"
            raise ConformanceError(f"Unknown backend {backend!r} for loss {loss_term.name!r}; available: {available}")
        kernel = found[backend]
    report = _schema_report(loss_term)
    if report is None:
        reason = kernel.unavailable()
        if reason:
            report = ConformanceReport([CheckResult(loss_term.name, kernel.backend, "available", "skipped", reason)])
        else:
            checker = _checker_class(loss_term)(loss_term, kernel, reference_kernel(loss_term))
            for check in _KERNEL_CHECKS:
                checker.run(check, getattr(checker, check))
            report = checker.report
    if raise_on_failure:
        report.raise_if_failed()
    return report


def check_all(*, raise_on_failure: bool = False) -> ConformanceReport:
    """Check every registered term and every registered kernel of the process-wide host."""
    from tracker.host import get_host

    report = ConformanceReport()
    for name in sorted(get_host().items("losses")):
        report.extend(check_loss_term(name, raise_on_failure=False))
        for backend in kernels(name):
            report.extend(check_kernel(name, backend, raise_on_failure=False))
    orphans = sorted(k for k, v in get_host().items("kernels").items() if v.term not in get_host().items("losses"))
    for key in orphans:
        term, backend = key.split("/", 1)
        message = f"{key}: check 'registered' failed: kernel for unknown loss {term!r}; register the term first"
        report.results.append(CheckResult(term, backend, "registered", "failed", message))
    if raise_on_failure:
        report.raise_if_failed()
    return report
