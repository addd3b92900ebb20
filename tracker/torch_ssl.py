"""Self-supervised losses in PyTorch: ``nn.Module`` losses and the torch kernels of the pair terms.

Importing this module imports torch. The formulas are those of
:mod:`plugins.ssl_losses` (the float64 references the conformance checks hold
these kernels to):

* :class:`NTXentLoss`, :class:`NegativeCosineLoss`, :class:`VICRegLoss`,
  :class:`BarlowTwinsLoss` and :class:`DINOLoss` take two ``(N, D)`` tensors and
  return the ``mean`` loss (the paper's). They compute in float32 (float64 for
  float64 inputs) whatever the input dtype, also under ``torch.autocast``; the
  gradient flows back in the inputs' dtype. After each forward,
  ``last_components`` holds the detached components (``per_class`` of the term,
  divided by N: they add up to the loss) for ``run.log``.
* :class:`NegativeCosineLoss` detaches the target unless ``stop_gradient="none"``;
  :class:`DINOLoss` always detaches the teacher, and keeps the centre as an EMA of
  the teacher's batch means (``center_momentum``), updated after each forward.
* :func:`pair_kernel` follows the pair kernel convention of :mod:`tracker.pairterms`
  on numpy arrays; ``plugins.ssl_losses`` registers it as the ``torch`` backend.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tracker.errors import ConfigError
from tracker.losses import LossResult

NORM_EPS = 1e-12
Terms = tuple[torch.Tensor, torch.Tensor | None]  # (components summed over samples, per-sample loss or None)


def nt_xent(a: torch.Tensor, b: torch.Tensor, *, temperature: float) -> Terms:
    """NT-Xent components (alignment, uniformity) summed over samples, and the per-sample loss."""
    n = a.shape[0]
    h = F.normalize(torch.cat([a, b]), dim=1, eps=NORM_EPS)
    s = h @ h.T / temperature
    eye = torch.eye(2 * n, dtype=torch.bool, device=s.device)
    s = s.masked_fill(eye, float("-inf"))
    pos = (torch.arange(2 * n, device=s.device) + n) % (2 * n)
    lse = torch.logsumexp(s, dim=1)
    spos = s[torch.arange(2 * n, device=s.device), pos]
    per_anchor = lse - spos
    return torch.stack([-spos.sum() / 2, lse.sum() / 2]), (per_anchor[:n] + per_anchor[n:]) / 2


def negative_cosine(a: torch.Tensor, b: torch.Tensor, *, stop_gradient: str) -> Terms:
    """Negative cosine similarity summed over samples, and per sample (target detached unless 'none')."""
    target = b.detach() if stop_gradient == "target" else b
    cos = (F.normalize(a, dim=1, eps=NORM_EPS) * F.normalize(target, dim=1, eps=NORM_EPS)).sum(dim=1)
    return (-cos.sum()).reshape(1), -cos


def _off_diagonal_sq(c: torch.Tensor) -> torch.Tensor:
    return (c * c).sum() - torch.diagonal(c).pow(2).sum()


def _vicreg_branch(x: torch.Tensor, gamma: float, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    n, d = x.shape
    denom = max(n - 1, 1)
    xc = x - x.mean(dim=0)
    std = torch.sqrt((xc * xc).sum(dim=0) / denom + eps)
    cov = xc.T @ xc / denom
    return torch.relu(gamma - std).mean() / 2, _off_diagonal_sq(cov) / d


def vicreg(
    a: torch.Tensor, b: torch.Tensor, *, lambd: float, mu: float, nu: float, gamma: float, eps: float
) -> Terms:
    """VICReg components (invariance, variance, covariance), times N (the ``sum`` loss)."""
    n = a.shape[0]
    inv = F.mse_loss(a, b, reduction="mean")
    va, ca = _vicreg_branch(a, gamma, eps)
    vb, cb = _vicreg_branch(b, gamma, eps)
    return n * torch.stack([lambd * inv, mu * (va + vb), nu * (ca + cb)]), None


def _standardize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Batch standardisation (biased variance), as ``BatchNorm1d(affine=False)`` in training."""
    xc = x - x.mean(dim=0)
    return xc / torch.sqrt((xc * xc).mean(dim=0) + eps)


def barlow_twins(a: torch.Tensor, b: torch.Tensor, *, lambd: float, eps: float) -> Terms:
    """Barlow Twins components (on-diagonal, off-diagonal), times N (the ``sum`` loss)."""
    n = a.shape[0]
    za, zb = _standardize(a, eps), _standardize(b, eps)
    c = za.T @ zb / n
    on = (1 - torch.diagonal(c)).pow(2).sum()
    return n * torch.stack([on, lambd * _off_diagonal_sq(c)]), None


def dino(
    a: torch.Tensor, b: torch.Tensor, *, student_temperature: float, teacher_temperature: float,
    center: torch.Tensor | np.ndarray,
) -> Terms:
    """DINO components (teacher entropy, KL) summed over samples, and the per-sample cross-entropy."""
    c = torch.as_tensor(center, dtype=a.dtype, device=a.device)
    log_pt = F.log_softmax((b.detach() - c) / teacher_temperature, dim=1)
    pt = log_pt.exp()
    cross = -(pt * F.log_softmax(a / student_temperature, dim=1)).sum(dim=1)
    entropy = -(pt * log_pt).sum(dim=1)
    return torch.stack([entropy.sum(), (cross - entropy).sum()]), cross


FUNCTIONS: dict[str, Callable[..., Terms]] = {
    "nt_xent": nt_xent, "negative_cosine": negative_cosine, "vicreg": vicreg, "barlow_twins": barlow_twins,
    "dino": dino,
}


def _from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16).to(dtype)
    return torch.from_numpy(array).to(dtype)


def pair_kernel(term: str, a: np.ndarray, b: np.ndarray, grad: Any, *, reduction: str, **params: Any) -> LossResult:
    """Torch kernel of pair term ``term`` (pair kernel convention of :mod:`tracker.pairterms`)."""
    fn = FUNCTIONS[term]
    n, k = a.shape[0], {"vicreg": 3, "negative_cosine": 1}.get(term, 2)
    if reduction not in ("mean", "sum", "none") or (reduction == "none" and term in ("vicreg", "barlow_twins")):
        raise ConfigError(f"reduction {reduction!r} is not supported by {term!r}")
    if n == 0:
        fn(torch.zeros(2, a.shape[1]), torch.zeros(2, a.shape[1]), **params)  # unknown keywords still raise
        loss: Any = np.zeros(0, dtype=np.float32) if reduction == "none" else 0.0
        return LossResult(loss=loss, per_class=np.zeros(k), positives=np.zeros(k, dtype=np.int64))
    dtype = torch.float64 if a.dtype == np.float64 else torch.float32
    wants = (False, False) if grad is None else (grad[0] is not None, grad[1] is not None)
    x = _from_numpy(a, dtype).requires_grad_(wants[0])
    y = _from_numpy(b, dtype).requires_grad_(wants[1])
    with torch.enable_grad():
        components, per_sample = fn(x, y, **params)
        scale = 1.0 / n if reduction == "mean" else 1.0
        inputs = [t for t, w in zip((x, y), wants) if w]
        if inputs:
            found = torch.autograd.grad(components.sum() * scale, inputs, allow_unused=True)
            for buffer, g in zip([gb for gb, w in zip(grad, wants) if w], found):
                if g is not None:
                    torch.from_numpy(buffer).add_(g.to(torch.float64 if buffer.dtype == np.float64 else torch.float32))
    comps = components.detach().to(torch.float64).numpy()
    if reduction == "none":
        value: Any = per_sample.detach().to(torch.float32).numpy()
    else:
        value = float(comps.sum() * scale)
    return LossResult(loss=value, per_class=comps, positives=np.full(k, n, dtype=np.int64))


class _PairLoss(nn.Module):
    """Shared plumbing: float32 computation outside autocast, components kept."""

    def __init__(self) -> None:
        super().__init__()
        self.last_components: torch.Tensor | None = None

    def _compute(self, fn: Callable[..., Terms], a: torch.Tensor, b: torch.Tensor, **params: Any) -> torch.Tensor:
        if a.shape != b.shape or a.ndim != 2:
            raise ConfigError(f"inputs of shapes {tuple(a.shape)} and {tuple(b.shape)}; expected two (N, D) tensors")
        n = a.shape[0]
        if n == 0:
            raise ConfigError("inputs are empty (N = 0); a self-supervised loss needs a batch")
        with torch.autocast(device_type=a.device.type, enabled=False):
            dtype = torch.float64 if a.dtype == torch.float64 else torch.float32
            components, _ = fn(a.to(dtype), b.to(dtype), **params)
        self.last_components = components.detach() / n
        return components.sum() / n


class NTXentLoss(_PairLoss):
    """SimCLR's NT-Xent over two views ``(z1, z2)``; components alignment, uniformity."""

    def __init__(self, temperature: float = 0.5) -> None:
        super().__init__()
        if not temperature > 0:
            raise ConfigError(f"temperature is {temperature!r}; expected a number > 0")
        self.temperature = float(temperature)

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        """The mean loss over the 2N anchors."""
        return self._compute(nt_xent, z1, z2, temperature=self.temperature)


class NegativeCosineLoss(_PairLoss):
    """BYOL/SimSiam's ``-cos(p, z)``, the target ``z`` detached unless ``stop_gradient="none"``."""

    def __init__(self, stop_gradient: str = "target") -> None:
        super().__init__()
        if stop_gradient not in ("target", "none"):
            raise ConfigError(f"stop_gradient is {stop_gradient!r}; expected 'target' or 'none'")
        self.stop_gradient = stop_gradient

    def forward(self, p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The mean negative cosine similarity."""
        return self._compute(negative_cosine, p, z, stop_gradient=self.stop_gradient)


class VICRegLoss(_PairLoss):
    """VICReg with weights ``lambd``, ``mu``, ``nu`` (25, 25, 1) and target std ``gamma``."""

    def __init__(self, lambd: float = 25.0, mu: float = 25.0, nu: float = 1.0, gamma: float = 1.0,
                 eps: float = 1e-4) -> None:
        super().__init__()
        self.params = {"lambd": float(lambd), "mu": float(mu), "nu": float(nu), "gamma": float(gamma),
                       "eps": float(eps)}

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        """The batch loss."""
        return self._compute(vicreg, z1, z2, **self.params)


class BarlowTwinsLoss(_PairLoss):
    """Barlow Twins with off-diagonal weight ``lambd`` (5.1e-3)."""

    def __init__(self, lambd: float = 5.1e-3, eps: float = 1e-5) -> None:
        super().__init__()
        self.lambd, self.eps = float(lambd), float(eps)

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        """The batch loss."""
        return self._compute(barlow_twins, z1, z2, lambd=self.lambd, eps=self.eps)


class DINOLoss(_PairLoss):
    """DINO's loss of student against (detached) teacher logits, with an EMA centre."""

    center: torch.Tensor

    def __init__(self, out_dim: int, student_temperature: float = 0.1, teacher_temperature: float = 0.04,
                 center_momentum: float = 0.9) -> None:
        super().__init__()
        if not 0.0 <= center_momentum <= 1.0:
            raise ConfigError(f"center_momentum is {center_momentum!r}; expected a number in [0, 1]")
        self.student_temperature, self.teacher_temperature = float(student_temperature), float(teacher_temperature)
        self.center_momentum = float(center_momentum)
        self.register_buffer("center", torch.zeros(out_dim))

    def forward(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy; then the centre moves towards the teacher's batch mean."""
        loss = self._compute(dino, student, teacher, student_temperature=self.student_temperature,
                             teacher_temperature=self.teacher_temperature, center=self.center.float())
        with torch.no_grad():
            batch = teacher.detach().float().mean(dim=0)
            self.center.mul_(self.center_momentum).add_(batch.to(self.center), alpha=1 - self.center_momentum)
        return loss
