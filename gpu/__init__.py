"""gpu: a small Vulkan compute library (it knows nothing of the tracker).

Three nouns and a verb::

    import gpu
    ok, why = gpu.available()
    with gpu.Device() as dev:
        with gpu.Buffer(dev, 4096) as out, gpu.Compute(dev, "echo_push") as pipe:
            gpu.dispatch(pipe, 1, {0: out}, push={...})

Device choice: ``TRACKER_VULKAN_DEVICE`` (index or name substring); validation:
``TRACKER_VULKAN_VALIDATION=1`` (messages on the ``gpu.validation`` logger).
Submodules load lazily, so ``import gpu`` works without a Vulkan loader.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from gpu.errors import ClosedError, DeviceLost, GpuError, LayoutError, ShaderError, VulkanUnavailable

_LAZY: dict[str, str] = {
    "available": "gpu.device:available",
    "list_devices": "gpu.device:list_devices",
    "Device": "gpu.device:Device",
    "DeviceInfo": "gpu.device:DeviceInfo",
    "Buffer": "gpu.buffers:Buffer",
    "BufferRange": "gpu.buffers:BufferRange",
    "ImportedBuffer": "gpu.buffers:ImportedBuffer",
    "TexelRange": "gpu.buffers:TexelRange",
    "texel": "gpu.buffers:texel",
    "Pipeline": "gpu.pipeline:Pipeline",
    "Compute": "gpu.pipeline:Compute",
    "Commands": "gpu.pipeline:Commands",
    "Submission": "gpu.pipeline:Submission",
    "LossKernels": "gpu.kernels:LossKernels",
    "Pool": "gpu.pool:Pool",
    "PoolStats": "gpu.pool:PoolStats",
    "OutOfMemory": "gpu.pool:OutOfMemory",
    "reflect": "gpu.spirv:reflect",
    "pack": "gpu.std430:pack",
    "unpack": "gpu.std430:unpack",
}

__all__ = [
    "ClosedError",
    "DeviceLost",
    "GpuError",
    "LayoutError",
    "ShaderError",
    "VulkanUnavailable",
    "dispatch",
    *_LAZY,
]


def dispatch(pipeline: Any, groups: int | tuple[int, ...], bindings: dict[int, Any],
             push: dict[str, Any] | bytes | None = None) -> None:
    """Record one dispatch of ``pipeline``, submit it and wait for it."""
    from gpu.pipeline import Commands

    with Commands(pipeline.device) as cmd:
        cmd.dispatch(pipeline, groups, bindings, push)


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'gpu' has no attribute {name!r}")
    modname, _, attr = target.partition(":")
    value = getattr(import_module(modname), attr)
    globals()[name] = value
    return value
