"""``VulkanBackend``'s executor: a ``VH00`` blob run on the Vulkan device through the shader library.

``init`` parses and validates the whole blob (:func:`edgeport_vulkan._plan.plan_graph`: sizes, tensor ids,
operator names and shapes; unknown operators are refused by name) before any device memory is touched; then it
uploads the weights once, allocates one buffer per tensor (views alias their source), and records every dispatch
(with barriers) into one command buffer. Each ``execute`` copies the inputs in, submits once, waits, and copies
the outputs out. Blobs written by ExecuTorch 1.5.1's Vulkan partitioner run too, for the operators the shader
library has (constants in the program's named data are read through ``named_data``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeport.backend import CompileSpec
from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport_vulkan._plan import Plan, plan_graph
from edgeport_vulkan._plan_context import BOOL, FLOAT
from edgeport_vulkan.options import BACKEND_ID, VulkanCompileOptions
from edgeport_vulkan.schema import parse_blob


def _largest_heap(dev: Any) -> int:
    try:
        mem = dev.vk.vkGetPhysicalDeviceMemoryProperties(dev.physical_device)
        return max(int(mem.memoryHeaps[i].size) for i in range(mem.memoryHeapCount))
    except Exception:  # noqa: BLE001 - a driver without heap info: no extra limit
        return 0


def plan_memory(plan: Plan) -> dict[int, int]:
    """Memory slot of every buffer-owning tensor: intermediates whose lifetimes (first to last dispatch touching
    them or a view of them) do not overlap share a slot; inputs, outputs and constants get slots of their own.
    Every dispatch is followed by a full compute barrier, so reusing a buffer after its last reader is safe."""
    owners = sorted(set(plan.storage.values()))
    pinned = set(plan.constants) | {plan.storage[v] for v in (*plan.inputs, *plan.outputs)}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, d in enumerate(plan.dispatches):
        for t in d.tensors:
            o = plan.storage[t]
            first.setdefault(o, i)
            last[o] = i
    slots: dict[int, int] = {}
    free: list[int] = []
    n_shared = 0
    active: list[tuple[int, int]] = []  # (last use, slot)
    for o in sorted((o for o in owners if o not in pinned and o in first), key=lambda o: first[o]):
        for entry in [a for a in active if a[0] < first[o]]:
            active.remove(entry)
            free.append(entry[1])
        if free:
            slot = free.pop(0)
        else:
            slot = n_shared
            n_shared += 1
        slots[o] = slot
        active.append((last[o], slot))
    for n, o in enumerate(o for o in owners if o not in slots):
        slots[o] = -1 - n  # a slot of its own
    return slots


@dataclass
class _Handle:
    plan: Plan
    fp16: bool
    device: Any
    buffers: dict[int, Any] = field(default_factory=dict)  # owning tensor id -> Buffer
    slots: dict[int, Any] = field(default_factory=dict)  # memory slot -> Buffer (shared by disjoint lifetimes)
    recording: Any = None
    description: str = ""
    dispatches: list[Any] = field(default_factory=list)  # what ``recording`` holds (a timed copy is made from it)
    tracer: Any = None  # an ETDump event tracer while the program records one
    timed: Any = None  # the recording with GPU timestamps, used while ``tracer`` is set


class VulkanExecutor:
    """Runs ``VulkanBackend`` delegates (one recorded command buffer per delegate)."""

    thread_safe = False

    def is_available(self) -> tuple[bool, str]:
        from edgeport_vulkan.plugin import _available

        return _available()

    def init(self, processed: memoryview, compile_specs: Sequence[CompileSpec],
             named_data: Callable[[str], memoryview] | None = None, runtime_options: Any = None) -> _Handle:
        try:
            options = VulkanCompileOptions.from_compile_specs(compile_specs)
        except ValueError as exc:
            raise ProgramError(f"{BACKEND_ID}: {exc}") from None
        blob = parse_blob(processed, f"{BACKEND_ID} delegate")
        plan = plan_graph(blob.graph, blob.constant_bytes, named_data, f"{BACKEND_ID} delegate")
        from edgeport_vulkan.device import VulkanDevice, VulkanUnavailableError

        try:
            device = VulkanDevice.get(getattr(runtime_options, "device", "") or "")
        except VulkanUnavailableError as exc:
            raise RuntimeExecutionError(f"{BACKEND_ID}: no Vulkan device: {exc}") from None
        fp16 = options.force_fp16 or plan.fp16
        if fp16 and not device.info.fp16_storage:
            raise RuntimeExecutionError(f"{BACKEND_ID}: force_fp16 needs 16-bit storage buffers, which "
                                        f"{device.info.name} lacks")
        handle = _Handle(plan, fp16, device)
        try:
            self._allocate(handle)
        except BaseException:
            self.destroy(handle)
            raise
        handle.description = (f"Vulkan compute on {device.info.name} ({device.info.device_type}, "
                              f"{device.info.driver_name or 'driver'}), {len(plan.dispatches)} dispatches"
                              + (", fp16 storage" if fp16 else ""))
        return handle

    def _allocate(self, h: _Handle) -> None:
        plan, dev = h.plan, h.device
        itemsize = 2 if h.fp16 else 4
        limit = dev.info.max_storage_buffer_range
        sizes = {}
        for owner in sorted(set(plan.storage.values())):
            sizes[owner] = max(4, -(-math.prod(plan.dims[owner]) * itemsize // 4) * 4)
            if sizes[owner] > limit:
                raise ProgramError(f"{BACKEND_ID}: tensor {owner} needs {sizes[owner]} bytes, above the device's "
                                   f"maxStorageBufferRange ({limit})")
        slots = plan_memory(plan)
        slot_bytes: dict[int, int] = {}
        for owner, slot in slots.items():
            slot_bytes[slot] = max(slot_bytes.get(slot, 0), sizes[owner])
        total, heap = sum(slot_bytes.values()), _largest_heap(dev)
        if heap and total > heap:
            raise ProgramError(f"{BACKEND_ID}: the graph needs {total} bytes of buffers, more than the device's "
                               f"largest memory heap ({heap} bytes)")
        for slot, nbytes in slot_bytes.items():
            h.slots[slot] = dev.buffer(nbytes)
        for owner, slot in slots.items():
            h.buffers[owner] = h.slots[slot]
        for owner, data in plan.constants.items():
            h.buffers[owner].write(self._to_device(data, h.fp16))
        if plan.dispatches:
            from edgeport_vulkan.device import pack

            dispatches = []
            for d in plan.dispatches:
                kernel = dev.kernel(d.shader + "_fp16" if h.fp16 else d.shader, d.spec)
                bufs = [h.buffers[plan.storage[t]] for t in d.tensors]
                dispatches.append((kernel, bufs, pack(d.fmt, *d.values), d.groups))
            h.recording = dev.record(dispatches)
            h.dispatches = dispatches

    @staticmethod
    def _to_device(a: np.ndarray, fp16: bool) -> np.ndarray:
        if a.dtype == np.int32:  # int32 / bool words
            return np.ascontiguousarray(a).reshape(-1)
        a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
        if fp16:
            with np.errstate(over="ignore"):
                return a.astype(np.float16)
        return a

    def describe_execution(self, handle: _Handle) -> str:
        return handle.description

    def num_outputs(self, handle: _Handle) -> int:
        return len(handle.plan.outputs)

    def execute(self, handle: _Handle, inputs: Sequence[Any], out: Sequence[Any] | None = None) -> list[np.ndarray]:
        plan = handle.plan
        if not handle.buffers:
            raise RuntimeExecutionError(f"{BACKEND_ID}: the delegate was destroyed")
        if len(inputs) != len(plan.inputs):
            raise RuntimeExecutionError(f"{BACKEND_ID}: {len(inputs)} inputs given, the graph takes "
                                        f"{len(plan.inputs)}")
        for i, (x, vid) in enumerate(zip(inputs, plan.inputs, strict=True)):
            handle.buffers[plan.storage[vid]].write(self._input(i, np.asarray(x), plan, vid, handle.fp16))
        tracer, timed = handle.tracer, handle.timed
        if handle.recording is not None:
            try:
                if tracer is not None and timed is not None:
                    submitted = tracer.now_ns()
                    timed.run()
                    self._report(handle, tracer, submitted, timed.dispatch_times())
                else:
                    handle.recording.run()
            except (ValueError, RuntimeExecutionError):
                raise
            except Exception as exc:  # the driver's error (device lost, out of memory): name it, keep the handle
                raise RuntimeExecutionError(
                    f"{BACKEND_ID}: the Vulkan device failed during the run ({type(exc).__name__}: {exc}); the "
                    "delegate's buffers are intact, so the method can be run again or released") from exc
        if plan.status is not None:
            status = handle.buffers[plan.storage[plan.status]]
            if status.view(np.int32)[0]:
                status.write(np.zeros(1, np.int32))
                raise RuntimeExecutionError(f"{BACKEND_ID}: an index is out of range (embedding / index_select / "
                                            "index / gather read outside its source); this run's outputs are invalid")
        results = []
        for i, vid in enumerate(plan.outputs):
            shape = plan.dims[vid]
            kind = plan.kinds.get(vid, FLOAT)
            dtype = np.int32 if kind != FLOAT else np.float16 if handle.fp16 else np.float32
            want = np.float32 if kind == FLOAT else np.bool_ if kind == BOOL else np.int64
            data = handle.buffers[plan.storage[vid]].view(dtype)[:math.prod(shape)].reshape(shape)
            dst = out[i] if out is not None and i < len(out) else None
            if dst is not None and isinstance(dst, np.ndarray) and dst.shape == shape and (
                    dst.dtype == want or (kind == FLOAT and dst.dtype == np.float32)
                    or (kind != FLOAT and dst.dtype.kind == "i" and dst.dtype.itemsize >= 4)):
                np.copyto(dst, data if kind != BOOL else data != 0, casting="unsafe")
                results.append(dst)
            else:
                results.append(data != 0 if kind == BOOL else data.astype(want, copy=True))
        return results

    @staticmethod
    def _input(i: int, a: np.ndarray, plan: Plan, vid: int, fp16: bool) -> np.ndarray:
        """Input ``i`` as the device stores it: float32 (or fp16), int32 words for integer and bool tensors."""
        kind = plan.kinds.get(vid, FLOAT)
        ok = a.dtype == np.float32 if kind == FLOAT else a.dtype == np.bool_ if kind == BOOL else a.dtype.kind in "iu"
        want = "float32" if kind == FLOAT else "bool" if kind == BOOL else "an integer dtype"
        if not ok or tuple(a.shape) != plan.dims[vid]:
            raise RuntimeExecutionError(f"{BACKEND_ID}: input {i} must be {want} of shape {list(plan.dims[vid])}, "
                                        f"got {a.dtype} {list(a.shape)}")
        if kind == FLOAT:
            return VulkanExecutor._to_device(a, fp16)
        if kind != BOOL and a.size and (int(a.min()) < -(2**31) or int(a.max()) >= 2**31):
            raise RuntimeExecutionError(f"{BACKEND_ID}: input {i} has values outside the int32 range "
                                        f"[{a.min()}, {a.max()}]; the Vulkan delegate computes integers in int32")
        return np.ascontiguousarray(a, dtype=np.int32).reshape(-1)

    def set_event_tracer(self, handle: _Handle, tracer: Any) -> None:
        """While ``tracer`` is set (the program records an ETDump), runs use a copy of the command buffer with a GPU
        timestamp query around each dispatch, and each dispatch becomes a delegate sub-event: named by its shader,
        delegate debug id = its operator's ``node_id`` (the blob's delegate map links that to the edge node).
        The times are the device's clock placed from the host time of the submit. ``None`` turns it off."""
        if not isinstance(handle, _Handle):
            return
        handle.tracer = tracer
        if tracer is None or handle.timed is not None or not handle.dispatches:
            return
        info = handle.device.info
        if info.timestamp_valid_bits and info.timestamp_period_ns > 0:
            handle.timed = handle.device.record(handle.dispatches, timestamps=True)

    @staticmethod
    def _report(handle: _Handle, tracer: Any, submitted: int, times: list[tuple[float, float]]) -> None:
        for d, (start, end) in zip(handle.plan.dispatches, times, strict=True):
            tracer.log_profiling_delegate(d.shader, d.node_id if d.node_id >= 0 else d.shader,
                                          submitted + int(start), submitted + int(end))

    def destroy(self, handle: _Handle) -> None:
        if handle.recording is not None:
            handle.recording.close()
            handle.recording = None
        if handle.timed is not None:
            handle.timed.close()
            handle.timed = None
        handle.dispatches = []
        for buf in handle.slots.values():
            buf.release()
        handle.slots.clear()
        handle.buffers.clear()
