"""edgeport plugin module of ``VulkanBackend``: hook implementations only.

Registration imports neither torch nor the Vulkan bindings: they load when a partitioner, ``preprocess`` or an
executor is first used.
"""

from __future__ import annotations

from typing import Any

import edgeport
from edgeport.backend import BackendSpec, PreprocessResult
from edgeport_vulkan.capabilities import capabilities
from edgeport_vulkan.options import BACKEND_ID, VulkanCompileOptions, VulkanRuntimeOptions

_APT = "apt-get install mesa-vulkan-drivers libvulkan1"


def _preprocess(edge_program: Any, compile_specs: Any) -> PreprocessResult:
    from edgeport_vulkan.preprocess import preprocess

    return preprocess(edge_program, compile_specs)


def _partitioner(*args: Any, **kwargs: Any) -> Any:
    from edgeport_vulkan.partitioner import VulkanPartitioner

    return VulkanPartitioner(*args, **kwargs)


def _executor() -> Any:
    from edgeport_vulkan.runtime import VulkanExecutor

    return VulkanExecutor()


def _available() -> tuple[bool, str]:
    from edgeport_vulkan.device import VulkanDevice, VulkanUnavailableError, available_shaders

    if not available_shaders():
        return False, ("edgeport-vulkan has no compiled shaders (the package build runs glslc); reinstall with "
                       "pip install -e ./backends-vulkan after apt-get install glslc spirv-tools")
    try:
        info = VulkanDevice.get().info
    except VulkanUnavailableError as exc:
        return False, f"no usable Vulkan device: {exc}. Fix: {_APT} (lavapipe runs Vulkan on the CPU)"
    return True, f"runs on {info.name} ({info.device_type}, Vulkan {info.api_version})"


def _describe(processed: Any) -> dict[str, Any]:
    from edgeport_vulkan.describe import describe_blob

    return describe_blob(processed)


@edgeport.hookimpl
def edgeport_register_backends(registry: Any) -> None:
    from edgeport_vulkan import __version__

    registry.add(BackendSpec(
        backend_id=BACKEND_ID, version=__version__, preprocess=_preprocess, partitioner=_partitioner,
        executor=_executor, capabilities=capabilities, compile_options=VulkanCompileOptions,
        runtime_options=VulkanRuntimeOptions,
        describe_blob=_describe, is_available=_available,
        description="Vulkan compute: edgeport's GLSL shader library (SPIR-V) on the raw Vulkan API (lavapipe "
                    "without a GPU); blobs in ExecuTorch's VH00/VkGraph format"))
