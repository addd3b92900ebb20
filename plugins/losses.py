"""Built-in loss terms ``class_weighted_bce`` and ``sigmoid_focal`` with numpy and torch kernels.

Elementwise, with x = logit, y = target in [0, 1], w = per-class weight:

* ``class_weighted_bce``: ``l = w * (pw * y * softplus(-x) + (1 - y) * softplus(x))``
  (``pw`` the optional per-class ``pos_weight``, else 1), i.e.
  ``w * (max(x, 0) - x*y + log1p(exp(-|x|)))`` without ``pos_weight``;
* ``sigmoid_focal`` (``torchvision.ops.sigmoid_focal_loss`` times the class weight):
  ``l = w * a_t * ce * q**gamma`` with ``p = sigmoid(x)``, ``ce = softplus(x) - x*y``,
  ``q = 1 - p_t = p*(1-y) + (1-p)*y`` and ``a_t = alpha*y + (1-alpha)*(1-y)`` (1 when
  ``alpha < 0``). Its gradient is
  ``w * a_t * ((p - y) * q**gamma + gamma * ce * q**gamma * p*(1-p)*(1-2y) / q)``;
  the last factor is bounded (``q >= min(y, 1-y)`` for fractional y, and it is
  ``1-p`` or ``-p`` for y in {0, 1}), and ``q`` is clamped away from 0 where float
  saturation makes it 0, a point where the whole second term is 0.

Class weights come from :mod:`tracker.weights` (scheme, counts, beta, power,
weights, normalize). The float64 references here are the oracles of the
conformance checks. The numpy kernels work on row chunks in float32 (float64 for
float64 inputs) buffers reused across chunks, with in-place ufuncs and no
full-size temporary; chunks are shared among threads (numpy releases the GIL), and
per-chunk float32 sums are added in chunk order in float64, so results do not
depend on the thread count.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from tracker import hookimpl
from tracker.errors import ConfigError
from tracker.losses import REDUCTIONS, Kernel, LossResult, LossTerm, Param, check_gamma, reduce_elementwise
from tracker.weights import NORMALIZATIONS, SCHEMES, class_weights

WEIGHT_PARAMS: tuple[Param, ...] = (
    Param("scheme", "str", "none", SCHEMES, doc="class-weight scheme (tracker.weights)"),
    Param("counts", "vector", minimum=0.0, doc="instances per class, for count-based schemes"),
    Param("beta", "float", 0.999, minimum=0.0, maximum=0.999999999, doc="effective_number beta, 0 <= beta < 1"),
    Param("power", "float", 0.5, minimum=0.0, maximum=1e6, doc="power scheme exponent p: w = (1/n)**p"),
    Param("weights", "vector", minimum=0.0, doc="per-class weights for scheme 'manual'"),
    Param("normalize", "str", "mean", NORMALIZATIONS, doc="mean 1 (= sum C), instances, or none"),
)


def resolve_weight(params: dict[str, Any], num_classes: int) -> np.ndarray:
    """The (C,) float32 class-weight vector for the weight parameters in ``params``."""
    weight = class_weights(
        params["counts"],
        params["scheme"],
        beta=params["beta"],
        power=params["power"],
        weights=params["weights"],
        normalize=params["normalize"],
        num_classes=num_classes,
    )
    return weight.astype(np.float32)


def _resolve_bce(params: dict[str, Any], num_classes: int) -> dict[str, Any]:
    pos_weight = params["pos_weight"]
    if pos_weight is not None:
        if np.ndim(pos_weight) == 1 and len(pos_weight) != num_classes:
            raise ConfigError(f"pos_weight has {len(pos_weight)} entries; expected {num_classes} (one per class)")
        pos_weight = np.broadcast_to(np.asarray(pos_weight, dtype=np.float32), (num_classes,)).copy()
    return {"weight": resolve_weight(params, num_classes), "pos_weight": pos_weight}


def _resolve_focal(params: dict[str, Any], num_classes: int) -> dict[str, Any]:
    return {"weight": resolve_weight(params, num_classes), "alpha": params["alpha"], "gamma": params["gamma"]}


def _counts(num_classes: int) -> list[float]:
    return [float(3 ** (i % 7)) for i in range(num_classes - 1)] + [0.0]


def _bce_examples(num_classes: int) -> list[dict[str, Any]]:
    counts = _counts(num_classes)
    return [
        {},
        {"scheme": "effective_number", "counts": counts, "beta": 0.99, "pos_weight": 2.5},
        {"scheme": "inverse", "counts": counts, "pos_weight": [0.5 + i / 3 for i in range(num_classes)]},
    ]


def _focal_examples(num_classes: int) -> list[dict[str, Any]]:
    return [
        {},
        {"alpha": -1.0, "gamma": 0.0},
        {"alpha": 0.75, "gamma": 0.5, "scheme": "inverse_sqrt", "counts": _counts(num_classes)},
        {"gamma": 1.5, "scheme": "power", "counts": _counts(num_classes), "power": 0.3},
    ]


def _softplus(z: np.ndarray) -> np.ndarray:
    return np.maximum(z, 0.0) + np.log1p(np.exp(-np.abs(z)))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0, e) / (1.0 + e)


def bce_reference(
    logits: np.ndarray,
    targets: np.ndarray,
    grad: np.ndarray | None,
    *,
    weight: np.ndarray,
    pos_weight: np.ndarray | None,
    reduction: str,
) -> LossResult:
    """Float64 reference of ``class_weighted_bce`` (kernel calling convention)."""
    x, y = logits.astype(np.float64), targets.astype(np.float64)
    w = np.asarray(weight, dtype=np.float64)
    pw = np.ones_like(w) if pos_weight is None else np.asarray(pos_weight, dtype=np.float64)
    elementwise = w * (pw * y * _softplus(-x) + (1.0 - y) * _softplus(x))
    gradient = w * ((pw * y + 1.0 - y) * _sigmoid(x) - pw * y) if grad is not None else None
    return reduce_elementwise(elementwise, gradient, y, grad, reduction)


def focal_reference(
    logits: np.ndarray,
    targets: np.ndarray,
    grad: np.ndarray | None,
    *,
    weight: np.ndarray,
    alpha: float,
    gamma: float,
    reduction: str,
) -> LossResult:
    """Float64 reference of ``sigmoid_focal`` (kernel calling convention)."""
    x, y = logits.astype(np.float64), targets.astype(np.float64)
    w = np.asarray(weight, dtype=np.float64)
    p, pm = _sigmoid(x), _sigmoid(-x)
    ce = y * _softplus(-x) + (1.0 - y) * _softplus(x)
    q = p * (1.0 - y) + pm * y
    modulating = q**gamma
    alpha_t = alpha * y + (1.0 - alpha) * (1.0 - y) if alpha >= 0 else np.ones_like(y)
    elementwise = w * alpha_t * ce * modulating
    gradient = None
    if grad is not None:
        ratio = p * pm * (1.0 - 2.0 * y) / np.maximum(q, np.finfo(np.float64).tiny)
        gradient = w * alpha_t * modulating * ((p * (1.0 - y) - pm * y) + gamma * ce * ratio)
    return reduce_elementwise(elementwise, gradient, y, grad, reduction)


# Elements per chunk: each thread works through chunks in its own buffers (a few
# MiB with 64k elements, cache-resident). Smaller chunks make threads trade the GIL
# between numpy calls more often than they compute: on 2 cores, 16k-element chunks
# ran 2.2x slower than 64k ones (bench.losses).
# Smaller inputs get smaller chunks (down to 16k elements), so that the work
# buffers (up to ~16 per thread) stay a small fraction of the input.
CHUNK_ELEMENTS = 1 << 16
MIN_CHUNK_ELEMENTS = 1 << 14
MIN_ELEMENTS_PER_THREAD = 1 << 17
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def num_threads() -> int:
    """Threads the numpy kernels use: ``TRACKER_NUM_THREADS`` or the usable CPUs."""
    raw = os.environ.get("TRACKER_NUM_THREADS", "")
    if raw:
        try:
            return max(1, int(raw))
        except ValueError:
            raise ConfigError(f"TRACKER_NUM_THREADS is {raw!r}; expected a positive integer") from None
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=max(2, num_threads()), thread_name_prefix="tracker-loss")
        return _POOL


def _forget_pool() -> None:
    """A forked child (a data-loader worker) has none of the parent's threads: start afresh."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


class _Work:
    """One thread's work buffers, allocated once and viewed as ``(rows, C)`` per chunk."""

    def __init__(self, rows: int, num_classes: int, dtype: type) -> None:
        self.capacity, self.num_classes, self.dtype = rows, num_classes, dtype
        self.rows = rows
        self._buffers: dict[str, np.ndarray] = {}

    def __call__(self, name: str, dtype: Any = None) -> np.ndarray:
        buffer = self._buffers.get(name)
        if buffer is None:
            buffer = np.empty(self.capacity * self.num_classes, dtype=dtype or self.dtype)
            self._buffers[name] = buffer
        return buffer[: self.rows * self.num_classes].reshape(self.rows, self.num_classes)

    def const(self, value: float) -> np.ndarray:
        """A read-only buffer full of ``value`` (array operands are much faster than scalars)."""
        name = f"const:{value!r}"
        if name not in self._buffers:
            self._buffers[name] = np.full(self.capacity * self.num_classes, value, dtype=self.dtype)
        return self(name)

    def load(self, name: str, chunk: np.ndarray) -> np.ndarray:
        """``chunk`` in the work dtype: itself when it already is, else a converted copy."""
        if chunk.dtype == self.dtype:
            return chunk
        out = self(name)
        np.copyto(out, chunk, casting="unsafe")
        return out


Weights = np.ndarray | None
ChunkFn = Callable[[np.ndarray, np.ndarray, _Work, Weights, Weights], tuple[np.ndarray, np.ndarray | None]]


def _chunks(
    chunk_fn: ChunkFn,
    logits: np.ndarray,
    targets: np.ndarray,
    grad: np.ndarray | None,
    reduction: str,
    weight: np.ndarray,
) -> LossResult:
    """Run ``chunk_fn(x, y, ws, w, wg)`` over row chunks.

    It returns one chunk's loss times ``w`` (None: all ones) and, when ``wg`` is
    not None, its gradient times ``wg`` (the class weight times the reduction's
    scale), both in work buffers.
    """
    if reduction not in REDUCTIONS:
        raise ConfigError(f"reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
    n, c = logits.shape
    out = np.empty((n, c), dtype=np.float32) if reduction == "none" else None
    rows = max(1, min(CHUNK_ELEMENTS, max(MIN_CHUNK_ELEMENTS, n * c // 32)) // c)
    count = -(-n // rows)
    per_class, positives = np.zeros((count, c)), np.zeros((count, c), dtype=np.int64)
    scale = 1.0 / (n * c) if reduction == "mean" and n else 1.0
    dtype = np.float64 if logits.dtype == np.float64 else np.float32
    w = np.asarray(weight, dtype=np.float64)
    wl = None if np.all(w == 1.0) else w.astype(dtype)
    wg = None if grad is None else (w * scale).astype(dtype)

    def work(indices: range) -> None:
        ws = _Work(rows, c, dtype)
        for i in indices:
            a, b = i * rows, min(i * rows + rows, n)
            ws.rows = b - a
            x, y = ws.load("x", logits[a:b]), ws.load("y", targets[a:b])
            loss, gradient = chunk_fn(x, y, ws, wl, wg)
            per_class[i] = np.add.reduce(loss, axis=0)
            positives[i] = np.add.reduce(np.greater(y, 0, out=ws("pos", np.bool_)), axis=0, dtype=np.int64)
            if out is not None:
                out[a:b] = loss
            if grad is not None and gradient is not None:
                np.add(grad[a:b], gradient, out=grad[a:b])

    threads = max(1, min(num_threads(), (n * c) // MIN_ELEMENTS_PER_THREAD, count))
    bounds = np.linspace(0, count, threads + 1).astype(int)
    parts = [range(bounds[k], bounds[k + 1]) for k in range(threads)]
    if threads == 1:
        work(parts[0])
    else:
        list(_pool().map(work, parts))
    total = per_class.sum(axis=0)
    value: Any = out if out is not None else float(total.sum() * scale)
    return LossResult(loss=value, per_class=total, positives=positives.sum(axis=0))


def _softplus_parts(x: np.ndarray, ws: _Work) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(e, r, sp)`` = ``exp(-|x|)``, ``1 / (1 + e)``, ``softplus(x)``, in work buffers.

    ``log1p(e)`` is ``log(u) - ((u - 1) - e) / u`` with ``u = 1 + e``: exact to
    rounding, with the vectorised ``log`` instead of the much slower ``log1p``. The
    division is a product with ``r``, which the sigmoids need anyway.
    """
    e, r, sp, t = ws("e"), ws("u"), ws("sp"), ws("t")
    np.abs(x, out=e)
    np.negative(e, out=e)
    np.exp(e, out=e)
    np.add(e, ws.const(1.0), out=r)
    np.log(r, out=sp)
    np.subtract(r, ws.const(1.0), out=t)
    t -= e
    np.reciprocal(r, out=r)
    t *= r
    sp -= t
    np.maximum(x, ws.const(0.0), out=t)
    sp += t
    return e, r, sp


def _sigmoids(
    x: np.ndarray, e: np.ndarray, r: np.ndarray, ws: _Work, both: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(sigmoid(x), sigmoid(-x) or None)`` from ``e = exp(-|x|)`` and ``r = 1/(1 + e)`` (overwrites ``r``).

    With the step ``s = [x >= 0]``: ``sigmoid(x) = r * max(e, s)`` (``r`` or
    ``e*r``, both exact), ``sigmoid(-x) = r * max(e, 1 - s)``.
    """
    step = np.greater_equal(x, ws.const(0.0), out=ws("step"))
    minus = None
    if both:
        minus = np.subtract(ws.const(1.0), step, out=ws("pm"))
        np.maximum(e, minus, out=minus)
        minus *= r
    np.maximum(e, step, out=step)
    step *= r
    return step, minus


def bce_numpy(
    logits: np.ndarray,
    targets: np.ndarray,
    grad: np.ndarray | None,
    *,
    weight: np.ndarray,
    pos_weight: np.ndarray | None,
    reduction: str,
) -> LossResult:
    """Numpy kernel of ``class_weighted_bce``."""
    dtype = np.float64 if logits.dtype == np.float64 else np.float32
    pw = None if pos_weight is None else np.asarray(pos_weight, dtype=dtype)

    def chunk(x: np.ndarray, y: np.ndarray, ws: _Work, w: Weights, wg: Weights) -> tuple[np.ndarray, np.ndarray | None]:
        e, u, loss = _softplus_parts(x, ws)
        t, k = ws("t"), ws("k")
        if pw is None:
            np.multiply(x, y, out=t)
        else:
            np.multiply(y, np.subtract(pw, 1.0), out=k)
            k += 1.0
            loss *= k
            np.multiply(y, pw, out=ws("pwy"))
            np.multiply(ws("pwy"), x, out=t)
        loss -= t
        if w is not None:
            loss *= w
        if wg is None:
            return loss, None
        p, _ = _sigmoids(x, e, u, ws, both=False)
        if pw is None:
            p -= y
        else:
            p *= k
            p -= ws("pwy")
        p *= wg
        return loss, p

    return _chunks(chunk, logits, targets, grad, reduction, weight)


def _focal_grad(ws: _Work, p: np.ndarray, pm: np.ndarray, y: np.ndarray, gamma: float) -> np.ndarray:
    """Unweighted focal gradient from ``p``, ``pm = 1 - p`` and the buffers ``focal_numpy`` filled."""
    omy, ce, q, g, t = ws("omy"), ws("sp"), ws("q"), ws("g"), ws("t")
    np.multiply(p, omy, out=g)
    np.multiply(pm, y, out=t)
    g -= t
    if gamma != 0.0:
        np.multiply(p, pm, out=t)
        s = np.subtract(omy, y, out=ws("s"))
        t *= s
        np.maximum(q, ws.const(float(np.finfo(q.dtype).tiny)), out=s)
        t /= s
        t *= ce
        t *= gamma
        g += t
    return g


def focal_numpy(
    logits: np.ndarray,
    targets: np.ndarray,
    grad: np.ndarray | None,
    *,
    weight: np.ndarray,
    alpha: float,
    gamma: float,
    reduction: str,
) -> LossResult:
    """Numpy kernel of ``sigmoid_focal``."""
    check_gamma(gamma)

    def chunk(x: np.ndarray, y: np.ndarray, ws: _Work, w: Weights, wg: Weights) -> tuple[np.ndarray, np.ndarray | None]:
        e, u, ce = _softplus_parts(x, ws)
        t, omy, q, m, at, loss = ws("t"), ws("omy"), ws("q"), ws("m"), ws("at"), ws("l")
        np.multiply(x, y, out=t)
        ce -= t
        p, pm = _sigmoids(x, e, u, ws, both=True)
        assert pm is not None
        np.subtract(1.0, y, out=omy)
        np.multiply(p, omy, out=q)
        np.multiply(pm, y, out=t)
        q += t
        if gamma == 2.0:
            np.multiply(q, q, out=m)
        else:
            np.power(q, gamma, out=m)
        np.multiply(ce, m, out=loss)
        if alpha >= 0:
            np.multiply(y, 2.0 * alpha - 1.0, out=at)
            at += 1.0 - alpha
            loss *= at
        if w is not None:
            loss *= w
        if wg is None:
            return loss, None
        g = _focal_grad(ws, p, pm, y, gamma)
        g *= m
        if alpha >= 0:
            g *= at
        g *= wg
        return loss, g

    return _chunks(chunk, logits, targets, grad, reduction, weight)


def _torch_missing() -> str | None:
    return None if importlib.util.find_spec("torch") else "torch is not installed: pip install torch"


def _bce_torch(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **params: Any) -> LossResult:
    from tracker.torch import bce_kernel

    return bce_kernel(logits, targets, grad, **params)


def _focal_torch(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, **params: Any) -> LossResult:
    from tracker.torch import focal_kernel

    return focal_kernel(logits, targets, grad, **params)


NUMPY_DTYPES = ("float16", "bfloat16", "float32", "float64")
TORCH_DTYPES = ("float16", "bfloat16", "float32", "float64")

TERMS: tuple[LossTerm, ...] = (
    LossTerm(
        name="class_weighted_bce",
        reference=bce_reference,
        params=(*WEIGHT_PARAMS, Param("pos_weight", "float_or_vector", minimum=0.0, doc="per-class positive weight")),
        resolve=_resolve_bce,
        examples=_bce_examples,
        description="binary cross-entropy with logits, per-class weights and pos_weight",
    ),
    LossTerm(
        name="sigmoid_focal",
        reference=focal_reference,
        params=(
            *WEIGHT_PARAMS,
            Param("alpha", "float", 0.25, minimum=-1.0, maximum=1.0, doc="positive-class balance; < 0 disables"),
            Param("gamma", "float", 2.0, minimum=0.0, maximum=100.0, doc="focusing exponent, >= 0"),
        ),
        resolve=_resolve_focal,
        examples=_focal_examples,
        description="sigmoid focal loss (torchvision semantics) with per-class weights",
    ),
)


@hookimpl
def tracker_register_losses(register: Any) -> None:
    """Register ``class_weighted_bce`` and ``sigmoid_focal``."""
    for term in TERMS:
        register(term)


@hookimpl
def tracker_register_kernels(register: Any) -> None:
    """Register the numpy kernels, and the torch kernels when torch is installed."""
    register(Kernel("class_weighted_bce", "numpy", bce_numpy, NUMPY_DTYPES))
    register(Kernel("sigmoid_focal", "numpy", focal_numpy, NUMPY_DTYPES))
    if _torch_missing() is None:
        register(Kernel("class_weighted_bce", "torch", _bce_torch, TORCH_DTYPES, _torch_missing))
        register(Kernel("sigmoid_focal", "torch", _focal_torch, TORCH_DTYPES, _torch_missing))
