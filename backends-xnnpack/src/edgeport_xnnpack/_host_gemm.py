"""Float32 fully-connected layers and 1x1 convolutions on the host BLAS (torch-free).

Debian's 2022 libXNNPACK runs these products well on AVX-512 CPUs but, on CPUs with AVX2 only, at ~40% of the
core's peak: its FMA3 micro-kernels are the ceiling there (``bench/REPORT.md``, "XNNPACK per node kind (AVX2
emulated)"). So ``XnnpackRuntimeOptions.fully_connected`` chooses where they run:

- ``"xnnpack"``: inside the delegate's XNNPACK runtimes, as ExecuTorch does;
- ``"host"``: as host steps of ``edgeport_xnnpack._gemm``, tiled over the delegate's own XNNPACK thread pool (no
  second set of worker threads): from 6 rows up, a 6x16 AVX2/FMA micro-kernel on the filter packed once at load
  (XNNPACK's own scheme: the input is read in place; 0.66-0.93x OpenBLAS's time on every MobileNetV2 and encoder
  shape, which packs the whole input first), below that (a single token) OpenBLAS's ``sgemv`` / ``sgemm``; numpy's
  matmul when the extension is not built;
- ``"host-conv"``: float32 dense convolutions of more than one tap (3x3, 7x7, ...; one group, no dilation) on
  ``edgeport_xnnpack._host_conv``'s indirect-GEMM kernel (AVX-512 7x32 / AVX2 6x16, bit-identical to libXNNPACK);
- ``"auto"`` (the default): ``"host-float"`` on x86-64 CPUs with AVX2 and without AVX-512F when the extension runs
  the micro-kernel, ``"host-conv"`` where the convolution kernel runs, ``"host-int8"`` with AVX512-VNNI.

Choices combine with ``+`` (``"host-float+host-conv"``); ``"host"`` is all three.

Only products big enough to pay for a step boundary move (``MIN_MACS``), and only float32 ones with constant
weights: fully-connected layers, and 1x1 stride-1 unpadded single-group convolutions (in XNNPACK's NHWC layout the
same matrix product). The handle's summary says which choice a delegate runs with.
"""

from __future__ import annotations

import ctypes
import math
import platform
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edgeport_xnnpack import _host_conv, _host_qs8
from edgeport_xnnpack._blas import cblas_address
from edgeport_xnnpack._host import HostOp
from edgeport_xnnpack.schema.graph import FP32, TensorValue, XNode

try:
    from edgeport_xnnpack import _gemm
except ImportError:  # pragma: no cover - built without a C compiler
    _gemm = None

CHOICES = ("auto", "xnnpack", "host", "host-float", "host-int8", "host-conv")
_KIND = {"host-float": "float", "host-int8": "int8", "host-conv": "conv"}
MIN_FLOAT_ROWS = 6  # the micro-kernel's row block; see wants_host
MIN_MACS = 1 << 20  # ~0.05 ms of one AVX2 core: below this a step boundary costs more than the faster kernel saves
_TRANSPOSE_WEIGHTS = 1  # XNN_FLAG_TRANSPOSE_WEIGHTS: a fully-connected filter stored [in, out]
_RESHAPE_2D = 4  # XNN_FLAG_TENSORFLOW_RESHAPE_2D


def cpu_flags() -> set[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:  # pragma: no cover - not Linux
        pass
    return set()


def kernel_available() -> bool:
    """The C extension is built and this CPU runs its AVX2/FMA micro-kernel."""
    return _gemm is not None and bool(_gemm.packed_available())


def _blas_pair() -> tuple[int, int, bool] | None:
    """``(sgemm, sgemv, ilp64)`` addresses of numpy's OpenBLAS, or ``None``."""
    gemm, gemv = cblas_address("sgemm"), cblas_address("sgemv")
    if gemm is None or gemv is None or gemm[1] != gemv[1]:
        return None
    return gemm[0], gemv[0], gemm[1]


def resolve(choice: str, flags: set[str] | None = None) -> frozenset[str]:
    """Which products run on the host for a ``fully_connected`` option value: a subset of ``{"float", "int8"}``
    (see the module docstring; ``flags``: the CPU's, from ``/proc/cpuinfo`` unless given)."""
    parts = choice.split("+")
    if not all(p in CHOICES for p in parts) or (len(parts) > 1 and not all(p in _KIND for p in parts)):
        raise ValueError(f"fully_connected must be one of {list(CHOICES)} or a '+'-joined combination of "
                         f"{list(_KIND)}, got {choice!r}")
    int8_ok = _host_qs8.kernel_available()
    conv_ok = _host_conv.kernel_level() > 0
    if choice == "xnnpack":
        return frozenset()
    if len(parts) > 1 or choice in _KIND:
        kinds = frozenset(_KIND[p] for p in parts)
        if "int8" in kinds and not int8_ok:
            raise ValueError("fully_connected='host-int8' needs a CPU with AVX512-VNNI and the C extension "
                             "edgeport_xnnpack._gemm; use 'auto' or 'xnnpack'")
        if "conv" in kinds and not conv_ok:
            raise ValueError("fully_connected='host-conv' needs an x86-64 CPU with AVX2 and FMA and the C "
                             "extension edgeport_xnnpack._gemm; use 'auto' or 'xnnpack'")
        return kinds
    if choice == "host":
        return frozenset({"float"} | ({"int8"} if int8_ok else set()) | ({"conv"} if conv_ok else set()))
    flags = cpu_flags() if flags is None else flags
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    kinds = set()
    if x86 and {"avx2", "fma"} <= flags and "avx512f" not in flags and kernel_available():
        kinds.add("float")
    if x86 and "avx512_vnni" in flags and int8_ok:
        kinds.add("int8")
    if x86 and {"avx2", "fma"} <= flags and conv_ok:
        kinds.add("conv")
    return frozenset(kinds)


def describe(kinds: frozenset[str]) -> str:
    """``"xnnpack"`` or ``"host (float32, int8)"``-style: where a delegate's products run."""
    names = [name for kind, name in (("float", "float32"), ("int8", "int8"), ("conv", "float32 convolutions"))
             if kind in kinds]
    return f"host ({', '.join(names)})" if names else "xnnpack"


def choice_for(kinds: frozenset[str]) -> str:
    """The option value that selects exactly ``kinds``."""
    if not kinds:
        return "xnnpack"
    return "+".join(choice for choice, kind in _KIND.items() if kind in kinds)


def _float(v: TensorValue) -> bool:
    return v.datatype == FP32 and v.quant is None


def gemm_dims(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]],
              const: set[int]) -> tuple[int, int, int] | None:
    """``(m, k, n)`` of a float32 product with constant weights this module can run, else ``None``."""
    if n.kind == "XNNFullyConnected":
        if n.get("flags") & ~(_TRANSPOSE_WEIGHTS | _RESHAPE_2D):
            return None
    elif n.kind == "XNNConv2d":
        one = all(n.get(f) == 1 for f in ("kernel_height", "kernel_width", "subsampling_height", "subsampling_width",
                                          "dilation_height", "dilation_width", "groups"))
        pads = any(n.get(f) for f in ("padding_top", "padding_right", "padding_bottom", "padding_left"))
        if not one or pads or n.get("flags"):
            return None
    else:
        return None
    ins, out = n.inputs(), n.outputs()[0]
    if len(ins) not in (2, 3) or not all(v in const for v in ins[1:]):
        return None
    if not all(_float(values[v]) for v in (*ins, out)):
        return None
    w = dims[ins[1]]
    if n.kind == "XNNConv2d":
        if len(w) != 4 or len(dims[ins[0]]) != 4:
            return None
        cols, k = w[0], w[3]
    elif len(w) != 2:
        return None
    else:
        cols, k = (w[1], w[0]) if n.get("flags") & _TRANSPOSE_WEIGHTS else (w[0], w[1])
    rows = math.prod(dims[ins[0]]) // max(k, 1)
    if rows * k != math.prod(dims[ins[0]]) or rows * cols != math.prod(dims[out]):
        return None
    if len(ins) == 3 and dims[ins[2]] != (cols,):
        return None
    if n.kind == "XNNFullyConnected" and not n.get("flags") & _RESHAPE_2D and dims[ins[0]][-1] != k:
        return None
    return rows, k, cols


def product_dims(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]], const: set[int],
                 kinds: frozenset[str]) -> tuple[str, tuple[int, int, int]] | None:
    """``(kind, (m, k, n))`` of a product of one of ``kinds`` that runs on the host, else ``None``."""
    if "float" in kinds:
        mkn = gemm_dims(n, values, dims, const)
        if mkn is not None:
            return "float", mkn
    if "int8" in kinds:
        mkn = _host_qs8.qs8_dims(n, values, dims, const)
        if mkn is not None:
            return "int8", mkn
    if "conv" in kinds:
        mkn = _host_conv.conv_dims(n, values, dims, const)
        if mkn is not None:
            return "conv", mkn
    return None


def wants_host(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]], const: set[int],
               kinds: frozenset[str]) -> bool:
    """``n`` is a product of ``kinds`` this module runs, big enough (``MIN_MACS``) to be worth a host step. Float32
    products of fewer rows than the micro-kernel's 6 (matrix-vector products: a classifier head, a decoder step)
    stay in XNNPACK, whose memory-bound kernel is as fast there (AVX2 emulated, 1280 -> 1000 at batch 1: 0.12 ms
    in libXNNPACK, 0.20 ms on OpenBLAS's sgemv)."""
    p = product_dims(n, values, dims, const, kinds)
    return p is not None and math.prod(p[1]) >= MIN_MACS and (p[0] != "float" or p[1][0] >= MIN_FLOAT_ROWS)


def holds_filter(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]], const: set[int],
                 kinds: frozenset[str]) -> bool:
    """The host op of ``n`` keeps its own packed filter and bias (the executor need not keep the blob's)."""
    p = product_dims(n, values, dims, const, kinds)
    return p is not None and (p[0] in ("int8", "conv") or packs_filter(p[1]))


def product_op(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]],
               const: dict[int, np.ndarray], pool: Any, kinds: frozenset[str]) -> HostOp | None:
    """The host op of ``n`` when it is a product of ``kinds``, else ``None``."""
    p = product_dims(n, values, dims, set(const), kinds)
    if p is None:
        return None
    out_shape = dims[n.outputs()[0]]
    if p[0] == "int8":
        return _host_qs8.qs8_op(n, p[1], dims, values, const, pool)
    if p[0] == "conv":
        return _host_conv.conv_op(n, dims, const, pool, _host_conv.kernel_level())
    return gemm_op(n, p[1], out_shape, pool, const)


def _clamp(n: XNode) -> tuple[float, float]:
    lo, hi = n.output_min_max or (-math.inf, math.inf)
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"bad output range ({lo}, {hi})")
    return lo, hi


def packs_filter(mkn: tuple[int, int, int]) -> bool:
    """``gemm_op`` runs this product on the micro-kernel, with its own packed copy of the filter and bias (so the
    executor need not keep the blob's for it)."""
    return _gemm is not None and mkn[0] >= 6 and bool(_gemm.packed_available())


def pack_filter(w: np.ndarray, bias: np.ndarray | None, k: int, n: int,
                transpose_w: bool) -> tuple[np.ndarray, np.ndarray]:
    """The micro-kernel's operands: the filter as ``[ceil(n/16)][k][16]`` floats and the bias as ``ceil(n/16)*16``,
    both zero-padded."""
    rows = w.reshape(k, n).T if transpose_w else w.reshape(n, k)  # [n, k]
    n16 = -(-n // 16) * 16
    padded = np.zeros((n16, k), np.float32)
    padded[:n] = rows
    packed_bias = np.zeros(n16, np.float32)
    if bias is not None:
        packed_bias[:n] = bias.reshape(n)
    return (_host_conv.aligned(padded.reshape(n16 // 16, 16, k).transpose(0, 2, 1)),
            _host_conv.aligned(packed_bias))


def gemm_op(n: XNode, mkn: tuple[int, int, int], out_shape: tuple[int, ...], pool: Any,
            const: dict[int, np.ndarray]) -> HostOp:
    """The host op of a product ``gemm_dims`` accepted (its filter and bias are in ``const``): the micro-kernel or
    OpenBLAS tiled on ``pool`` (a ``native.ThreadPool`` or ``None``), or numpy's matmul without the extension."""
    m, k, cols = mkn
    transpose_w = n.kind == "XNNFullyConnected" and bool(n.get("flags") & _TRANSPOSE_WEIGHTS)
    lo, hi = _clamp(n)
    has_bias = len(n.inputs()) == 3
    blas = _blas_pair()
    handle = getattr(pool, "handle", None) or 0
    threads = getattr(pool, "num_threads", 1) if handle else 1
    parallelize = ctypes.cast(pool.lib.pool.pthreadpool_parallelize_1d, ctypes.c_void_p).value if handle else 0
    into: Callable[[Sequence[np.ndarray], np.ndarray], None]
    packed = None
    if packs_filter(mkn):
        ins = n.inputs()
        w, b = pack_filter(const[ins[1]], const[ins[2]] if has_bias else None, k, cols, transpose_w)
        packed = _gemm.packed_gemm

        def into(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
            a = xs[0] if xs[0].flags.c_contiguous else np.ascontiguousarray(xs[0])
            packed(parallelize, handle, a, w, b, out, m, k, cols, lo, hi, threads)
    elif _gemm is not None and blas is not None:
        sgemm, sgemv, ilp64 = blas
        fc = _gemm.fully_connected

        def into(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
            a = xs[0] if xs[0].flags.c_contiguous else np.ascontiguousarray(xs[0])
            fc(parallelize, handle, sgemm, sgemv, ilp64, a, xs[1], xs[2] if has_bias else None, out, m, k, cols,
               transpose_w, lo, hi, threads)
    else:
        clamp = lo > -math.inf or hi < math.inf

        def into(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
            w = xs[1].reshape(k, cols) if transpose_w else xs[1].reshape(cols, k).T
            dst = out.reshape(m, cols)
            np.matmul(xs[0].reshape(m, k), w, out=dst)
            if has_bias:
                np.add(dst, xs[2], out=dst)
            if clamp:
                np.clip(dst, lo, hi, out=dst)

    def compute(xs: Sequence[np.ndarray]) -> np.ndarray:
        out = np.empty(out_shape, np.float32)
        into(xs, out)
        return out
    return HostOp(compute, into, view=False, uses_blas=packed is None, reads=1 if packed is not None else None,
                  scratch=(tuple(out_shape), np.float32))
