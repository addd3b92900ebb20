"""The errors of the ``gpu`` library.

``gpu`` is a library of its own, so it has its own small hierarchy rather than the
tracker's. Every message names the thing, the bad value and the fix. Running out of
device memory is :class:`gpu.pool.OutOfMemory` (it carries the size that failed); it
lives beside the pool policy and is re-exported by :mod:`gpu`.
"""

from __future__ import annotations


class GpuError(Exception):
    """Base class of every error the ``gpu`` library raises on purpose."""


class VulkanUnavailable(GpuError):
    """No Vulkan loader, no device, or a missing layer or tool.

    ``package`` names the Debian package (or pip package) that provides what is
    missing, so the caller can print the fix.
    """

    def __init__(self, message: str, package: str | None = None) -> None:
        super().__init__(message)
        self.package = package


class LayoutError(GpuError):
    """A value does not fit a block layout read from SPIR-V (missing, extra, out of range)."""


class ShaderError(GpuError):
    """A shader could not be read, reflected or compiled."""


class DeviceLost(GpuError):
    """The device reported an error while running submitted work."""


class ClosedError(GpuError):
    """An object was used after ``close()``."""
