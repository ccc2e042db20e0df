"""Vulkan compute device (torch-free): instance, device, host-visible buffers, compute kernels, dispatch.

Everything goes through the raw Vulkan API (PyPI ``vulkan``, cffi bindings), imported lazily so that importing
this package works on machines without a Vulkan loader. Buffers are host-visible + host-coherent memory, mapped
persistently (simple and correct everywhere; a staging path into device-local memory is future work for
discrete GPUs). Each submission is one command buffer, fenced and waited for synchronously.
"""

from __future__ import annotations

import os
import struct
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .objects import MAX_BINDINGS, Buffer, Kernel

__all__ = [
    "Buffer", "DeviceInfo", "Kernel", "Recording", "VulkanDevice", "VulkanUnavailableError", "available_shaders",
    "dispatch",
]

# Dispatches recorded into one command buffer at most (the descriptor pool is sized for it).
MAX_DISPATCHES_PER_SUBMIT = 256
_FENCE_TIMEOUT_NS = 120 * 1_000_000_000
_DEVICE_TYPE_NAMES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}
_DEVICE_TYPE_RANK = {2: 0, 1: 1, 3: 2, 4: 3, 0: 4}  # discrete GPU first, lavapipe (cpu) as a fallback


class VulkanUnavailableError(RuntimeError):
    """No Vulkan loader, no instance, or no compute-capable physical device on this machine."""


def available_shaders() -> list[str]:
    """Names of the compiled shaders shipped in the package (``spirv/<name>.spv``)."""
    root = resources.files(__package__).joinpath("spirv")
    if not root.is_dir():
        return []
    return sorted(p.name[:-4] for p in root.iterdir() if p.name.endswith(".spv"))


def _load_vulkan() -> Any:
    # Mesa warns on stderr when XDG_RUNTIME_DIR is unset or unusable: give it a private directory.
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if not runtime_dir or not os.access(runtime_dir, os.W_OK):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="edgeport-vulkan-")
    try:
        import vulkan
    except (ImportError, OSError) as exc:
        raise VulkanUnavailableError(f"the Vulkan loader cannot be used: {exc}") from exc
    return vulkan


def _version_str(v: int) -> str:
    return f"{(v >> 22) & 0x7F}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


@dataclass(frozen=True)
class DeviceInfo:
    """What the selected physical device is and what it allows."""

    name: str
    device_type: str
    api_version: str
    driver_name: str
    driver_info: str
    vendor_id: int
    device_id: int
    max_workgroup_count: tuple[int, int, int]
    max_workgroup_size: tuple[int, int, int]
    max_workgroup_invocations: int
    max_shared_memory: int
    max_push_constants_size: int
    max_storage_buffer_range: int
    fp16_storage: bool = False  # storageBuffer16BitAccess (enabled when present): the *_fp16 kernels run
    timestamp_period_ns: float = 0.0  # nanoseconds per timestamp tick (limits.timestampPeriod)
    timestamp_valid_bits: int = 0  # of the compute queue family; 0: no timestamp queries on it


# (kernel, buffers, push constants, workgroup counts)
Dispatch = tuple[Kernel, Sequence[Buffer], bytes, tuple[int, int, int]]


class VulkanDevice:
    """The process-wide Vulkan compute device; obtain it with :meth:`get`."""

    _instance: VulkanDevice | None = None
    _selected: dict[str, VulkanDevice] = {}
    _init_lock = threading.Lock()

    @classmethod
    def get(cls, name: str = "") -> VulkanDevice:
        """The shared device (created on first use). Raises :class:`VulkanUnavailableError` if there is none.

        ``name`` (a substring of a device's name, e.g. from ``VulkanRuntimeOptions(device=...)``) picks one device;
        otherwise ``EDGEPORT_VULKAN_DEVICE`` does, else the automatic choice (a discrete GPU first, lavapipe last).
        """
        validation = os.environ.get("EDGEPORT_VULKAN_VALIDATION") == "1"
        with cls._init_lock:
            if name:
                dev = cls._selected.get(name.lower())
                if dev is None or dev._closed:
                    dev = cls._selected[name.lower()] = cls(enable_validation=validation, wanted=name)
                return dev
            if cls._instance is None or cls._instance._closed:
                cls._instance = cls(enable_validation=validation)
            return cls._instance

    def __init__(self, enable_validation: bool = False, wanted: str = "") -> None:
        self._wanted = wanted
        vk = self.vk = _load_vulkan()
        self._closed = True
        self._lock = threading.RLock()
        self._kernels: dict[tuple[str, tuple[int, ...]], Kernel] = {}
        self._buffers: set[Buffer] = set()
        self._recordings: set[Recording] = set()
        try:
            instance_version = vk.vkEnumerateInstanceVersion()
        except Exception:
            instance_version = vk.VK_MAKE_VERSION(1, 0, 0)
        api = min(instance_version, vk.VK_MAKE_VERSION(1, 3, 0))
        if api < vk.VK_MAKE_VERSION(1, 1, 0):
            raise VulkanUnavailableError(f"Vulkan {_version_str(instance_version)} loader; 1.1 is required")
        layers = ["VK_LAYER_KHRONOS_validation"] if enable_validation else []
        try:
            self.instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(
                pApplicationInfo=vk.VkApplicationInfo(pApplicationName="edgeport", pEngineName="edgeport",
                                                      apiVersion=api),
                enabledLayerCount=len(layers), ppEnabledLayerNames=layers or None), None)
        except Exception as exc:
            raise VulkanUnavailableError(f"vkCreateInstance failed: {exc!r}") from exc
        try:
            self._select_physical_device(api, self._wanted)
            self._create_device()
        except BaseException:
            vk.vkDestroyInstance(self.instance, None)
            raise
        self._closed = False

    def _select_physical_device(self, api: int, wanted: str = "") -> None:
        vk = self.vk
        candidates = []
        wanted = (wanted or os.environ.get("EDGEPORT_VULKAN_DEVICE", "")).lower()
        for pd in vk.vkEnumeratePhysicalDevices(self.instance):
            props = vk.vkGetPhysicalDeviceProperties(pd)
            if props.apiVersion < vk.VK_MAKE_VERSION(1, 1, 0):
                continue
            families = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)
            queue = next((i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT), None)
            bits = families[queue].timestampValidBits if queue is not None else 0
            name = vk.ffi.string(props.deviceName).decode() if not isinstance(props.deviceName, str) \
                else props.deviceName
            if queue is None or (wanted and wanted not in name.lower()):
                continue
            candidates.append((_DEVICE_TYPE_RANK.get(props.deviceType, 9), len(candidates), pd, props, queue, name,
                               bits))
        if not candidates:
            raise VulkanUnavailableError("no compute-capable Vulkan 1.1 physical device"
                                         + (f" whose name contains {wanted!r}" if wanted else ""))
        _, _, pd, props, queue, name, bits = min(candidates, key=lambda c: c[:2])
        self.physical_device, self.queue_family = pd, queue
        ffi = vk.ffi
        driver_name = driver_info = ""
        if api >= vk.VK_MAKE_VERSION(1, 2, 0) and props.apiVersion >= vk.VK_MAKE_VERSION(1, 2, 0):
            drv = ffi.new("VkPhysicalDeviceDriverProperties*",
                          {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES})
            props2 = ffi.new("VkPhysicalDeviceProperties2*",
                             {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, "pNext": drv})
            vk.lib.vkGetPhysicalDeviceProperties2(pd, props2)
            driver_name = ffi.string(drv.driverName).decode(errors="replace")
            driver_info = ffi.string(drv.driverInfo).decode(errors="replace")
        s16 = ffi.new("VkPhysicalDevice16BitStorageFeatures*",
                      {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES})
        feats = ffi.new("VkPhysicalDeviceFeatures2*",
                        {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": s16})
        vk.lib.vkGetPhysicalDeviceFeatures2(pd, feats)
        lim = props.limits
        self.info = DeviceInfo(
            name=name, device_type=_DEVICE_TYPE_NAMES.get(props.deviceType, str(props.deviceType)),
            api_version=_version_str(props.apiVersion), driver_name=driver_name, driver_info=driver_info,
            vendor_id=props.vendorID, device_id=props.deviceID,
            max_workgroup_count=tuple(lim.maxComputeWorkGroupCount),
            max_workgroup_size=tuple(lim.maxComputeWorkGroupSize),
            max_workgroup_invocations=lim.maxComputeWorkGroupInvocations,
            max_shared_memory=lim.maxComputeSharedMemorySize,
            max_push_constants_size=lim.maxPushConstantsSize,
            max_storage_buffer_range=lim.maxStorageBufferRange,
            fp16_storage=bool(s16.storageBuffer16BitAccess),
            timestamp_period_ns=float(lim.timestampPeriod), timestamp_valid_bits=int(bits),
        )
        mem = vk.vkGetPhysicalDeviceMemoryProperties(self.physical_device)
        self._memory_types = [mem.memoryTypes[i].propertyFlags for i in range(mem.memoryTypeCount)]

    def _create_device(self) -> None:
        vk = self.vk
        features = None
        if self.info.fp16_storage:
            features = vk.VkPhysicalDevice16BitStorageFeatures(
                sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
                storageBuffer16BitAccess=vk.VK_TRUE)
        # The bindings copy structs placed in lists into a new array and drop the originals, together with the
        # arrays they point to: keep every struct that holds a pointer referenced until the call returns.
        queue_info = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.queue_family, queueCount=1,
                                                pQueuePriorities=[1.0])
        self.handle = vk.vkCreateDevice(self.physical_device, vk.VkDeviceCreateInfo(
            pNext=features, queueCreateInfoCount=1, pQueueCreateInfos=[queue_info]), None)
        del queue_info
        self.queue = vk.vkGetDeviceQueue(self.handle, self.queue_family, 0)
        self._command_pool = vk.vkCreateCommandPool(self.handle, vk.VkCommandPoolCreateInfo(
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue_family), None)
        self._command_buffer = vk.vkAllocateCommandBuffers(self.handle, vk.VkCommandBufferAllocateInfo(
            commandPool=self._command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        self._descriptor_pool = vk.vkCreateDescriptorPool(self.handle, vk.VkDescriptorPoolCreateInfo(
            maxSets=MAX_DISPATCHES_PER_SUBMIT, poolSizeCount=1,
            pPoolSizes=[vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                descriptorCount=MAX_DISPATCHES_PER_SUBMIT * MAX_BINDINGS)]), None)
        self._fence = vk.vkCreateFence(self.handle, vk.VkFenceCreateInfo(), None)

    def memory_type(self, type_bits: int) -> int:
        """Index of a host-visible + host-coherent memory type allowed by ``type_bits`` (device-local preferred)."""
        vk = self.vk
        need = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        ok = [i for i, f in enumerate(self._memory_types) if type_bits & (1 << i) and (f & need) == need]
        if not ok:
            raise VulkanUnavailableError("no host-visible, host-coherent memory type for storage buffers")
        local = [i for i in ok if self._memory_types[i] & vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT]
        return (local or ok)[0]

    # -- public API ---------------------------------------------------------------------------------------------
    def buffer(self, nbytes: int) -> Buffer:
        """A new storage buffer of ``nbytes`` (release it, or use it as a context manager)."""
        self._check_open()
        return Buffer(self, nbytes)

    def kernel(self, name: str, spec: Sequence[int] = ()) -> Kernel:
        """The compute kernel of ``spirv/<name>.spv`` with specialization constants ``spec`` (built once, cached)."""
        self._check_open()
        key = (name, tuple(spec))
        with self._lock:
            return self._kernels.get(key) or self._build_kernel(key)

    def _build_kernel(self, key: tuple[str, tuple[int, ...]]) -> Kernel:
        name = key[0]
        if name.endswith("_fp16") and not self.info.fp16_storage:
            raise ValueError(f"{name}: the device ({self.info.name}) has no 16-bit storage buffer access")
        if name not in available_shaders():
            raise ValueError(f"unknown shader {name!r}; available: {', '.join(available_shaders()) or 'none'}"
                             " (was the package built? the build compiles shaders/*.comp with glslc)")
        code = resources.files(__package__).joinpath("spirv", f"{name}.spv").read_bytes()
        kernel = self._kernels[key] = Kernel(self, name, code, key[1])
        return kernel

    def dispatch(self, kernel: Kernel, buffers: Sequence[Buffer], push_constants: bytes = b"",
                 groups: tuple[int, int, int] = (1, 1, 1)) -> None:
        """Runs one dispatch and waits for it."""
        self.submit([(kernel, buffers, push_constants, groups)])

    def submit(self, dispatches: Sequence[Dispatch]) -> None:
        """Records the dispatches in order (with compute->compute barriers between), submits, and waits."""
        self._check_open()
        if not 0 < len(dispatches) <= MAX_DISPATCHES_PER_SUBMIT:
            raise ValueError(f"1..{MAX_DISPATCHES_PER_SUBMIT} dispatches per submit, got {len(dispatches)}")
        for d in dispatches:
            self._validate(*d)
        vk = self.vk
        with self._lock:
            dev, cmd = self.handle, self._command_buffer
            try:
                sets = vk.vkAllocateDescriptorSets(dev, vk.VkDescriptorSetAllocateInfo(
                    descriptorPool=self._descriptor_pool, descriptorSetCount=len(dispatches),
                    pSetLayouts=[k.set_layout for k, *_ in dispatches]))
                writes = [vk.VkWriteDescriptorSet(
                    dstSet=sets[n], dstBinding=i, descriptorCount=1,
                    descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                    pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b.handle, offset=0, range=b.nbytes)])
                    for n, (_, bufs, _, _) in enumerate(dispatches) for i, b in enumerate(bufs)]
                vk.vkUpdateDescriptorSets(dev, len(writes), writes, 0, None)
                vk.vkResetCommandBuffer(cmd, 0)
                vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
                    flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
                barrier = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                                             dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
                for n, (kernel, _, pc, groups) in enumerate(dispatches):
                    if n:
                        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                                vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, [barrier], 0, None,
                                                0, None)
                    vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.pipeline)
                    vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.layout, 0, 1,
                                               [sets[n]], 0, None)
                    if pc:
                        vk.vkCmdPushConstants(cmd, kernel.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(pc),
                                              vk.ffi.from_buffer(pc))
                    vk.vkCmdDispatch(cmd, *groups)
                host = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                                          dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)
                vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT,
                                        0, 1, [host], 0, None, 0, None)
                vk.vkEndCommandBuffer(cmd)
                vk.vkResetFences(dev, 1, [self._fence])
                vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd])],
                                 self._fence)
                vk.vkWaitForFences(dev, 1, [self._fence], vk.VK_TRUE, _FENCE_TIMEOUT_NS)
            finally:
                vk.vkResetDescriptorPool(dev, self._descriptor_pool, 0)

    def record(self, dispatches: Sequence[Dispatch], timestamps: bool = False) -> Recording:
        """Records the dispatches once (with compute->compute barriers between them) into a command buffer of
        their own; :meth:`Recording.run` submits it and waits, as often as needed. Buffers must outlive it.
        ``timestamps``: also write a GPU timestamp before and after each dispatch (read with
        :meth:`Recording.dispatch_times`); needs a queue with timestamp support."""
        self._check_open()
        if not dispatches:
            raise ValueError("record() needs at least one dispatch")
        if timestamps and not (self.info.timestamp_valid_bits and self.info.timestamp_period_ns > 0):
            raise ValueError(f"{self.info.name} has no timestamp queries on its compute queue")
        for d in dispatches:
            self._validate(*d)
        return Recording(self, dispatches, timestamps)

    def _validate(self, kernel: Kernel, buffers: Sequence[Buffer], pc: bytes, groups: tuple[int, int, int]) -> None:
        if not isinstance(kernel, Kernel) or self._kernels.get((kernel.name, kernel.spec)) is not kernel:
            raise ValueError("kernel does not belong to this device (use VulkanDevice.kernel())")
        if len(buffers) != kernel.bindings:
            raise ValueError(f"{kernel.name}: {kernel.bindings} buffers expected, got {len(buffers)}")
        for b in buffers:
            if not isinstance(b, Buffer) or b.device is not self or not b.alive:
                raise ValueError(f"{kernel.name}: buffers must be live Buffers of this device")
        if not isinstance(pc, bytes | bytearray) or len(pc) != kernel.push_constant_size:
            raise ValueError(f"{kernel.name}: push constants must be {kernel.push_constant_size} bytes, "
                             f"got {len(pc) if isinstance(pc, bytes | bytearray) else type(pc).__name__}")
        if len(groups) != 3 or not all(isinstance(g, int) and 0 < g <= m
                                       for g, m in zip(groups, self.info.max_workgroup_count)):
            raise ValueError(f"{kernel.name}: workgroup counts {groups!r} outside 1..{self.info.max_workgroup_count}")

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the Vulkan device was closed")

    def close(self) -> None:
        """Waits for the device, then destroys every object it owns (idempotent)."""
        if self._closed:
            return
        vk, dev = self.vk, self.handle
        with self._lock:
            vk.vkDeviceWaitIdle(dev)
            for rec in list(self._recordings):
                rec.close()
            for buf in list(self._buffers):
                buf.release()
            for kernel in self._kernels.values():
                kernel.destroy(self)
            self._kernels.clear()
            vk.vkDestroyFence(dev, self._fence, None)
            vk.vkDestroyDescriptorPool(dev, self._descriptor_pool, None)
            vk.vkDestroyCommandPool(dev, self._command_pool, None)
            vk.vkDestroyDevice(dev, None)
            vk.vkDestroyInstance(self.instance, None)
            self._closed = True


def dispatch(kernel: Kernel, buffers: Sequence[Buffer], push_constants: bytes = b"",
             groups: tuple[int, int, int] = (1, 1, 1)) -> None:
    """Runs one dispatch on the shared device and waits for it."""
    VulkanDevice.get().dispatch(kernel, buffers, push_constants, groups)


def pack(fmt: str, *values: int | float) -> bytes:
    """Little-endian push-constant bytes (``struct`` format without the byte-order prefix)."""
    return struct.pack("<" + fmt, *values)


class Recording:
    """A command buffer recorded once by :meth:`VulkanDevice.record`; :meth:`run` submits it and waits."""

    def __init__(self, device: VulkanDevice, dispatches: Sequence[Dispatch], timestamps: bool = False) -> None:
        vk = device.vk
        self.device = device
        self._closed = True
        self._queries = None
        self._n = len(dispatches)
        dev = device.handle
        with device._lock:
            if timestamps:
                self._queries = vk.vkCreateQueryPool(dev, vk.VkQueryPoolCreateInfo(
                    queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=2 * self._n), None)
            self._pool = vk.vkCreateDescriptorPool(dev, vk.VkDescriptorPoolCreateInfo(
                maxSets=len(dispatches), poolSizeCount=1,
                pPoolSizes=[vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                    descriptorCount=len(dispatches) * MAX_BINDINGS)]), None)
            self._fence = vk.vkCreateFence(dev, vk.VkFenceCreateInfo(), None)
            self._cmd = vk.vkAllocateCommandBuffers(dev, vk.VkCommandBufferAllocateInfo(
                commandPool=device._command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                commandBufferCount=1))[0]
            self._closed = False
            try:
                self._record(dispatches)
            except BaseException:
                self.close()
                raise
        self.buffers = [b for _, bufs, _, _ in dispatches for b in bufs]
        device._recordings.add(self)

    def _record(self, dispatches: Sequence[Dispatch]) -> None:
        vk, dev, cmd = self.device.vk, self.device.handle, self._cmd
        sets = vk.vkAllocateDescriptorSets(dev, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=self._pool, descriptorSetCount=len(dispatches),
            pSetLayouts=[k.set_layout for k, *_ in dispatches]))
        writes = [vk.VkWriteDescriptorSet(
            dstSet=sets[n], dstBinding=i, descriptorCount=1, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b.handle, offset=0, range=b.nbytes)])
            for n, (_, bufs, _, _) in enumerate(dispatches) for i, b in enumerate(bufs)]
        vk.vkUpdateDescriptorSets(dev, len(writes), writes, 0, None)
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=0))
        queries = self._queries
        if queries is not None:
            vk.vkCmdResetQueryPool(cmd, queries, 0, 2 * self._n)
        barrier = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                                     dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
        for n, (kernel, _, pc, groups) in enumerate(dispatches):
            if n:
                vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                        vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, [barrier], 0, None, 0, None)
            vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.pipeline)
            vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.layout, 0, 1, [sets[n]], 0,
                                       None)
            if pc:
                vk.vkCmdPushConstants(cmd, kernel.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(pc),
                                      vk.ffi.from_buffer(pc))
            if queries is not None:  # after the barrier: the time of this dispatch alone
                vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries, 2 * n)
            vk.vkCmdDispatch(cmd, *groups)
            if queries is not None:
                vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries, 2 * n + 1)
        host = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT, dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)
        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                [host], 0, None, 0, None)
        vk.vkEndCommandBuffer(cmd)

    def run(self) -> None:
        """Submits the recorded commands and waits for them (one submission)."""
        device, vk = self.device, self.device.vk
        if self._closed:
            raise ValueError("the recording was closed")
        device._check_open()
        if not all(b.alive for b in self.buffers):
            raise ValueError("a buffer of the recording was released")
        with device._lock:
            vk.vkResetFences(device.handle, 1, [self._fence])
            vk.vkQueueSubmit(device.queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[self._cmd])],
                             self._fence)
            vk.vkWaitForFences(device.handle, 1, [self._fence], vk.VK_TRUE, _FENCE_TIMEOUT_NS)

    def dispatch_times(self) -> list[tuple[float, float]]:
        """Per dispatch of the last :meth:`run`, (start, end) in nanoseconds of the device's clock, from the first
        dispatch's start. Needs a recording made with ``timestamps=True``."""
        if self._queries is None:
            raise ValueError("the recording was made without timestamps")
        vk = self.device.vk
        n = 2 * self._n
        data = vk.ffi.new("uint64_t[]", n)
        with self.device._lock:
            result = vk.lib.vkGetQueryPoolResults(self.device.handle, self._queries, 0, n, 8 * n, data, 8,
                                                  vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        if result != vk.VK_SUCCESS:
            raise ValueError(f"vkGetQueryPoolResults failed ({result})")
        bits = self.device.info.timestamp_valid_bits
        mask = (1 << bits) - 1 if bits < 64 else (1 << 64) - 1
        ticks = [int(data[i]) & mask for i in range(n)]
        period = self.device.info.timestamp_period_ns
        t0 = ticks[0]
        return [(((ticks[2 * i] - t0) & mask) * period, ((ticks[2 * i + 1] - t0) & mask) * period)
                for i in range(self._n)]

    def close(self) -> None:
        """Frees the command buffer, descriptor sets and fence (idempotent; not the buffers)."""
        if self._closed or self.device._closed:
            self._closed = True
            return
        vk, dev = self.device.vk, self.device.handle
        with self.device._lock:
            vk.vkQueueWaitIdle(self.device.queue)
            vk.vkFreeCommandBuffers(dev, self.device._command_pool, 1, [self._cmd])
            vk.vkDestroyDescriptorPool(dev, self._pool, None)
            vk.vkDestroyFence(dev, self._fence, None)
            if self._queries is not None:
                vk.vkDestroyQueryPool(dev, self._queries, None)
                self._queries = None
            self._closed = True
            self.device._recordings.discard(self)
