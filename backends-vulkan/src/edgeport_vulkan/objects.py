"""Vulkan objects owned by a :class:`~edgeport_vulkan.device.VulkanDevice`: storage buffers and compute kernels."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .spirv import ShaderInterface, reflect

if TYPE_CHECKING:
    from .device import VulkanDevice

__all__ = ["MAX_BINDINGS", "Buffer", "Kernel"]

MAX_BINDINGS = 8


class Buffer:
    """A storage buffer in host-visible, host-coherent memory, persistently mapped."""

    def __init__(self, device: VulkanDevice, nbytes: int) -> None:
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"buffer size must be a positive int, got {nbytes!r}")
        if nbytes > device.info.max_storage_buffer_range:
            raise ValueError(f"buffer of {nbytes} bytes exceeds the device's maxStorageBufferRange "
                             f"({device.info.max_storage_buffer_range})")
        vk = device.vk
        self.device = device
        self.nbytes = nbytes
        self.handle = vk.vkCreateBuffer(device.handle, vk.VkBufferCreateInfo(
            size=nbytes, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(device.handle, self.handle)
        try:
            self.memory = vk.vkAllocateMemory(device.handle, vk.VkMemoryAllocateInfo(
                allocationSize=req.size, memoryTypeIndex=device.memory_type(req.memoryTypeBits)), None)
        except Exception:
            vk.vkDestroyBuffer(device.handle, self.handle, None)
            raise
        vk.vkBindBufferMemory(device.handle, self.handle, self.memory, 0)
        self._mapped = vk.vkMapMemory(device.handle, self.memory, 0, nbytes, 0)
        self._bytes = np.frombuffer(self._mapped, dtype=np.uint8, count=nbytes)
        device._buffers.add(self)

    @property
    def alive(self) -> bool:
        return self._bytes is not None

    def view(self, dtype: Any = np.float32) -> np.ndarray:
        """The mapped memory as a flat numpy array (valid until :meth:`release`)."""
        if self._bytes is None:
            raise ValueError("buffer was released")
        return self._bytes.view(dtype)

    def write(self, array: np.ndarray, offset: int = 0) -> None:
        """Copies a C-contiguous array into the buffer at byte ``offset``."""
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise ValueError("write() needs a C-contiguous numpy array")
        if offset < 0 or offset + array.nbytes > self.nbytes:
            raise ValueError(f"write of {array.nbytes} bytes at offset {offset} overflows a {self.nbytes}-byte buffer")
        self.view(np.uint8)[offset:offset + array.nbytes] = array.reshape(-1).view(np.uint8)

    def read(self, shape: Sequence[int], dtype: Any = np.float32) -> np.ndarray:
        """A copy of the buffer's leading bytes as an array of ``shape``."""
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        count = int(np.prod(shape, dtype=np.int64))
        if any(s < 0 for s in shape) or count * dtype.itemsize > self.nbytes:
            raise ValueError(f"read of {count} x {dtype} overflows a {self.nbytes}-byte buffer")
        return self.view(dtype)[:count].reshape(tuple(shape)).copy()

    def release(self) -> None:
        """Unmaps and frees the buffer (idempotent)."""
        if self._bytes is None:
            return
        vk, dev = self.device.vk, self.device.handle
        self._bytes = None
        self._mapped = None
        vk.vkUnmapMemory(dev, self.memory)
        vk.vkDestroyBuffer(dev, self.handle, None)
        vk.vkFreeMemory(dev, self.memory, None)
        self.device._buffers.discard(self)

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Kernel:
    """A compute pipeline built from ``spirv/<name>.spv``; its layout is reflected from the SPIR-V itself.

    ``spec`` gives the shader's int specialization constants in constant_id order (baked into the pipeline:
    op codes and ranks, so drivers compile away the branches); missing trailing ones keep their defaults.
    """

    def __init__(self, device: VulkanDevice, name: str, code: bytes, spec: tuple[int, ...] = ()) -> None:
        vk = device.vk
        self.name = name
        self.spec = spec
        self.interface: ShaderInterface = reflect(code)
        ids = self.interface.spec_constants
        if len(spec) > len(ids) or not all(isinstance(v, int) and -2**31 <= v < 2**31 for v in spec):
            raise ValueError(f"shader {name!r} takes {len(ids)} int specialization constants, got {spec!r}")
        if self.interface.bindings > MAX_BINDINGS:
            raise ValueError(f"shader {name!r} uses {self.interface.bindings} bindings (max {MAX_BINDINGS})")
        size, info = self.interface.local_size, device.info
        if size[0] * size[1] * size[2] > info.max_workgroup_invocations or any(
                s > m for s, m in zip(size, info.max_workgroup_size)):
            raise ValueError(f"shader {name!r}: workgroup {size} exceeds the device's limits "
                             f"({info.max_workgroup_size}, {info.max_workgroup_invocations} invocations)")
        if self.interface.push_constant_size > device.info.max_push_constants_size:
            raise ValueError(f"shader {name!r} needs {self.interface.push_constant_size} bytes of push constants")
        dev = device.handle
        self.module = vk.vkCreateShaderModule(dev, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code), None)
        self.set_layout = vk.vkCreateDescriptorSetLayout(dev, vk.VkDescriptorSetLayoutCreateInfo(
            bindingCount=self.interface.bindings,
            pBindings=[vk.VkDescriptorSetLayoutBinding(
                binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1,
                stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i in range(self.interface.bindings)]), None)
        ranges = []
        if self.interface.push_constant_size:
            ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0,
                                             size=self.interface.push_constant_size)]
        self.layout = vk.vkCreatePipelineLayout(dev, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[self.set_layout], pushConstantRangeCount=len(ranges),
            pPushConstantRanges=ranges or None), None)
        spec_info = None
        if spec:
            self._spec_data = struct.pack(f"<{len(spec)}i", *spec)  # must outlive pipeline creation
            spec_info = vk.VkSpecializationInfo(
                mapEntryCount=len(spec),
                pMapEntries=[vk.VkSpecializationMapEntry(constantID=cid, offset=4 * i, size=4)
                             for i, cid in enumerate(ids[:len(spec)])],
                dataSize=len(self._spec_data), pData=vk.ffi.from_buffer(self._spec_data))
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.module,
                                                   pName="main", pSpecializationInfo=spec_info)
        self.pipeline = vk.vkCreateComputePipelines(
            dev, None, 1, [vk.VkComputePipelineCreateInfo(stage=stage, layout=self.layout)], None)[0]

    @property
    def bindings(self) -> int:
        return self.interface.bindings

    @property
    def push_constant_size(self) -> int:
        return self.interface.push_constant_size

    @property
    def local_size(self) -> tuple[int, int, int]:
        return self.interface.local_size

    def destroy(self, device: VulkanDevice) -> None:
        vk, dev = device.vk, device.handle
        vk.vkDestroyPipeline(dev, self.pipeline, None)
        vk.vkDestroyPipelineLayout(dev, self.layout, None)
        vk.vkDestroyDescriptorSetLayout(dev, self.set_layout, None)
        vk.vkDestroyShaderModule(dev, self.module, None)
