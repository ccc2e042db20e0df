"""edgeport's Vulkan backend ``VulkanBackend``: SPIR-V compute kernels on a Vulkan device, driven from numpy.

Importing this package touches no Vulkan API and imports no torch; the device is created on first use
(:meth:`VulkanDevice.get`). ``VulkanPartitioner`` (torch) and ``VulkanExecutor`` load on first access.
"""

from __future__ import annotations

from typing import Any

from .device import (
    Buffer,
    DeviceInfo,
    Kernel,
    VulkanDevice,
    VulkanUnavailableError,
    available_shaders,
    dispatch,
)
from .ops import OPS, run_op
from .options import BACKEND_ID, VulkanCompileOptions

__all__ = [
    "BACKEND_ID", "OPS", "Buffer", "DeviceInfo", "Kernel", "VulkanCompileOptions", "VulkanDevice", "VulkanExecutor",
    "VulkanPartitioner", "VulkanUnavailableError", "available_shaders", "dispatch", "run_op",
]


def __getattr__(name: str) -> Any:
    if name == "VulkanPartitioner":
        from .partitioner import VulkanPartitioner

        return VulkanPartitioner
    if name == "VulkanExecutor":
        from .runtime import VulkanExecutor

        return VulkanExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
__version__ = "0.1.0"
