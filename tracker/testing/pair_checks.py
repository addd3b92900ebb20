"""Conformance checks for pair terms (``inputs`` ``views`` or ``student_teacher``).

The same checks as for logits terms (:mod:`tracker.testing.conformance`), on the
inputs a pair term takes (:mod:`tracker.pairterms`): two ``(N, D)`` arrays,
correlated embedding views for ``views`` (``b = a + noise``) and logits ~ N(0, 3)
for ``student_teacher``, and a gradient pair ``(grad_a, grad_b)``:

* ``signature``: an unknown keyword parameter raises;
* ``result``: a float loss (``(N,)`` for ``none``), components of shape ``(K,)``
  adding up to the ``sum`` loss, ``positives`` equal to N;
* ``reductions``: ``sum`` is N times ``mean``, ``none`` averages to ``mean``, the
  gradients scale alike;
* ``gradient``: both gradients agree with central finite differences in float64;
  where the term stops the gradient on its second input, ``grad_b`` stays
  untouched;
* ``accumulation``: gradients are ADDED into prefilled buffers, twice gives twice,
  two parameter sets on one buffer pair give the sum, and ``(grad_a, None)`` gives
  the same ``grad_a``;
* ``agreement`` (kernels): loss, components and gradients equal the reference for
  every example, reduction and listed dtype, and on a large input;
* ``extremes``: finite (and, for kernels, correct) results with |inputs| up to 1e4;
* ``empty``: N = 0 gives loss 0.0, zero components and untouched gradients;
* ``inputs_unchanged``: the inputs are not written.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from tracker.losses import Kernel, LossResult, LossTerm
from tracker.pairterms import stops_gradient
from tracker.testing.conformance import (
    EXTREMES,
    TOLERANCES,
    _Case,
    _Checker,
    _Failure,
    _close,
    _numpy_dtype,
    _short,
    _testable,
    _worst,
)

DIM = 5
LARGE = (256, 48)  # a batch of 256 samples of 48 dimensions: float32 error grows with both
Grads = tuple[np.ndarray | None, np.ndarray | None]


def pair_data(
    kind: str, rng: np.random.Generator, n: int, d: int, dtype: str = "float64"
) -> tuple[np.ndarray, np.ndarray]:
    """Inputs of a pair term of input kind ``kind``, rounded to ``dtype``."""
    if kind == "views":
        a = rng.normal(0.0, 1.0, (n, d)) + rng.normal(0.0, 0.5, (1, d))
        b = a + rng.normal(0.0, 0.5, (n, d))
    else:
        a, b = rng.normal(0.0, 3.0, (n, d)), rng.normal(0.0, 3.0, (n, d))
    np_dtype = _numpy_dtype(dtype)
    return np.ascontiguousarray(a.astype(np_dtype)), np.ascontiguousarray(b.astype(np_dtype))


def _cases(term: LossTerm, d: int) -> list[_Case]:
    cases = []
    for i, example in enumerate(term.examples(d)):
        checked = term.check_params({**example, "reduction": "sum"})
        cases.append(_Case(f"example {i} {_short(example)}", term.resolved(checked, d)))
    return cases


def _call(kernel: Kernel, a: np.ndarray, b: np.ndarray, grads: Grads | None, resolved: dict[str, Any],
          reduction: str) -> LossResult:
    result = kernel.fn(a, b, grads, **{**resolved, "reduction": reduction})
    if not isinstance(result, LossResult):
        raise _Failure(f"returned {type(result).__name__}; expected tracker.losses.LossResult")
    return result


def _grads_of(kernel: Kernel, a: np.ndarray, b: np.ndarray, resolved: dict[str, Any], reduction: str,
              dtype: Any = None) -> tuple[LossResult, np.ndarray, np.ndarray]:
    """Call with zeroed gradient buffers (float64 for float64 inputs, else float32 unless ``dtype``)."""
    dt = dtype or (np.float64 if a.dtype == np.float64 else np.float32)
    ga, gb = np.zeros(a.shape, dtype=dt), np.zeros(b.shape, dtype=dt)
    return _call(kernel, a, b, (ga, gb), resolved, reduction), ga, gb


class PairChecker(_Checker):
    """Runs the named checks for one pair term on one backend."""

    def __init__(self, term: LossTerm, kernel: Kernel, reference: Kernel | None):
        super().__init__(term, kernel, reference)
        self.cases = _cases(term, DIM)

    def _data(self, seed: int, n: int, dtype: str | None = None, d: int = DIM) -> tuple[np.ndarray, np.ndarray]:
        return pair_data(self.term.inputs, np.random.default_rng(seed), n, d, dtype or self.float_dtype)

    def signature(self) -> Iterator[str]:
        """An unknown keyword parameter raises."""
        a, b = self._data(1, 3)
        yield "unknown keyword 'no_such_param'"
        try:
            self.kernel.fn(a, b, None, **{**self.cases[0].resolved, "reduction": "sum", "no_such_param": 1.0})
        except Exception:
            return
        raise _Failure("an unknown keyword parameter was accepted; expected the kernel to raise")

    def result(self) -> Iterator[str]:
        """Loss type, components adding up to the sum loss, positives = N."""
        n = 9
        a, b = self._data(2, n)
        rtol, atol = TOLERANCES[self.float_dtype]
        k = len(self.term.components)
        for case in self.cases:
            for reduction in self.term.reductions:
                yield f"{case.label}, reduction {reduction!r}"
                r = _call(self.kernel, a, b, None, case.resolved, reduction)
                comps, positives = np.asarray(r.per_class), np.asarray(r.positives)
                if comps.shape != (k,) or positives.shape != (k,) or comps.dtype.kind != "f":
                    raise _Failure(f"per_class {comps.dtype}{comps.shape}, positives shape {positives.shape}; "
                                   f"expected ({k},) components {self.term.components} and ({k},) counts")
                _worst("positives", positives, np.full(k, n), 0.0, 0.0)
                if reduction == "none":
                    _worst("loss shape", np.asarray(r.loss).shape, (n,), 0.0, 0.0)
                    _worst("sum of 'none' loss", np.asarray(r.loss, dtype=np.float64).sum(), comps.sum(),
                           *TOLERANCES["float32"])
                    continue
                if not isinstance(r.loss, float):
                    raise _Failure(f"loss is {type(r.loss).__name__}; expected a Python float")
                _worst("loss * scale", r.loss * (n if reduction == "mean" else 1), comps.sum(), rtol, atol)

    def reductions(self) -> Iterator[str]:
        """sum = N * mean, none averages to mean, gradients scale alike."""
        n = 8
        a, b = self._data(3, n)
        rtol, atol = TOLERANCES[self.float_dtype]
        for case in self.cases:
            yield case.label
            r_sum, sa, sb = _grads_of(self.kernel, a, b, case.resolved, "sum")
            r_mean, ma, mb = _grads_of(self.kernel, a, b, case.resolved, "mean")
            _worst("mean loss * N", r_mean.loss * n, r_sum.loss, rtol, atol)
            _worst("mean grad_a * N", ma * n, sa, rtol, atol)
            _worst("mean grad_b * N", mb * n, sb, rtol, atol)
            if "none" in self.term.reductions:
                r_none, na, nb = _grads_of(self.kernel, a, b, case.resolved, "none")
                _worst("sum of 'none' loss", np.asarray(r_none.loss, dtype=np.float64).sum(), r_sum.loss,
                       *TOLERANCES["float32"])
                _worst("'none' grad_a", na, sa, rtol, atol)
                _worst("'none' grad_b", nb, sb, rtol, atol)

    def _numeric(self, a: np.ndarray, b: np.ndarray, resolved: dict[str, Any], which: int) -> np.ndarray:
        inputs = [a, b]
        x = inputs[which]
        numeric = np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            h = 1e-6 * max(1.0, abs(float(x[idx])))
            values = []
            for sign in (1.0, -1.0):
                moved = x.copy()
                moved[idx] += sign * h
                pair = [moved, b] if which == 0 else [a, moved]
                values.append(_call(self.kernel, pair[0], pair[1], None, resolved, "sum").loss)
            numeric[idx] = (values[0] - values[1]) / (2 * h)
        return numeric

    def gradient(self) -> Iterator[str]:
        """Both float64 gradients match central differences; a stopped gradient stays untouched."""
        if "float64" not in self.kernel.dtypes:
            yield "kernel does not accept float64 (covered by 'agreement')"
            return
        a, b = self._data(4, 6, "float64")
        for case in self.cases:
            yield f"{case.label}, float64, central differences on the first input"
            _, ga, gb = _grads_of(self.kernel, a, b, case.resolved, "sum")
            _worst("grad_a", ga, self._numeric(a, b, case.resolved, 0), 1e-5, 1e-6)
            if stops_gradient(self.term, case.resolved):
                yield f"{case.label}: the second input is a constant (stop-gradient)"
                _worst("grad_b (stop-gradient: untouched)", gb, np.zeros_like(gb), 0.0, 0.0)
                continue
            yield f"{case.label}, float64, central differences on the second input"
            _worst("grad_b", gb, self._numeric(a, b, case.resolved, 1), 1e-5, 1e-6)

    def accumulation(self) -> Iterator[str]:
        """Gradients are added: prefilled buffers, twice, two terms on one buffer pair, one buffer only."""
        rng = np.random.default_rng(5)
        a, b = self._data(5, 7)
        rtol, atol = TOLERANCES[self.float_dtype]
        for case in self.cases:
            yield f"{case.label}, prefilled grads, called twice"
            _, ga, gb = _grads_of(self.kernel, a, b, case.resolved, "sum")
            starts = [rng.normal(0.0, 1.0, a.shape).astype(ga.dtype) for _ in range(2)]
            buffers = (starts[0].copy(), starts[1].copy())
            for calls in (1, 2):
                _call(self.kernel, a, b, buffers, case.resolved, "sum")
                for i, (buf, start, g) in enumerate(zip(buffers, starts, (ga, gb))):
                    scale = np.maximum(np.abs(start), np.abs(g))
                    if calls == 1 and _close(buf, g, rtol, atol, scale) and not _close(g, 0 * g, rtol, atol):
                        raise _Failure(self._overwrote(f"grad[{i}], a buffer that already held other gradients"))
                    _worst(f"grad[{i}] after {calls} call(s) - prefill", buf.astype(np.float64) - start, calls * g,
                           rtol, atol, scale)
            yield f"{case.label}, grad=(grad_a, None)"
            only = np.zeros(a.shape, dtype=ga.dtype)
            _call(self.kernel, a, b, (only, None), case.resolved, "sum")
            _worst("grad_a alone", only, ga, rtol, atol)
        first, last = self.cases[0], self.cases[-1]
        yield f"two terms ({first.label} with 'sum', {last.label} with 'mean') on one buffer pair"
        _, fa, fb = _grads_of(self.kernel, a, b, first.resolved, "sum")
        _, la, lb = _grads_of(self.kernel, a, b, last.resolved, "mean")
        buffers = (np.zeros_like(fa), np.zeros_like(fb))
        _call(self.kernel, a, b, buffers, first.resolved, "sum")
        _call(self.kernel, a, b, buffers, last.resolved, "mean")
        _worst("grad_a of both terms", buffers[0], fa + la, rtol, atol)
        _worst("grad_b of both terms", buffers[1], fb + lb, rtol, atol)

    def _overwrote(self, what: str) -> str:
        owner = f"plugin {self.plugin!r}" if self.plugin else "the plugin"
        return (f"the kernel OVERWROTE the gradient instead of adding into it ({what}); a kernel must ADD "
                f"(`grad_a += g`), never assign: fix the {self.kernel.backend!r} kernel of {self.term.name!r} "
                f"in {owner}.")

    def _agree(self, a: np.ndarray, b: np.ndarray, resolved: dict[str, Any], reduction: str, dtype: str,
               grad_dtype: Any = None, computed: tuple[LossResult, np.ndarray, np.ndarray] | None = None) -> None:
        assert self.reference is not None
        rtol, atol = TOLERANCES[dtype]
        got, ga, gb = computed or _grads_of(self.kernel, a, b, resolved, reduction, grad_dtype)
        want, ra, rb = _grads_of(self.reference, a.astype(np.float64), b.astype(np.float64), resolved, reduction,
                                 np.float64)
        _worst("loss", got.loss, want.loss, rtol, atol)
        _worst("components", got.per_class, want.per_class, rtol, atol)
        _worst("positives", got.positives, want.positives, 0.0, 0.0)
        _worst("grad_a", ga, ra, rtol, atol)
        _worst("grad_b", gb, rb, rtol, atol)

    def agreement(self) -> Iterator[str]:
        """Loss, components and gradients equal the reference."""
        for dtype in _testable(self.kernel.dtypes):
            a, b = self._data(6, 11, dtype)
            for case in self.cases:
                for reduction in self.term.reductions if dtype == "float32" else ("sum",):
                    yield f"{case.label}, reduction {reduction!r}, inputs {dtype}"
                    self._agree(a, b, case.resolved, reduction, dtype)
        a, b = self._data(6, 11, "float32")
        yield f"{self.cases[-1].label}, reduction 'sum', inputs float32, grad buffers float64"
        self._agree(a, b, self.cases[-1].resolved, "sum", "float32", np.float64)
        a, b = self._data(6, LARGE[0], "float32", d=LARGE[1])
        for case in _cases(self.term, LARGE[1])[:: max(1, len(self.cases) - 1)]:
            yield f"{case.label}, large input {LARGE[0]} x {LARGE[1]}, reduction 'mean', float32"
            self._agree(a, b, case.resolved, "mean", "float32")

    def extremes(self) -> Iterator[str]:
        """Finite (and correct) results for |inputs| up to 1e4, in every listed dtype."""
        rng = np.random.default_rng(7)
        values = np.resize(EXTREMES, (6, DIM))
        dtypes = [d for d in ("float32", "float16", "bfloat16", "float64") if d in _testable(self.kernel.dtypes)]
        for dtype in dtypes:
            a = np.ascontiguousarray(values.astype(_numpy_dtype(dtype)))
            b = np.ascontiguousarray(rng.permutation(values.ravel()).reshape(values.shape).astype(_numpy_dtype(dtype)))
            for case in self.cases:
                for reduction in self.term.reductions:
                    yield f"{case.label}, reduction {reduction!r}, inputs {dtype} up to |1e4|"
                    r, ga, gb = _grads_of(self.kernel, a, b, case.resolved, reduction)
                    for what, value in (("loss", r.loss), ("components", r.per_class), ("grad_a", ga),
                                        ("grad_b", gb)):
                        array = np.asarray(value, dtype=np.float64)
                        bad = np.argwhere(~np.isfinite(array))
                        if bad.size:
                            idx = tuple(int(i) for i in bad[0])
                            raise _Failure(f"worst element {what}{list(idx)} = {array[idx]!r}; expected a finite value")
                    if self.reference is not None:
                        self._agree(a, b, case.resolved, reduction, dtype, computed=(r, ga, gb))

    def empty(self) -> Iterator[str]:
        """N = 0 gives a zero loss, zero components and untouched gradients."""
        a, b = self._data(8, 0)
        k = len(self.term.components)
        for case in self.cases:
            for reduction in self.term.reductions:
                yield f"{case.label}, N = 0, reduction {reduction!r}"
                grads = (np.zeros((0, DIM), dtype=np.float32), np.zeros((0, DIM), dtype=np.float32))
                r = _call(self.kernel, a, b, grads, case.resolved, reduction)
                _worst("loss", r.loss, np.zeros(0) if reduction == "none" else 0.0, 0.0, 0.0)
                _worst("components", r.per_class, np.zeros(k), 0.0, 0.0)
                _worst("positives", r.positives, np.zeros(k), 0.0, 0.0)

    def inputs_unchanged(self) -> Iterator[str]:
        """The inputs are not written."""
        a, b = self._data(9, 5)
        for case in self.cases:
            yield case.label
            a0, b0 = a.copy(), b.copy()
            _grads_of(self.kernel, a, b, case.resolved, "mean")
            if not (np.array_equal(a, a0) and np.array_equal(b, b0)):
                raise _Failure("the call wrote into its inputs; expected them untouched")
