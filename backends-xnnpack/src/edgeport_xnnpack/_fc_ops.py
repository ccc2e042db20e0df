"""Float32 fully connected layers on XNNPACK's *operator* API, packed once and shared by every specialization.

The 2022 libXNNPACK cannot reshape a runtime and has no weights cache (``xnn_create_weights_cache`` came later), so
each runtime created for a new input shape packed every filter again: a Llama decoder's first one-token call spent
most of its ~100 ms there. Its operator API separates the two: ``xnn_create_fully_connected_nc_f32`` packs the filter
and bias once, and ``xnn_setup_fully_connected_nc_f32`` takes the batch (rows) and buffers of each run. So a
float32 fully connected node with constant weights runs as an operator step of its own: :class:`PackedFullyConnected`
(one per node and delegate, made at the first plan and reused by every later one) and, per plan,
:class:`FullyConnected` (its rows and bound buffers). The runtime's fully connected node calls the same two
functions with the same arguments (``src/subgraph/fully-connected.c`` of that snapshot), so the outputs are the same
bits. Several plans' runs share one operator: the C glue's operator kind keeps a shared cell saying which run set it
up last (see ``_glue.c``); the Python path reads and writes the same cell (its mark: the run's ``id``).

On CPUs with AVX-512F (and the ``_gemm`` extension built), the operator is edgeport's stand-in
``_gemm.HostFullyConnected`` (``_gemm_fc.c``), driven through the same setup / run calls: bit-identical to the
library's (each output its bias, then one fused multiply-add per input channel in order, then the clamp), but its
one-row path reads four filter panels at once with a prefetch, where the 2022 library streams one (a decoder's
one-token step is these products). It packs its own copy of the filter (the library then packs nothing).
:data:`HOST_KERNEL` ``False`` keeps the library's operator (for comparisons). Where the stand-in runs, float32 1x1
stride-1 convolutions of every delegate (static shapes too) run on it as well (:func:`conv_operands`: in NHWC the
product of the N*H*W input rows with the filter): its 7x32 tiles take 0.75-1.0x the library's time on MobileNetV2's
shapes, bit-identical. Torch-free.
"""

from __future__ import annotations

import ctypes
import math
import weakref
from ctypes import POINTER, c_float, c_int, c_size_t, c_uint32, c_void_p
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    from edgeport_xnnpack import _gemm
except ImportError:  # pragma: no cover - built without a C compiler
    _gemm = None
from edgeport_xnnpack import native  # noqa: F401  (first: it imports _native_run at its end)
from edgeport_xnnpack import _native_run
from edgeport_xnnpack._native_run import (
    _PAGE,
    EXTRA_BYTES,
    XnnpackError,
    _Bindings,
    _Busy,
    _fn_address,
    _NativeObject,
    _raise_status,
    library,
)
from edgeport_xnnpack._operator_step import OperatorStep
from edgeport_xnnpack.schema.graph import FP32, TensorValue, XNode

__all__ = ["FullyConnected", "FullyConnectedStep", "PackedFullyConnected", "available", "conv_operands",
           "fc_operands", "host_kernel_available", "operator_operands"]

_FNS = ("xnn_create_fully_connected_nc_f32", "xnn_setup_fully_connected_nc_f32", "xnn_run_operator",
        "xnn_delete_operator")
_TRANSPOSE_WEIGHTS = 0x1
_RESHAPE_2D = 0x4  # XNN_FLAG_TENSORFLOW_RESHAPE_2D: the subgraph's batch is the element count / k either way
_RUNNING = "this XNNPACK operator is already running (calls must not overlap)"
#: plan float32 fully connected nodes on shared operators where the library and glue allow (``False``: inside the
#: runtimes as before, each specialization packing its own filters; for comparisons)
ENABLED = True
#: run the float32 fully connected operator on ``_gemm.HostFullyConnected`` where this CPU runs it (see above)
HOST_KERNEL = True
#: a 1x1 convolution smaller than this (multiply-adds) stays inside its XNNPACK runtime: ~0.03 ms of one AVX-512
#: core, below which the step boundary costs more than the faster tile saves
MIN_CONV_MACS = 1 << 20
_SETUP_TYPE = ctypes.CFUNCTYPE(c_int, c_void_p, c_size_t, c_void_p, c_void_p, c_void_p)
_RUN_TYPE = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p)
_typed: set[int] = set()


def _functions(lib: Any) -> bool:
    """Type the operator functions of ``lib`` (once); ``False`` when the library lacks one."""
    x = lib.xnn
    if id(x) in _typed:
        return True
    if not all(hasattr(x, n) for n in _FNS):
        return False
    x.xnn_create_fully_connected_nc_f32.restype = c_int
    x.xnn_create_fully_connected_nc_f32.argtypes = (c_size_t, c_size_t, c_size_t, c_size_t, c_void_p, c_void_p,
                                                    c_float, c_float, c_uint32, POINTER(c_void_p))
    x.xnn_setup_fully_connected_nc_f32.restype = c_int
    x.xnn_setup_fully_connected_nc_f32.argtypes = (c_void_p, c_size_t, c_void_p, c_void_p, c_void_p)
    x.xnn_run_operator.restype, x.xnn_run_operator.argtypes = c_int, (c_void_p, c_void_p)
    x.xnn_delete_operator.restype, x.xnn_delete_operator.argtypes = c_int, (c_void_p,)
    _typed.add(id(x))
    return True


def available() -> bool:
    """:data:`ENABLED`, the library exports the float32 fully connected operator, and the C glue (when built) can
    drive it."""
    glue = _native_run._glue
    if not ENABLED:
        return False
    try:
        lib = library()
    except XnnpackError:
        return False
    return _functions(lib) and (glue is None or hasattr(glue, "KIND_OPERATOR"))


def host_kernel_available() -> bool:
    """:data:`HOST_KERNEL`, the ``_gemm`` extension is built, this CPU runs ``HostFullyConnected`` (AVX-512F) and
    ``EDGEPORT_XNNPACK_CONV_ISA=avx2`` does not cap edgeport's host kernels at AVX2 (the AVX2-emulated bench)."""
    from edgeport_xnnpack._host_conv import kernel_level

    return HOST_KERNEL and _gemm is not None and hasattr(_gemm, "HostFullyConnected") and _gemm.fc_isa() == 2 \
        and kernel_level() == 2


def _float_with_constant_weights(n: XNode, values: dict[int, TensorValue],
                                 const: dict[int, np.ndarray] | set[int]) -> bool:
    """``n`` reads an input, a constant filter and maybe a constant bias, all float32 and unquantized, as is its
    output."""
    ins, out = n.inputs(), n.outputs()[0]
    return len(ins) in (2, 3) and all(v in const for v in ins[1:]) and \
        all(values[v].datatype == FP32 and values[v].quant is None for v in (*ins, out))


def fc_operands(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]],
                const: dict[int, np.ndarray] | set[int]) -> tuple[int, int, int] | None:
    """``(rows, k, n)`` when ``n`` is a float32 fully connected node with a constant 2-D filter (and bias) the
    operator runs as the runtime would at these dims, else ``None``."""
    if n.kind != "XNNFullyConnected" or n.get("flags") & ~(_TRANSPOSE_WEIGHTS | _RESHAPE_2D):
        return None
    if not _float_with_constant_weights(n, values, const):
        return None
    ins, out = n.inputs(), n.outputs()[0]
    w = dims[ins[1]]
    if len(w) != 2:
        return None
    k, cols = (w[0], w[1]) if n.get("flags") & _TRANSPOSE_WEIGHTS else (w[1], w[0])
    if len(ins) == 3 and dims[ins[2]] != (cols,):
        return None
    elements = math.prod(dims[ins[0]])
    if k < 1 or cols < 1 or elements % k or math.prod(dims[out]) != elements // k * cols:
        return None
    return elements // k, k, cols


def conv_operands(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]],
                  const: dict[int, np.ndarray] | set[int]) -> tuple[int, int, int] | None:
    """``(rows, k, n)`` when ``n`` is a float32 1x1 convolution (stride 1, no padding, one group, no dilation) with
    a constant filter ``[n][1][1][k]`` (and bias) of at least :data:`MIN_CONV_MACS` multiply-adds and the host
    operator runs here: in XNNPACK's NHWC layout the product of ``rows = N*H*W`` input rows with the filter, which
    ``HostFullyConnected`` computes with the library's arithmetic (the library's 1x1 convolution is the same
    ``bias + in-order fused multiply-adds, clamped`` GEMM). Else ``None``: the library's runtime keeps it."""
    if n.kind != "XNNConv2d" or n.get("flags") or not host_kernel_available():
        return None
    if not all(n.get(f) == 1 for f in ("kernel_height", "kernel_width", "subsampling_height", "subsampling_width",
                                       "dilation_height", "dilation_width", "groups")):
        return None
    if any(n.get(f) for f in ("padding_top", "padding_right", "padding_bottom", "padding_left")):
        return None
    if not _float_with_constant_weights(n, values, const):
        return None
    ins, out = n.inputs(), n.outputs()[0]
    w, x, y = dims[ins[1]], dims[ins[0]], dims[out]
    if len(w) != 4 or w[1:3] != (1, 1) or len(x) != 4 or len(y) != 4 or x[3] != w[3] or y[:3] != x[:3] or \
            y[3] != w[0] or (len(ins) == 3 and dims[ins[2]] != (w[0],)):
        return None
    rows, k, cols = x[0] * x[1] * x[2], w[3], w[0]
    return (rows, k, cols) if rows >= 1 and rows * k * cols >= MIN_CONV_MACS else None


def operator_operands(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]],
                      const: dict[int, np.ndarray] | set[int]) -> tuple[int, int, int] | None:
    """``fc_operands`` or ``conv_operands``: the ``(rows, k, n)`` of a node the fully connected operator runs."""
    return fc_operands(n, values, dims, const) or conv_operands(n, values, dims, const)


class PackedFullyConnected:
    """``xnn_create_fully_connected_nc_f32`` of one node: the filter ``[n, k]`` (``[k, n]`` with
    ``XNN_FLAG_TRANSPOSE_WEIGHTS``) and bias packed once. Shared by the :class:`FullyConnected` runs of every plan
    of a delegate; :meth:`close` closes them and deletes the operator."""

    def __init__(self, k: int, n: int, filter_: np.ndarray, bias: np.ndarray | None, lo: float, hi: float,
                 flags: int) -> None:
        self.lib = library()
        if not _functions(self.lib):
            raise XnnpackError("this libXNNPACK has no xnn_create_fully_connected_nc_f32")
        for what, a, size in (("filter", filter_, k * n), ("bias", bias, n)):
            if a is not None and (not isinstance(a, np.ndarray) or a.dtype != np.float32 or
                                  not a.flags.c_contiguous or a.size != size):
                raise XnnpackError(f"fully connected {what}: a C-contiguous float32 array of {size} elements needed")
        if math.isnan(lo) or math.isnan(hi) or lo >= hi:
            raise XnnpackError(f"bad output range ({lo}, {hi})")
        self.host: Any = None  # the _gemm.HostFullyConnected, when that runs the node
        if host_kernel_available():
            pool = self.lib.pool
            self.host = _gemm.HostFullyConnected(filter_, bias, k, n, lo, hi, bool(flags & _TRANSPOSE_WEIGHTS),
                                                 _fn_address(pool.pthreadpool_parallelize_1d),
                                                 _fn_address(pool.pthreadpool_get_threads_count))
            self.handle: int | None = self.host.handle
            self.setup_fn, self.run_fn = _SETUP_TYPE(_gemm.FC_SETUP), _RUN_TYPE(_gemm.FC_RUN)
        else:
            h = c_void_p()
            self.lib.check(self.lib.xnn.xnn_create_fully_connected_nc_f32(
                k, n, k, n, filter_.ctypes.data, None if bias is None else bias.ctypes.data, lo, hi, flags,
                ctypes.byref(h)), "xnn_create_fully_connected_nc_f32")
            self.handle = h.value
            self.setup_fn, self.run_fn = self.lib.xnn.xnn_setup_fully_connected_nc_f32, self.lib.xnn.xnn_run_operator
        self.k, self.n = k, n
        self.cell = bytearray(16)  # which run set the operator up last (its address / id), and running (see _glue.c)
        self.busy = _Busy()
        self.runs: weakref.WeakSet[FullyConnected] = weakref.WeakSet()

    def close(self) -> None:
        for run in list(self.runs):
            run.close()
        if self.handle and self.host is None:
            self.lib.xnn.xnn_delete_operator(self.handle)
        self.handle, self.host = None, None

    def __del__(self) -> None:  # pragma: no cover - safety net
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class FullyConnected(_NativeObject):
    """One plan's run of a :class:`PackedFullyConnected`: ``batch`` rows of ``k`` floats into ``batch`` rows of
    ``n``. Set up again when a bound pointer changed or another run set the operator up since; ``close()`` closes
    this run only (the packed operator belongs to the delegate)."""

    def __init__(self, packed: PackedFullyConnected, batch: int, pool: Any = None) -> None:
        if not packed.handle:
            raise XnnpackError("the fully connected operator was deleted")
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch < 2**31:
            raise XnnpackError(f"fully connected batch must be an int in 1..2**31-1, got {batch!r}")
        self.lib, self.packed, self.batch, self.pool = packed.lib, packed, batch, pool
        self.handle: int | None = packed.handle
        self._setup_fn, self._run_fn = packed.setup_fn, packed.run_fn
        self._pool_handle = pool.handle if pool else None
        self._bindings = _Bindings(["input", "output"], [batch * packed.k * 4, batch * packed.n * 4], [False, True])
        self._setups = 0
        self._busy = packed.busy
        glue = _native_run._glue
        self.glue = None if glue is None else glue.Binding(
            glue.KIND_OPERATOR, self.handle, _fn_address(self._setup_fn), _fn_address(self._run_fn),
            [0, 1], self._bindings.nbytes, self._bindings.outputs, EXTRA_BYTES, _PAGE, _raise_status,
            self._pool_handle, batch, shared=packed.cell)
        packed.runs.add(self)

    def pin(self, src: np.ndarray | None = None, dst: np.ndarray | None = None) -> None:
        """Check once the input / output array that every later :meth:`run` binds (see ``_Bindings.pin``)."""
        for i, a in enumerate((src, dst)):
            if a is not None:
                self._bindings.pin(i, a)

    def run(self, src: np.ndarray, dst: np.ndarray) -> None:
        """``dst`` (``batch * n`` float32, writable) = the product of ``src`` (``batch * k`` float32); they must not
        overlap."""
        if not self.handle:
            raise XnnpackError("the fully connected operator was deleted")
        if self.glue is not None:
            self._glue_run((src, dst))
            return
        with self._busy.hold(_RUNNING):
            handle = self.handle
            if not handle:
                raise XnnpackError("the fully connected operator was deleted")
            b = self._bindings
            changed = b.bind((src, dst))
            if src.itemsize != 4 or dst.itemsize != 4:
                b.valid = False
                raise XnnpackError("the operator takes 32-bit elements")
            cell, mark = self.packed.cell, id(self).to_bytes(8, "little")
            if cell[8:16] != bytes(8):
                raise XnnpackError(_RUNNING)
            cell[8] = 1
            try:
                if changed or cell[:8] != mark:
                    b.valid = False
                    if np.shares_memory(src, dst):
                        raise XnnpackError("operator input and output overlap")
                    cell[:8] = bytes(8)
                    self.lib.check(self._setup_fn(handle, self.batch, b.ptrs[0], b.ptrs[1], self._pool_handle),
                                   "xnn_setup_fully_connected_nc_f32")
                    b.valid = True
                    cell[:8] = mark
                    self._setups += 1
                status = self._run_fn(handle, self._pool_handle)
                if status:
                    self.lib.check(status, "xnn_run_operator")
            finally:
                cell[8] = 0

    def _delete(self, handle: int) -> None:
        cell = self.packed.cell  # the operator itself is the PackedFullyConnected's: forget this run's mark only
        if cell[:8] == id(self).to_bytes(8, "little"):
            cell[:8] = bytes(8)


@dataclass
class FullyConnectedStep(OperatorStep):
    """A float32 fully connected node run by its delegate's shared :class:`PackedFullyConnected` operator (``op``: a
    :class:`FullyConnected` run of it)."""


def packed_for(n: XNode, k: int, cols: int, const: dict[int, np.ndarray], lo: float,
               hi: float) -> PackedFullyConnected:
    """A new :class:`PackedFullyConnected` of node ``n`` (its filter and bias from ``const``)."""
    ins = n.inputs()
    w = np.ascontiguousarray(const[ins[1]], np.float32).reshape(-1)
    b = np.ascontiguousarray(const[ins[2]], np.float32).reshape(-1) if len(ins) == 3 else None
    return PackedFullyConnected(k, cols, w, b, lo, hi, n.get("flags") & (_TRANSPOSE_WEIGHTS | _RESHAPE_2D))
