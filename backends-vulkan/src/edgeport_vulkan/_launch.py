"""Input validation and launch plumbing shared by :mod:`edgeport_vulkan.ops` (torch-free).

Every shape, size, stride and attribute is checked here, in Python, before anything reaches the driver: the
shaders index with 32-bit ints and trust their push constants.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np

from .device import Buffer, VulkanDevice, pack

MAX_DIMS = 6
INT32_MAX = 2**31 - 1
# Set by run_op(force_fp16=True): tensors live in fp16 on the device (the *_fp16 kernels), results come back fp32.
FP16_STORAGE: ContextVar[bool] = ContextVar("edgeport_vulkan_fp16_storage", default=False)


def check_inputs(inputs: list[Any], name: str, n_min: int, n_max: int | None = None) -> list[Any]:
    """Checks the input count; optional trailing inputs come back as None."""
    n_max = n_min if n_max is None else n_max
    if not n_min <= len(inputs) <= n_max:
        want = f"{n_min}" if n_min == n_max else f"{n_min}..{n_max}"
        raise ValueError(f"{name}: expected {want} inputs, got {len(inputs)}")
    return inputs + [None] * (n_max - len(inputs))


def check_array(x: Any, what: str, ndim: int | tuple[int, int] | None = None) -> np.ndarray:
    """``x`` must be a C-contiguous float32 ndarray of at most 6 dims (or exactly/within ``ndim``)."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{what}: expected a numpy.ndarray, got {type(x).__name__}")
    if x.dtype != np.float32:
        raise ValueError(f"{what}: dtype must be float32, got {x.dtype}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{what}: array must be C-contiguous (use numpy.ascontiguousarray)")
    lo, hi = (0, MAX_DIMS) if ndim is None else (ndim, ndim) if isinstance(ndim, int) else ndim
    if not lo <= x.ndim <= hi:
        want = f"{lo}" if lo == hi else f"{lo}..{hi}"
        raise ValueError(f"{what}: expected {want} dims, got shape {x.shape}")
    check_numel(x.shape, what)
    return x


def check_numel(shape: Sequence[int], what: str) -> int:
    n = math.prod(shape)
    if n > INT32_MAX // 4 or any(d > INT32_MAX for d in shape):
        raise ValueError(f"{what}: {n} elements is too many for 32-bit indexing")
    limit = VulkanDevice.get().info.max_storage_buffer_range
    if n * 4 > limit:
        raise ValueError(f"{what}: {n * 4} bytes exceed the device's maxStorageBufferRange ({limit})")
    return n


def check_int(v: Any, what: str, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise ValueError(f"{what} must be an int, got {v!r}")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi) or abs(v) > INT32_MAX:
        raise ValueError(f"{what} must be in [{lo}, {hi}], got {v}")
    return v


def check_ints(v: Any, n: int, what: str, lo: int | None = None) -> tuple[int, ...]:
    """An int (repeated) or a sequence of exactly ``n`` ints."""
    items = [v] * n if isinstance(v, int | np.integer) and not isinstance(v, bool) else v
    if not isinstance(items, Sequence) or isinstance(items, str) or len(items) != n:
        raise ValueError(f"{what} must be an int or {n} ints, got {v!r}")
    return tuple(check_int(i, what, lo) for i in items)


def check_float(v: Any, what: str, allow_inf: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        raise ValueError(f"{what} must be a number, got {v!r}")
    f = float(v)
    if math.isnan(f) or (not allow_inf and math.isinf(f)):
        raise ValueError(f"{what} must be {'finite' if not allow_inf else 'a number, not NaN'}, got {v!r}")
    return f


def check_dim(dim: Any, ndim: int, what: str = "dim") -> int:
    d = check_int(dim, what, -max(ndim, 1), max(ndim, 1) - 1)
    return d % max(ndim, 1)


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s *= d
    return strides[::-1]


def coalesce(shape: Sequence[int], *strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Drops size-1 dims and merges neighbours that are contiguous for every operand (at least 1 dim left)."""
    dims = [(s, [st[i] for st in strides]) for i, s in enumerate(shape) if s != 1]
    out: list[tuple[int, list[int]]] = []
    for size, st in dims:
        if out and all(prev == cur * size for prev, cur in zip(out[-1][1], st)):
            out[-1] = (out[-1][0] * size, st)
        else:
            out.append((size, st))
    if not out:
        out = [(1, [0] * len(strides))]
    if len(out) > MAX_DIMS:
        raise ValueError(f"too many non-mergeable dims ({len(out)} > {MAX_DIMS})")
    return [s for s, _ in out], [[st[k] for _, st in out] for k in range(len(strides))]


def pad6(values: Sequence[int], fill: int = 1) -> list[int]:
    return list(values) + [fill] * (MAX_DIMS - len(values))


class Launch:
    """Buffers and dispatches of one op; :meth:`run` submits them as one command buffer, then frees the buffers.

    Under ``FP16_STORAGE`` buffers hold float16 (converted on upload / download) and kernels are the ``*_fp16``
    builds of the same shaders.
    """

    def __init__(self) -> None:
        self.device = VulkanDevice.get()
        self.fp16 = FP16_STORAGE.get()
        self.dtype = np.dtype(np.float16 if self.fp16 else np.float32)
        self._buffers: list[Buffer] = []
        self._dispatches: list[tuple[Any, list[Buffer], bytes, tuple[int, int, int]]] = []

    def upload(self, x: np.ndarray) -> Buffer:
        buf = self.alloc(x.size)
        if x.size:
            if self.fp16:
                with np.errstate(over="ignore"):  # beyond fp16's range -> inf, as on the device
                    x = x.astype(np.float16)
            buf.write(x)
        return buf

    def alloc(self, numel: int) -> Buffer:
        buf = self.device.buffer(-(-max(numel, 1) * self.dtype.itemsize // 4) * 4)
        self._buffers.append(buf)
        return buf

    def dummy(self) -> Buffer:
        return self.alloc(1)

    def add(self, shader: str, buffers: list[Buffer], fmt: str, values: Sequence[int | float],
            groups: tuple[int, int, int], spec: Sequence[int] = ()) -> None:
        kernel = self.device.kernel(shader + "_fp16" if self.fp16 else shader, spec)
        self._dispatches.append((kernel, buffers, pack(fmt, *values), groups))

    def groups_1d(self, n: int, local: int) -> tuple[int, int, int]:
        """A 1-D grid for a grid-stride loop over ``n`` items."""
        return (max(1, min(-(-n // local), self.device.info.max_workgroup_count[0], 65535)), 1, 1)

    def run(self, out: Buffer, shape: Sequence[int]) -> np.ndarray:
        try:
            if self._dispatches:
                self.device.submit(self._dispatches)
            return out.read(shape, self.dtype).astype(np.float32, copy=False)
        finally:
            self.release()

    def release(self) -> None:
        for buf in self._buffers:
            buf.release()
        self._buffers.clear()

    def __enter__(self) -> Launch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
