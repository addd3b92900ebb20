"""Built-in plugin: self-supervised loss terms, with float64 references and torch kernels.

Pair terms (:mod:`tracker.pairterms`): ``a`` and ``b`` are ``(N, D)`` arrays; every
formula below is the ``mean`` reduction (the paper's loss); ``sum`` is ``N`` times
it. ``u = z / max(|z|, 1e-12)`` row-wise (``torch.nn.functional.normalize``).

``nt_xent`` (SimCLR, InfoNCE; inputs ``views``)
    ``h = [u(a); u(b)]`` (2N rows), ``s = h h^T / temperature`` without its
    diagonal; anchor ``i``'s positive is its other view. ``l_i = logsumexp_k s_ik -
    s_i,pos(i)``, loss = mean over the 2N anchors; per sample ``(l_i + l_i+N) / 2``.
    Components: ``alignment`` (the ``-s_pos`` part) and ``uniformity`` (the
    ``logsumexp`` part).
``negative_cosine`` (BYOL, SimSiam; inputs ``views``: predictor output, target)
    ``l_i = -cos(a_i, b_i)``. ``stop_gradient="target"`` (default) treats ``b`` as a
    constant, as both methods do; ``"none"`` lets the gradient into ``b`` (the
    ablation of SimSiam's Fig. 2 that collapses). SimSiam's symmetric loss is
    ``(D(p1, z2) + D(p2, z1)) / 2``: two calls.
``vicreg`` (inputs ``views``; the official implementation)
    ``lambd * mse(a, b) + mu * (mean_j relu(gamma - std_j(a)) + mean_j relu(gamma -
    std_j(b))) / 2 + nu * (sum_offdiag cov(a)^2 + sum_offdiag cov(b)^2) / D`` with
    ``std = sqrt(var + eps)``, unbiased variance and covariance (denominator
    ``max(N - 1, 1)``, so one sample gives a finite loss). Components
    ``invariance``, ``variance``, ``covariance``. Batch-level: no ``none``.
``barlow_twins`` (inputs ``views``)
    ``c = bn(a)^T bn(b) / N`` with ``bn`` the batch standardisation (biased variance,
    ``eps``); loss ``sum_j (1 - c_jj)^2 + lambd * sum_{j!=k} c_jk^2``. Components
    ``on_diagonal``, ``off_diagonal``. Batch-level: no ``none``.
``dino`` (inputs ``student_teacher``)
    ``l_i = -sum_k softmax((t_i - center) / teacher_temperature)_k *
    log_softmax(s_i / student_temperature)_k``; the teacher is a constant (DINO's
    stop-gradient). Components ``teacher_entropy`` and ``kl`` (they add up to the
    cross-entropy: DINO's paper watches both, since collapse drives one to 0).
    ``center`` is a ``(K,)`` vector the caller keeps (the module
    :class:`tracker.torch_ssl.DINOLoss` keeps it as an EMA of teacher outputs).

The torch kernels (``tracker.torch_ssl``) compute in float32 (float64 for float64
inputs) with autograd and are held to these references by the conformance checks.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

from tracker import hookimpl
from tracker.errors import ConfigError
from tracker.losses import Kernel, LossResult, LossTerm, Param
from tracker.pairterms import empty_result, pair_result

NORM_EPS = 1e-12
TORCH_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _normalize(z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``z`` over ``max(|z|, eps)``; the clamped norms and where the norm was not clamped."""
    norm = np.sqrt(np.einsum("ij,ij->i", z, z))[:, None]
    clamped = np.maximum(norm, NORM_EPS)
    return z / clamped, clamped, norm >= NORM_EPS


def _normalize_back(g: np.ndarray, u: np.ndarray, norm: np.ndarray, live: np.ndarray) -> np.ndarray:
    """dL/dz from dL/du through ``u = z / max(|z|, eps)``."""
    dot = np.einsum("ij,ij->i", u, g)[:, None]
    return np.where(live, (g - u * dot) / norm, g / norm)


def _logsumexp(s: np.ndarray) -> np.ndarray:
    top = s.max(axis=1, keepdims=True)
    return (top + np.log(np.exp(s - top).sum(axis=1, keepdims=True)))[:, 0]


def _f64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.float64) for x in arrays]


def _wants(grad: Any) -> tuple[bool, bool]:
    if grad is None:
        return False, False
    return grad[0] is not None, grad[1] is not None


def nt_xent_reference(
    a: np.ndarray, b: np.ndarray, grad: Any, *, temperature: float, reduction: str
) -> LossResult:
    """Float64 reference of ``nt_xent`` (pair kernel convention)."""
    n = a.shape[0]
    if n == 0:
        return empty_result(2, reduction)
    h = np.concatenate(_f64(a, b))
    u, norm, live = _normalize(h)
    s = u @ u.T / temperature
    np.fill_diagonal(s, -np.inf)
    pos = (np.arange(2 * n) + n) % (2 * n)
    lse = _logsumexp(s)
    spos = s[np.arange(2 * n), pos]
    per_anchor = lse - spos
    components = np.array([-spos.sum() / 2, lse.sum() / 2])
    gradients: tuple[np.ndarray | None, np.ndarray | None] = (None, None)
    if any(_wants(grad)):
        p = np.exp(s - lse[:, None])
        p[np.arange(2 * n), pos] -= 1.0
        g = p / 2
        du = (g + g.T) @ u / temperature
        dh = _normalize_back(du, u, norm, live)
        gradients = (dh[:n], dh[n:])
    per_sample = (per_anchor[:n] + per_anchor[n:]) / 2
    return pair_result(components, per_sample, n, reduction, grad, gradients)


def negative_cosine_reference(
    a: np.ndarray, b: np.ndarray, grad: Any, *, stop_gradient: str, reduction: str
) -> LossResult:
    """Float64 reference of ``negative_cosine`` (pair kernel convention)."""
    n = a.shape[0]
    if n == 0:
        return empty_result(1, reduction)
    p, z = _f64(a, b)
    up, np_, lp = _normalize(p)
    uz, nz, lz = _normalize(z)
    cos = np.einsum("ij,ij->i", up, uz)
    want_a, want_b = _wants(grad)
    ga = _normalize_back(-uz, up, np_, lp) if want_a else None
    gb = _normalize_back(-up, uz, nz, lz) if want_b and stop_gradient == "none" else None
    return pair_result(np.array([-cos.sum()]), -cos, n, reduction, grad, (ga, gb))


def _off_diagonal_sq(c: np.ndarray) -> float:
    return float((c * c).sum() - (np.diagonal(c) ** 2).sum())


def _vicreg_branch(
    x: np.ndarray, gamma: float, eps: float, want: bool
) -> tuple[float, float, np.ndarray | None, np.ndarray | None]:
    """One branch's variance and covariance parts (before weights) and their gradients."""
    n, d = x.shape
    denom = max(n - 1, 1)
    xc = x - x.mean(axis=0)
    std = np.sqrt((xc * xc).sum(axis=0) / denom + eps)
    hinge = np.maximum(gamma - std, 0.0)
    cov = xc.T @ xc / denom
    var_part = float(hinge.mean() / 2)
    cov_part = _off_diagonal_sq(cov) / d
    if not want:
        return var_part, cov_part, None, None
    active = (gamma - std > 0).astype(np.float64)
    g_var = -(active / (2 * d)) * xc / (denom * std)
    off = cov - np.diag(np.diagonal(cov))
    g_cov = 2 * xc @ (2 * off / d) / denom
    return var_part, cov_part, g_var, g_cov


def vicreg_reference(
    a: np.ndarray, b: np.ndarray, grad: Any, *, lambd: float, mu: float, nu: float, gamma: float, eps: float,
    reduction: str,
) -> LossResult:
    """Float64 reference of ``vicreg`` (pair kernel convention)."""
    n, d = a.shape
    if n == 0:
        return empty_result(3, reduction)
    x, y = _f64(a, b)
    diff = x - y
    inv = float((diff * diff).sum() / (n * d))
    want_a, want_b = _wants(grad)
    vx, cx, gvx, gcx = _vicreg_branch(x, gamma, eps, want_a)
    vy, cy, gvy, gcy = _vicreg_branch(y, gamma, eps, want_b)
    components = n * np.array([lambd * inv, mu * (vx + vy), nu * (cx + cy)])
    g_inv = lambd * 2 * diff / (n * d)
    ga = n * (g_inv + mu * gvx + nu * gcx) if want_a else None
    gb = n * (-g_inv + mu * gvy + nu * gcy) if want_b else None
    return pair_result(components, None, n, reduction, grad, (ga, gb))


def _standardize(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    xc = x - x.mean(axis=0)
    s = np.sqrt((xc * xc).mean(axis=0) + eps)
    return xc / s, s


def _standardize_back(g: np.ndarray, z: np.ndarray, s: np.ndarray) -> np.ndarray:
    return (g - g.mean(axis=0) - z * (g * z).mean(axis=0)) / s


def barlow_twins_reference(
    a: np.ndarray, b: np.ndarray, grad: Any, *, lambd: float, eps: float, reduction: str
) -> LossResult:
    """Float64 reference of ``barlow_twins`` (pair kernel convention)."""
    n = a.shape[0]
    if n == 0:
        return empty_result(2, reduction)
    za, sa = _standardize(np.asarray(a, dtype=np.float64), eps)
    zb, sb = _standardize(np.asarray(b, dtype=np.float64), eps)
    c = za.T @ zb / n
    diag = np.diagonal(c)
    on = float(((1 - diag) ** 2).sum())
    off = _off_diagonal_sq(c)
    want_a, want_b = _wants(grad)
    g = 2 * lambd * c
    np.fill_diagonal(g, -2 * (1 - diag))
    ga = n * _standardize_back(zb @ g.T / n, za, sa) if want_a else None
    gb = n * _standardize_back(za @ g / n, zb, sb) if want_b else None
    return pair_result(n * np.array([on, lambd * off]), None, n, reduction, grad, (ga, gb))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    return x - _logsumexp(x)[:, None]


def dino_reference(
    a: np.ndarray, b: np.ndarray, grad: Any, *, student_temperature: float, teacher_temperature: float,
    center: np.ndarray, reduction: str,
) -> LossResult:
    """Float64 reference of ``dino`` (pair kernel convention; ``b`` is the teacher)."""
    n = a.shape[0]
    if n == 0:
        return empty_result(2, reduction)
    s, t = _f64(a, b)
    log_pt = _log_softmax((t - np.asarray(center, dtype=np.float64)) / teacher_temperature)
    pt = np.exp(log_pt)
    log_ps = _log_softmax(s / student_temperature)
    cross = -(pt * log_ps).sum(axis=1)
    entropy = -(pt * log_pt).sum(axis=1)
    want_a, _ = _wants(grad)
    ga = (np.exp(log_ps) - pt) / student_temperature if want_a else None
    return pair_result(np.array([entropy.sum(), (cross - entropy).sum()]), cross, n, reduction, grad, (ga, None))


def _resolve_dino(params: dict[str, Any], num_classes: int) -> dict[str, Any]:
    center = params["center"]
    if center is None:
        center = np.zeros(num_classes)
    elif len(center) != num_classes:
        raise ConfigError(f"center has {len(center)} entries; expected {num_classes} (one per output dimension)")
    return {**{k: v for k, v in params.items() if k != "center"}, "center": np.asarray(center, dtype=np.float64)}


def _torch_missing() -> str | None:
    return None if importlib.util.find_spec("torch") else "torch is not installed: pip install torch"


def _torch_kernel(term: str) -> Any:
    def fn(a: np.ndarray, b: np.ndarray, grad: Any, **params: Any) -> LossResult:
        from tracker.torch_ssl import pair_kernel

        return pair_kernel(term, a, b, grad, **params)

    fn.__name__ = f"{term}_torch"
    return fn


_POSITIVE = 1e-3
TERMS: tuple[LossTerm, ...] = (
    LossTerm(
        name="nt_xent", reference=nt_xent_reference, inputs="views", components=("alignment", "uniformity"),
        params=(Param("temperature", "float", 0.5, minimum=_POSITIVE, maximum=100.0, doc="softmax temperature"),),
        examples=lambda d: [{}, {"temperature": 0.07}, {"temperature": 2.0}],
        description="SimCLR's NT-Xent (InfoNCE over two views, the other samples as negatives)",
    ),
    LossTerm(
        name="negative_cosine", reference=negative_cosine_reference, inputs="views", components=("negative_cosine",),
        params=(Param("stop_gradient", "str", "target", ("target", "none"),
                      doc="target: the second input is a constant (SimSiam, BYOL); none: gradients flow into it"),),
        examples=lambda d: [{}, {"stop_gradient": "none"}],
        stops_gradient=lambda r: r["stop_gradient"] == "target",
        description="BYOL/SimSiam negative cosine similarity of predictor output and target",
    ),
    LossTerm(
        name="vicreg", reference=vicreg_reference, inputs="views", reductions=("mean", "sum"),
        components=("invariance", "variance", "covariance"),
        params=(
            Param("lambd", "float", 25.0, minimum=0.0, maximum=1e6, doc="lambda: weight of the invariance (MSE) term"),
            Param("mu", "float", 25.0, minimum=0.0, maximum=1e6, doc="mu: weight of the variance (hinge on std) term"),
            Param("nu", "float", 1.0, minimum=0.0, maximum=1e6, doc="nu: weight of the covariance term"),
            Param("gamma", "float", 1.0, minimum=0.0, maximum=1e6, doc="gamma: target std of every dimension"),
            Param("eps", "float", 1e-4, minimum=1e-12, maximum=1.0, doc="added to the variance under the sqrt"),
        ),
        examples=lambda d: [{}, {"lambd": 1.0, "mu": 5.0, "nu": 0.5, "gamma": 0.5}, {"gamma": 4.0, "eps": 1e-2}],
        description="VICReg: invariance, variance and covariance terms",
    ),
    LossTerm(
        name="barlow_twins", reference=barlow_twins_reference, inputs="views", reductions=("mean", "sum"),
        components=("on_diagonal", "off_diagonal"),
        params=(
            Param("lambd", "float", 5.1e-3, minimum=0.0, maximum=1e6, doc="lambda: weight of the off-diagonal term"),
            Param("eps", "float", 1e-5, minimum=1e-12, maximum=1.0, doc="added to the batch variance"),
        ),
        examples=lambda d: [{}, {"lambd": 0.5}, {"lambd": 0.0, "eps": 1e-2}],
        description="Barlow Twins: the cross-correlation of the standardised views towards the identity",
    ),
    LossTerm(
        name="dino", reference=dino_reference, inputs="student_teacher", components=("teacher_entropy", "kl"),
        params=(
            Param("student_temperature", "float", 0.1, minimum=_POSITIVE, maximum=100.0,
                  doc="student softmax temperature"),
            Param("teacher_temperature", "float", 0.04, minimum=_POSITIVE, maximum=100.0, doc="teacher temperature"),
            Param("center", "vector", doc="(K,) centre subtracted from the teacher logits (default zeros)"),
        ),
        resolve=_resolve_dino,
        examples=lambda k: [{}, {"student_temperature": 0.5, "teacher_temperature": 0.07,
                                 "center": [0.3 * (i % 3) - 0.2 for i in range(k)]}],
        stops_gradient=lambda r: True,
        description="DINO: cross-entropy of the centred, sharpened teacher and the student",
    ),
)


@hookimpl
def tracker_register_losses(register: Any) -> None:
    """Register ``nt_xent``, ``negative_cosine``, ``vicreg``, ``barlow_twins`` and ``dino``."""
    for term in TERMS:
        register(term)


@hookimpl
def tracker_register_kernels(register: Any) -> None:
    """Register the torch kernels when torch is installed."""
    if _torch_missing() is None:
        for term in TERMS:
            register(Kernel(term.name, "torch", _torch_kernel(term.name), TORCH_DTYPES, _torch_missing))
