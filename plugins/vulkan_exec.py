"""Vulkan execution backend: the loss kernels of :mod:`gpu.kernels` as backend ``vulkan``.

Rules:

* Registers ``class_weighted_bce/vulkan`` and ``sigmoid_focal/vulkan`` (logits
  float16 or float32) only when a Vulkan device can be used; otherwise it
  registers nothing and ``tracker_plugin_status()`` says why, naming the Debian
  package to install (``tracker plugins`` shows it).
* One device per process, created on the first kernel call (device choice and
  validation from ``TRACKER_VULKAN_DEVICE`` / ``TRACKER_VULKAN_VALIDATION``) and
  closed at exit.
* Kernels follow the kernel contract of :mod:`tracker.losses`: they ADD the
  gradient into ``grad``, reject unknown keyword parameters, and return a
  :class:`~tracker.losses.LossResult` (total / (N*C) for ``mean``).
* ``log_pool_stats(run, step)`` logs the device memory pool's figures under
  ``gpu/pool/*`` (``gpu/pool/staging/*`` too where staging memory has its own pool).
"""

from __future__ import annotations

import threading
from typing import Any

import click
import numpy as np

from tracker import hookimpl
from tracker.errors import ConfigError, PluginError

BACKEND = "vulkan"
DTYPES: tuple[str, ...] = ("float16", "float32")
POOL_PREFIX = "gpu/pool"
# backend="auto" sends smaller inputs to numpy: a dispatch costs ~2.6 ms on lavapipe, more
# than numpy needs for a quarter-million elements. Ask for backend="vulkan" to force it.
AUTO_MIN_ELEMENTS = 1 << 18

_lock = threading.Lock()
_shared: dict[str, Any] = {}


def unavailable() -> str | None:
    """None when a Vulkan device can run the kernels here, else a one-line reason."""
    try:
        import gpu
    except ImportError as exc:  # pragma: no cover - gpu/ ships with the project
        return f"the gpu package cannot be imported: {exc}"
    ok, why = gpu.available()
    return None if ok else why


def kernels() -> Any:
    """The process-wide :class:`gpu.kernels.LossKernels` (device created on first use)."""
    with _lock:
        if "kernels" not in _shared:
            import gpu
            from gpu.kernels import LossKernels

            try:
                device = gpu.Device()
                _shared["kernels"] = LossKernels(device)
            except gpu.GpuError as exc:
                raise PluginError(f"vulkan backend: {exc}") from None
            _shared["device"] = device
        return _shared["kernels"]


def device() -> Any:
    """The process-wide :class:`gpu.Device` the kernels run on."""
    kernels()
    return _shared["device"]


def close() -> None:
    """Close the process-wide device (the next kernel call opens a new one)."""
    with _lock:
        loss_kernels = _shared.pop("kernels", None)
        dev = _shared.pop("device", None)
    if loss_kernels is not None:
        loss_kernels.close()
    if dev is not None:
        dev.close()


def _run(loss: str, logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None,
         reduction: str, **params: Any) -> Any:
    from gpu import GpuError
    from tracker.losses import REDUCTIONS, LossResult

    if reduction not in REDUCTIONS:
        raise ConfigError(f"reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
    try:
        out = kernels().run(loss, logits, targets, grad, reduction=reduction, **params)
    except GpuError as exc:
        raise PluginError(f"vulkan {loss} kernel: {exc}") from None
    n, c = logits.shape
    if reduction == "none":
        value: Any = out.elementwise if out.elementwise is not None else np.zeros((n, c), np.float32)
    elif reduction == "mean":
        value = out.total / (n * c) if n * c else 0.0
    else:
        value = out.total
    return LossResult(loss=value, per_class=out.per_class, positives=out.positives)


def bce_vulkan(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, *,
               weight: np.ndarray, pos_weight: np.ndarray | None, reduction: str) -> Any:
    """``class_weighted_bce`` on the Vulkan device (kernel calling convention)."""
    return _run("bce", logits, targets, grad, reduction, weight=weight, pos_weight=pos_weight)


def focal_vulkan(logits: np.ndarray, targets: np.ndarray, grad: np.ndarray | None, *,
                 weight: np.ndarray, alpha: float, gamma: float, reduction: str) -> Any:
    """``sigmoid_focal`` on the Vulkan device (kernel calling convention)."""
    return _run("focal", logits, targets, grad, reduction, weight=weight, alpha=alpha, gamma=gamma)


def pool_stats(dev: Any = None) -> dict[str, float]:
    """The device's pool figures as ``gpu/pool/<stat>`` keys (``gpu/pool/staging/<stat>`` too)."""
    dev = dev if dev is not None else device()
    values = {f"{POOL_PREFIX}/{k}": float(v) for k, v in dev.pools["device"].stats().as_dict().items()}
    if dev.pools["host"] is not dev.pools["device"]:
        values.update({f"{POOL_PREFIX}/staging/{k}": float(v)
                       for k, v in dev.pools["host"].stats().as_dict().items()})
    return values


def log_pool_stats(run: Any, step: int | None = None, dev: Any = None) -> dict[str, float]:
    """Log the pool figures into ``run`` (``run.log({...}, step=step)``) and return them."""
    values = pool_stats(dev)
    run.log(values, step=step)
    return values


@hookimpl
def tracker_register_kernels(register: Any) -> None:
    """Register the Vulkan kernels, or nothing when no Vulkan device can be used."""
    from tracker.losses import Kernel

    if unavailable() is not None:
        return
    register(Kernel("class_weighted_bce", BACKEND, bce_vulkan, DTYPES, unavailable,
                    "Vulkan compute (gpu.kernels), float32 accumulation", AUTO_MIN_ELEMENTS))
    register(Kernel("sigmoid_focal", BACKEND, focal_vulkan, DTYPES, unavailable,
                    "Vulkan compute (gpu.kernels), float32 accumulation", AUTO_MIN_ELEMENTS))


@hookimpl
def tracker_plugin_status() -> str | None:
    """None when Vulkan works here, else why (naming the package to install)."""
    return unavailable()


@hookimpl
def tracker_register_commands(cli: click.Group) -> None:
    """Add ``tracker gpu devices``: the Vulkan devices and which one the kernels use."""
    from tracker.cli import friendly

    @cli.group("gpu")
    def gpu_group() -> None:
        """Vulkan devices used by the vulkan loss backend."""

    @gpu_group.command("devices")
    @friendly
    def devices() -> None:
        """List the Vulkan devices and mark the one TRACKER_VULKAN_DEVICE selects."""
        import os

        import gpu
        from gpu.device import ENV_DEVICE, choose

        try:
            infos = gpu.list_devices()
            chosen = choose(infos, os.environ.get(ENV_DEVICE)).index
        except gpu.GpuError as exc:
            raise PluginError(str(exc)) from None
        for info in infos:
            mark = "*" if info.index == chosen else " "
            click.echo(f"{mark} {info.index}: {info.name} ({info.type}, Vulkan {info.api_version}, "
                       f"subgroup {info.subgroup_size})")
