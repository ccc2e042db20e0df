"""edgeport's Vulkan backend (foundation): SPIR-V compute kernels on a Vulkan device, driven from numpy.

Importing this package touches no Vulkan API; the device is created on first use (:meth:`VulkanDevice.get`).
"""

from __future__ import annotations

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

__all__ = [
    "OPS", "Buffer", "DeviceInfo", "Kernel", "VulkanDevice", "VulkanUnavailableError", "available_shaders",
    "dispatch", "run_op",
]
__version__ = "0.1.0"
