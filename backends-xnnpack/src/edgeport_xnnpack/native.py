"""ctypes binding of the system XNNPACK library (``libXNNPACK.so.0``, Debian's ``libxnnpack0``) and pthreadpool.

Torch-free. Every argument is checked in Python before a pointer reaches C: shapes (at most
``MAX_TENSOR_DIMS`` dimensions), value ids (defined in this subgraph), static data (a C-contiguous numpy array
with at least as many bytes as the tensor needs, kept alive as long as XNNPACK may read it), and external
buffers at setup (exact size, writable outputs). A failing XNNPACK call raises :class:`XnnpackError` naming the
call and the status; nothing here can crash the interpreter on bad input.

Only the definers this library exports are bound; :data:`Library.missing` lists the ones ExecuTorch's
XNNPACK delegate uses that the 2022 snapshot lacks (static transpose, concatenate, slice, batch matrix
multiply, copy, tanh, ...). The executor runs those as numpy steps between XNNPACK runtimes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import threading
from collections.abc import Iterable, Sequence
from ctypes import POINTER, c_float, c_int, c_int32, c_size_t, c_uint32, c_void_p
from typing import Any

import numpy as np

from edgeport_xnnpack import _threadpool

__all__ = [
    "DATATYPE_ITEMSIZE",
    "EXTRA_BYTES",
    "FLAG_EXTERNAL_INPUT",
    "FLAG_EXTERNAL_OUTPUT",
    "INVALID_VALUE_ID",
    "INSTALL_HINT",
    "ChannelShuffle",
    "Library",
    "MAX_TENSOR_DIMS",
    "Runtime",
    "Subgraph",
    "SharedPools",
    "ThreadPool",
    "shared_pools",
    "XnnpackError",
    "glue_status",
    "is_available",
    "library",
    "padded_empty",
    "pool_status",
]

INSTALL_HINT = (
    "install libxnnpack0 libpthreadpool0: apt-get install -y libxnnpack0 libpthreadpool0"
)
MAX_TENSOR_DIMS = 6
EXTRA_BYTES = 16  # XNNPACK may read (never write) this many bytes past an input tensor
INVALID_VALUE_ID = 0xFFFFFFFF
FLAG_EXTERNAL_INPUT = 0x1
FLAG_EXTERNAL_OUTPUT = 0x2
FLAG_TENSORFLOW_SAME_PADDING = 0x4
FLAG_TRANSPOSE_WEIGHTS = 0x1
FLAG_DEPTHWISE_CONVOLUTION = 0x1

# enum xnn_datatype of the header -> bytes per element
DATATYPE_ITEMSIZE = {1: 4, 2: 2, 3: 1, 4: 1, 5: 4, 6: 1, 7: 4}
DATATYPE_NAMES = {1: "fp32", 2: "fp16", 3: "qint8", 4: "quint8", 5: "qint32", 6: "qcint8", 7: "qcint32"}
_STATUS = {
    0: "success",
    1: "uninitialized",
    2: "invalid_parameter",
    3: "invalid_state",
    4: "unsupported_parameter",
    5: "unsupported_hardware",
    6: "out_of_memory",
}
_LIB_NAMES = ("libXNNPACK.so.0", "libXNNPACK.so", "libxnnpack.so.0", "libxnnpack.so")
_POOL_NAMES = ("libpthreadpool.so.0", "libpthreadpool.so")
_PAGE = 4096

U32, F32, SZ = c_uint32, c_float, c_size_t
_SP = POINTER(c_size_t)
# definer name -> argument types after the subgraph handle
_DEFINERS: dict[str, tuple[Any, ...]] = {
    "convert": (U32, U32, U32),
    "convolution_2d": (U32,) * 11 + (SZ, SZ, F32, F32, U32, U32, U32, U32, U32),
    "deconvolution_2d": (U32,) * 13 + (SZ, SZ, F32, F32, U32, U32, U32, U32, U32),
    "depthwise_convolution_2d": (U32,) * 11 + (SZ, F32, F32, U32, U32, U32, U32, U32),
    "depth_to_space": (U32, U32, U32, U32),
    "global_average_pooling_2d": (F32, F32, U32, U32, U32),
    "average_pooling_2d": (U32,) * 8 + (F32, F32, U32, U32, U32),
    "fully_connected": (F32, F32, U32, U32, U32, U32, U32),
    "max_pooling_2d": (U32,) * 10 + (F32, F32, U32, U32, U32),
    "argmax_pooling_2d": (U32,) * 6 + (U32, U32, U32, U32),
    "add2": (F32, F32, U32, U32, U32, U32),
    "multiply2": (F32, F32, U32, U32, U32, U32),
    "subtract": (F32, F32, U32, U32, U32, U32),
    "divide": (F32, F32, U32, U32, U32, U32),
    "maximum2": (U32, U32, U32, U32),
    "minimum2": (U32, U32, U32, U32),
    "squared_difference": (U32, U32, U32, U32),
    "static_constant_pad": (_SP, _SP, F32, U32, U32, U32),
    "static_reshape": (SZ, _SP, U32, U32, U32),
    "static_resize_bilinear_2d": (SZ, SZ, U32, U32, U32),
    "prelu": (U32, U32, U32, U32),
    "clamp": (F32, F32, U32, U32, U32),
    "elu": (F32, U32, U32, U32),
    "leaky_relu": (F32, U32, U32, U32),
    **{
        name: (U32, U32, U32)
        for name in (
            "abs", "bankers_rounding", "ceiling", "floor", "hardswish", "negate", "sigmoid", "softmax",
            "square", "square_root",
        )
    },
    # Present in newer XNNPACK releases only; bound when the library has them.
    "static_transpose": (SZ, _SP, U32, U32, U32),
    "concatenate2": (SZ, U32, U32, U32, U32),
    "concatenate3": (SZ, U32, U32, U32, U32, U32),
    "concatenate4": (SZ, U32, U32, U32, U32, U32, U32),
    "static_slice": (SZ, _SP, _SP, U32, U32, U32),
    "batch_matrix_multiply": (U32, U32, U32, U32),
    "copy": (U32, U32, U32),
    "tanh": (U32, U32, U32),
}
_OPERATOR_FNS = ("xnn_create_channel_shuffle_nc_x32", "xnn_setup_channel_shuffle_nc_x32", "xnn_run_operator",
                 "xnn_delete_operator")
_OPERATOR_FNS_X8 = ("xnn_create_channel_shuffle_nc_x8", "xnn_setup_channel_shuffle_nc_x8")
_WEIGHT_NODES = {"convolution_2d": 16, "deconvolution_2d": 18, "depthwise_convolution_2d": 15,
                 "fully_connected": 3}  # argument index of filter_id; bias_id follows


class XnnpackError(RuntimeError):
    """An XNNPACK call failed, or an argument was refused before the call."""


class _ExternalValue(ctypes.Structure):
    _fields_ = [("id", c_uint32), ("data", c_void_p)]


def _status_name(code: int) -> str:
    return _STATUS.get(code, f"status {code}")


def _u32(value: Any, what: str) -> int:
    if type(value) is int and 0 <= value <= 0xFFFFFFFF:
        return value  # the common case, checked first
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) <= 0xFFFFFFFF:
        raise XnnpackError(f"{what} must be an integer in 0..2**32-1, got {value!r}")
    return int(value)


def _dims(dims: Iterable[Any], what: str = "dims") -> list[int]:
    if type(dims) is tuple and len(dims) <= MAX_TENSOR_DIMS and all(type(d) is int and 0 <= d <= 0x7FFFFFFF
                                                                    for d in dims):
        return list(dims)  # the common case (a planner's dims), checked first
    out = [int(d) if isinstance(d, (int, np.integer)) and not isinstance(d, bool) else -1 for d in dims]
    if len(out) > MAX_TENSOR_DIMS:
        raise XnnpackError(f"{what}: {len(out)} dimensions, XNNPACK allows at most {MAX_TENSOR_DIMS}")
    if any(d < 0 or d > 0x7FFFFFFF for d in out):
        raise XnnpackError(f"{what}: invalid dimensions {list(dims)!r}")
    return out


def _size_array(values: Sequence[int]) -> Any:
    n = len(values)
    return (_SIZE_ARRAYS[n] if n < len(_SIZE_ARRAYS) else c_size_t * n)(*values)


_SIZE_ARRAYS = [c_size_t * max(n, 1) for n in range(9)]  # made once: an array type costs more than its array


class Library:
    """The loaded shared libraries and their typed functions."""

    def __init__(self) -> None:
        own, self.pool_reason = _threadpool.open_own()  # before libXNNPACK: it then binds to edgeport's pool
        self.xnn, self.xnn_name = self._open(_LIB_NAMES, "XNNPACK")
        if own is not None:
            self.pool_reason = _threadpool.binding_problem(own, self.xnn)
        #: edgeport's pool is in use (its functions are the ones libXNNPACK calls)
        self.own_pool = own is not None and not self.pool_reason
        if self.own_pool:
            self.pool, self.pool_name = own, "edgeport_xnnpack._pool"
        elif own is not None:  # loaded but not bound: the pool functions libXNNPACK's own dependency defines
            self.pool, self.pool_name = self.xnn, "libXNNPACK's libpthreadpool dependency"
        else:
            self.pool, self.pool_name = self._open(_POOL_NAMES, "pthreadpool")
        x, p = self.xnn, self.pool
        self._fn(x, "xnn_initialize", c_int, c_void_p)
        self._fn(x, "xnn_create_subgraph", c_int, U32, U32, POINTER(c_void_p))
        self._fn(x, "xnn_delete_subgraph", c_int, c_void_p)
        self._fn(x, "xnn_define_tensor_value", c_int, c_void_p, c_int, SZ, _SP, c_void_p, U32, U32, POINTER(U32))
        self._fn(x, "xnn_define_quantized_tensor_value", c_int, c_void_p, c_int, c_int32, F32, SZ, _SP,
                 c_void_p, U32, U32, POINTER(U32))
        self._fn(x, "xnn_define_channelwise_quantized_tensor_value", c_int, c_void_p, c_int, POINTER(F32), SZ,
                 SZ, _SP, c_void_p, U32, U32, POINTER(U32))
        self._fn(x, "xnn_create_runtime_v2", c_int, c_void_p, c_void_p, U32, POINTER(c_void_p))
        self._fn(x, "xnn_setup_runtime", c_int, c_void_p, SZ, POINTER(_ExternalValue))
        self._fn(x, "xnn_invoke_runtime", c_int, c_void_p)
        self._fn(x, "xnn_delete_runtime", c_int, c_void_p)
        self.operators = all(hasattr(x, n) for n in _OPERATOR_FNS)
        if self.operators:
            self._fn(x, "xnn_create_channel_shuffle_nc_x32", c_int, SZ, SZ, SZ, SZ, U32, POINTER(c_void_p))
            self._fn(x, "xnn_setup_channel_shuffle_nc_x32", c_int, c_void_p, SZ, c_void_p, c_void_p, c_void_p)
            self._fn(x, "xnn_run_operator", c_int, c_void_p, c_void_p)
            self._fn(x, "xnn_delete_operator", c_int, c_void_p)
        #: the 8-bit channel shuffle (int8 transposes of ExecuTorch-written quantized blobs)
        self.operators_x8 = self.operators and all(hasattr(x, n) for n in _OPERATOR_FNS_X8)
        if self.operators_x8:
            self._fn(x, "xnn_create_channel_shuffle_nc_x8", c_int, SZ, SZ, SZ, SZ, U32, POINTER(c_void_p))
            self._fn(x, "xnn_setup_channel_shuffle_nc_x8", c_int, c_void_p, SZ, c_void_p, c_void_p, c_void_p)
        self._fn(p, "pthreadpool_create", c_void_p, SZ)
        self._fn(p, "pthreadpool_destroy", None, c_void_p)
        self._fn(p, "pthreadpool_get_threads_count", SZ, c_void_p)
        self.definers: dict[str, Any] = {}
        self.missing: list[str] = []
        for name, argtypes in _DEFINERS.items():
            fn = getattr(x, f"xnn_define_{name}", None)
            if fn is None:
                self.missing.append(name)
                continue
            fn.restype, fn.argtypes = c_int, (c_void_p, *argtypes)
            self.definers[name] = fn
        status = x.xnn_initialize(None)
        if status != 0:
            raise XnnpackError(f"xnn_initialize failed: {_status_name(status)}")

    @staticmethod
    def _open(names: Sequence[str], what: str) -> tuple[ctypes.CDLL, str]:
        candidates = list(names)
        found = ctypes.util.find_library(what)
        if found:
            candidates.append(found)
        errors = []
        for name in candidates:
            try:
                return ctypes.CDLL(name, mode=_threadpool.MODE), name
            except OSError as exc:
                errors.append(str(exc))
        raise OSError(f"cannot load {what} ({', '.join(candidates)}): {errors[0] if errors else ''}")

    @staticmethod
    def _fn(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> None:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes

    def has(self, definer: str) -> bool:
        return definer in self.definers

    def check(self, status: int, call: str) -> None:
        if status != 0:
            raise XnnpackError(f"{call} failed: {_status_name(status)}")


_lock = threading.Lock()
_library: Library | None = None
_error: str | None = None


def library() -> Library:
    """The process-wide :class:`Library` (loaded and initialized once); raises :class:`XnnpackError`."""
    global _library, _error
    with _lock:
        if _library is None and _error is None:
            try:
                _library = Library()
            except (OSError, AttributeError, XnnpackError) as exc:
                _error = f"{exc}; {INSTALL_HINT}"
        if _library is None:
            raise XnnpackError(_error or INSTALL_HINT)
        return _library


def is_available() -> tuple[bool, str]:
    """``(True, "")`` when libXNNPACK and libpthreadpool load and initialize, else ``(False, reason)``."""
    try:
        library()
    except XnnpackError as exc:
        return False, str(exc)
    return True, ""


def pool_status() -> tuple[str, str]:
    """``("edgeport", "")`` when libXNNPACK runs on edgeport's thread pool (``edgeport_xnnpack._pool``), else
    ``("system", reason)``; raises :class:`XnnpackError` when the libraries are unavailable."""
    lib = library()
    return ("edgeport", "") if lib.own_pool else ("system", lib.pool_reason)


def default_num_threads() -> int:
    """``EDGEPORT_XNNPACK_THREADS`` if set, else the cores this process may use: its affinity mask, capped by its
    cgroups' CPU quota (a container's ``--cpus``)."""
    env = os.environ.get("EDGEPORT_XNNPACK_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        cores = max(1, os.cpu_count() or 1)
    quota = _threadpool.cpu_quota()
    return min(cores, quota) if quota else cores


class ThreadPool:
    """A pthreadpool of ``num_threads`` threads (1 runs on the caller's thread; no pool is created)."""

    def __init__(self, num_threads: int | None = None) -> None:
        self.lib = library()
        n = default_num_threads() if num_threads is None else num_threads
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1024:
            raise XnnpackError(f"num_threads must be an int in 1..1024, got {num_threads!r}")
        self.handle: int | None = None
        if n > 1:
            self.handle = self.lib.pool.pthreadpool_create(n)
            if not self.handle:
                raise XnnpackError(f"pthreadpool_create({n}) failed")
            if os.environ.get(_threadpool.LOAD_ENV, "").strip().lower() in ("0", "off"):
                self.set_load_gauge(0)  # a diagnostic for benchmarks: always offer every thread
        self.num_threads = n

    def stats(self) -> dict[str, int] | None:
        """Counters of edgeport's pool (``None`` for the system pool or a 1-thread one): ``calls`` (parallel
        requests), ``parallel`` (run with workers), ``inline_busy`` (run on the caller: the pool was busy with
        another thread's call), ``solo`` (run on the caller: contention back-off), ``late`` (waits for a
        preempted worker), ``joins`` (workers that took part), ``moved`` (woken workers that found themselves on
        their caller's CPU and moved to another)."""
        if not (self.handle and self.lib.own_pool):
            return None
        out = (ctypes.c_uint64 * 6)()
        self.lib.pool.edgeport_pool_stats(self.handle, out)
        stats = dict(zip(("calls", "parallel", "inline_busy", "solo", "late", "joins"), out, strict=True))
        if hasattr(self.lib.pool, "edgeport_pool_moved"):
            stats["moved"] = self.lib.pool.edgeport_pool_moved(self.handle)
        return stats

    def set_policy(self, spin_us: float, backoff_ms: float) -> bool:
        """Set edgeport's pool's policy: a worker's spin after a job before it parks (us) and the first solo
        period after a wait for a preempted worker (ms; 0: never run solo). ``False`` (nothing changed) for the
        system pool or a 1-thread one; ``XnnpackError`` for values out of range (spin 0..1e6 us, back-off 0 or
        1..1000 ms)."""
        if not (self.handle and self.lib.own_pool and hasattr(self.lib.pool, "edgeport_pool_set_policy")):
            return False
        if self.lib.pool.edgeport_pool_set_policy(self.handle, int(spin_us * 1e3), int(backoff_ms * 1e6)) != 0:
            raise XnnpackError(f"bad pool policy: spin {spin_us} us, back-off {backoff_ms} ms")
        return True

    def set_load_gauge(self, period_ms: float, path: str | None = None, online: int = 0) -> bool:
        """Set edgeport's pool's load gauge: re-read the machine's CPU time from ``path`` (default ``/proc/stat``;
        its ``cpu`` line) at most every ``period_ms`` (0: off, every call may use every thread) and use only as many
        threads as ``online`` CPUs (0: the machine's) leave free. ``False`` for the system pool or a 1-thread one;
        ``XnnpackError`` for values out of range (0 or 0.1..10000 ms) or a file that cannot be opened."""
        if not (self.handle and self.lib.own_pool and hasattr(self.lib.pool, "edgeport_pool_set_load_gauge")):
            return False
        raw = None if path is None else os.fsencode(path)
        if self.lib.pool.edgeport_pool_set_load_gauge(self.handle, int(period_ms * 1e6), raw, int(online)) != 0:
            raise XnnpackError(f"bad load gauge: period {period_ms} ms, file {path!r}, {online} CPUs")
        return True

    def load_stats(self) -> dict[str, float] | None:
        """The load gauge's state (``None`` for the system pool or a 1-thread one): ``solo`` (calls run on the
        caller alone because of the load), ``limited`` (calls run on fewer threads than the pool has), ``reads``
        (of the load file), ``threads`` (what the next call may use), ``others`` (average cores other programs
        keep busy)."""
        if not (self.handle and self.lib.own_pool and hasattr(self.lib.pool, "edgeport_pool_load_stats")):
            return None
        out = (ctypes.c_uint64 * 5)()
        self.lib.pool.edgeport_pool_load_stats(self.handle, out)
        return {"solo": out[0], "limited": out[1], "reads": out[2], "threads": out[3], "others": out[4] / 1000}

    def close(self) -> None:
        if self.handle:
            self.lib.pool.pthreadpool_destroy(self.handle)
        self.handle = None

    def __del__(self) -> None:  # pragma: no cover - safety net
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class SharedPools:
    """Process-wide thread pools, one per thread count, shared by every delegate that asks for that count.

    One pool per delegate would leave a program with many delegates (a transformer: 12) with as many sets of
    spinning worker threads competing for the same cores; measured in ``bench/xnnpack.py`` that made a 12-delegate
    encoder ~19x slower than with one shared pool. pthreadpool serializes concurrent ``parallelize`` calls on one
    pool, so sharing is safe. Pools are reference counted and destroyed when their last user releases them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: dict[int, tuple[ThreadPool, int]] = {}

    def acquire(self, num_threads: int | None) -> ThreadPool:
        n = default_num_threads() if num_threads is None else num_threads
        with self._lock:
            pool, users = self._pools.get(n, (None, 0))
            if pool is None:
                pool = ThreadPool(n)
            self._pools[n] = (pool, users + 1)
            return pool

    def release(self, pool: ThreadPool) -> None:
        with self._lock:
            entry = self._pools.get(pool.num_threads)
            if entry is None or entry[0] is not pool:
                pool.close()
                return
            if entry[1] <= 1:
                del self._pools[pool.num_threads]
                pool.close()
            else:
                self._pools[pool.num_threads] = (pool, entry[1] - 1)

    def users(self, num_threads: int) -> int:
        with self._lock:
            return self._pools.get(num_threads, (None, 0))[1]


shared_pools = SharedPools()


class Subgraph:
    """An ``xnn_subgraph_t`` with checked definers. ``close()`` (or a created runtime) frees it."""

    def __init__(self, num_external: int) -> None:
        self.lib = library()
        self.num_external = _u32(num_external, "num_external")
        h = c_void_p()
        self.lib.check(self.lib.xnn.xnn_create_subgraph(self.num_external, 0, ctypes.byref(h)), "xnn_create_subgraph")
        self.handle: int | None = h.value
        self.shapes: dict[int, tuple[int, tuple[int, ...]]] = {}  # id -> (datatype, dims)
        self.flags: dict[int, int] = {}
        self.static: dict[int, np.ndarray] = {}
        self._reads: dict[int, set[str]] = {}  # static id -> roles it is read in ("weight" or "input")

    # -- values ---------------------------------------------------------------------------------------------
    def _tensor_args(self, datatype: int, dims: Sequence[int], data: np.ndarray | None, external_id: int,
                     flags: int) -> tuple[list[int], Any, int, int]:
        if datatype not in DATATYPE_ITEMSIZE:
            raise XnnpackError(f"unknown XNNPACK datatype {datatype!r}")
        d = _dims(dims)
        external_id = _u32(external_id, "external_id")
        flags = _u32(flags, "value flags")
        if flags & ~(FLAG_EXTERNAL_INPUT | FLAG_EXTERNAL_OUTPUT):
            raise XnnpackError(f"unsupported value flags {flags:#x}")
        if external_id != INVALID_VALUE_ID and external_id >= self.num_external:
            raise XnnpackError(f"external id {external_id} out of range (subgraph reserves {self.num_external})")
        if flags and external_id == INVALID_VALUE_ID:
            raise XnnpackError("an external input/output value needs an external id")
        ptr = None
        if data is not None:
            if flags:
                raise XnnpackError("a static value cannot be an external input or output")
            if not isinstance(data, np.ndarray) or not data.flags.c_contiguous:
                raise XnnpackError("static data must be a C-contiguous numpy array")
            need = math.prod(d) * DATATYPE_ITEMSIZE[datatype]
            if data.nbytes < need:
                raise XnnpackError(f"static data has {data.nbytes} bytes, shape {d} needs {need}")
            ptr = data.ctypes.data
        return d, ptr, external_id, flags

    def _record(self, vid: int, datatype: int, dims: list[int], data: np.ndarray | None, flags: int) -> int:
        self.shapes[vid] = (datatype, tuple(dims))
        self.flags[vid] = flags
        if data is not None:
            self.static[vid] = data
        return vid

    def define_tensor(self, datatype: int, dims: Sequence[int], data: np.ndarray | None = None,
                      external_id: int = INVALID_VALUE_ID, flags: int = 0) -> int:
        d, ptr, ext, flags = self._tensor_args(datatype, dims, data, external_id, flags)
        out = c_uint32()
        self.lib.check(self.lib.xnn.xnn_define_tensor_value(
            self._h(), datatype, len(d), _size_array(d), ptr, ext, flags, ctypes.byref(out)),
            "xnn_define_tensor_value")
        return self._record(out.value, datatype, d, data, flags)

    def define_quantized_tensor(self, datatype: int, zero_point: int, scale: float, dims: Sequence[int],
                                data: np.ndarray | None = None, external_id: int = INVALID_VALUE_ID,
                                flags: int = 0) -> int:
        d, ptr, ext, flags = self._tensor_args(datatype, dims, data, external_id, flags)
        if not isinstance(zero_point, (int, np.integer)) or not -(2**31) <= int(zero_point) < 2**31:
            raise XnnpackError(f"zero_point must be an int32, got {zero_point!r}")
        if not (isinstance(scale, (float, int, np.floating)) and math.isfinite(scale) and scale > 0):
            raise XnnpackError(f"scale must be a positive finite number, got {scale!r}")
        out = c_uint32()
        self.lib.check(self.lib.xnn.xnn_define_quantized_tensor_value(
            self._h(), datatype, int(zero_point), float(scale), len(d), _size_array(d), ptr, ext, flags,
            ctypes.byref(out)), "xnn_define_quantized_tensor_value")
        return self._record(out.value, datatype, d, data, flags)

    def define_channelwise_quantized_tensor(self, datatype: int, scales: np.ndarray, dims: Sequence[int],
                                            channel_dim: int, data: np.ndarray | None = None,
                                            external_id: int = INVALID_VALUE_ID, flags: int = 0) -> int:
        d, ptr, ext, flags = self._tensor_args(datatype, dims, data, external_id, flags)
        if not isinstance(channel_dim, int) or not 0 <= channel_dim < len(d):
            raise XnnpackError(f"channel_dim {channel_dim!r} out of range for {len(d)} dims")
        scales = np.ascontiguousarray(scales, dtype=np.float32)
        if scales.shape != (d[channel_dim],) or not np.all(np.isfinite(scales)) or np.any(scales <= 0):
            raise XnnpackError(f"need {d[channel_dim]} positive finite scales, got shape {scales.shape}")
        out = c_uint32()
        self.lib.check(self.lib.xnn.xnn_define_channelwise_quantized_tensor_value(
            self._h(), datatype, scales.ctypes.data_as(POINTER(c_float)), len(d), channel_dim, _size_array(d),
            ptr, ext, flags, ctypes.byref(out)), "xnn_define_channelwise_quantized_tensor_value")
        self.static.setdefault(-1 - out.value, scales)  # XNNPACK keeps a pointer to the scales
        return self._record(out.value, datatype, d, data, flags)

    # -- nodes ----------------------------------------------------------------------------------------------
    def define(self, definer: str, *args: Any, inputs: Sequence[int] = (), outputs: Sequence[int] = ()) -> None:
        """Call ``xnn_define_<definer>(subgraph, *args)``; ``inputs``/``outputs`` name the value ids it uses
        (checked to be defined here; outputs must not be static)."""
        fn = self.lib.definers.get(definer)
        if fn is None:
            raise XnnpackError(f"this libXNNPACK has no xnn_define_{definer}")
        for vid in (*inputs, *outputs):
            if vid != INVALID_VALUE_ID and vid not in self.shapes:
                raise XnnpackError(f"xnn_define_{definer}: value id {vid} is not defined in this subgraph")
        for vid in outputs:
            if vid in self.static:
                raise XnnpackError(f"xnn_define_{definer}: output value {vid} is static")
        weights = set()
        if definer in _WEIGHT_NODES:
            i = _WEIGHT_NODES[definer]
            weights = {int(args[i]), int(args[i + 1])}
        for vid in inputs:
            if vid in self.static:
                self._reads.setdefault(vid, set()).add("weight" if vid in weights else "input")
        converted = []
        for a, t in zip(args, fn.argtypes[1:], strict=True):
            if t is c_uint32:
                converted.append(_u32(a, f"xnn_define_{definer} argument"))
            elif t is c_size_t:
                if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not 0 <= int(a) < 2**62:
                    raise XnnpackError(f"xnn_define_{definer}: bad size argument {a!r}")
                converted.append(int(a))
            elif t is c_float:
                converted.append(float(a))
            else:  # size_t* arrays
                converted.append(_size_array(_dims(a, f"xnn_define_{definer} array argument")))
        self.lib.check(fn(self._h(), *converted), f"xnn_define_{definer}")

    def _h(self) -> int:
        if not self.handle:
            raise XnnpackError("the subgraph was already deleted")
        return self.handle

    def close(self) -> None:
        if self.handle:
            self.lib.xnn.xnn_delete_subgraph(self.handle)
        self.handle = None

    def __del__(self) -> None:  # pragma: no cover - safety net
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


# Runtimes and operators (binding, setup caching) live in _native_run, which imports this module; they are
# re-exported here on first access (PEP 562), so that either module can be imported first (an import at the end of
# this module made ``import edgeport_xnnpack._native_run`` fail when nothing had imported this one before).
_FROM_NATIVE_RUN = frozenset({"ChannelShuffle", "Runtime", "glue_status", "padded_empty"})


def __getattr__(name: str) -> Any:
    if name in _FROM_NATIVE_RUN:
        from edgeport_xnnpack import _native_run

        return getattr(_native_run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
