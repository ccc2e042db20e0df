"""Int8 dense convolutions (and int8 fully-connected layers, which the executor rewrites into 1x1 ones) on AVX512-VNNI.

Debian's 2022 libXNNPACK has no VNNI int8 kernels (``objdump``: no ``vpdpbusd`` in ``libXNNPACK.so.0``, about a
thousand in ExecuTorch's XNNPACK), so on CPUs that have VNNI the int8 products with per-channel weights run as host
steps of ``edgeport_xnnpack._gemm.qs8_packed_gemm``: the filter packed once at load, VPDPBUSD on the input read in
place, and XNNPACK's own fp32 requantization (``acc * (input_scale * filter_scale[c] / output_scale)``, clamped,
rounded half to even, plus the output zero point), so the integers equal the ones libXNNPACK computes (tested
against it and against the pt2e model). A 1x1 stride-1 convolution reads its input pixels in place; any other dense
one (a CNN's stem, 3x3 stride 2 over 3 channels: MobileNetV2's took ~0.46 ms in the 2022 library, ~0.24 ms here,
AMD EPYC, one thread) first gathers its patches into rows (``_gemm.qs8_im2col``, taps outside the input set to the
input zero point). Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgeport_xnnpack._host import HostOp
from edgeport_xnnpack.schema.graph import (
    QCINT8,
    QCINT32,
    QINT8,
    QINT32,
    PerChannelQuant,
    PerTensorQuant,
    TensorValue,
    XNode,
)

try:
    from edgeport_xnnpack import _gemm
except ImportError:  # pragma: no cover - built without a C compiler
    _gemm = None

_PADS = ("padding_top", "padding_right", "padding_bottom", "padding_left")


def kernel_available() -> bool:
    """The C extension is built and this CPU runs its AVX512-VNNI kernel."""
    return _gemm is not None and hasattr(_gemm, "qs8_available") and bool(_gemm.qs8_available())


def _per_tensor(v: TensorValue) -> PerTensorQuant | None:
    q = v.quant
    ok = v.datatype == QINT8 and isinstance(q, PerTensorQuant) and math.isfinite(q.scale) and q.scale > 0
    return q if ok and -128 <= q.zero_point <= 127 else None  # type: ignore[return-value]


def _dense_geometry(n: XNode, x_dims: tuple[int, ...], w_dims: tuple[int, ...],
                    y_dims: tuple[int, ...]) -> tuple[int, ...] | None:
    """``(batch, h, w, c, kh, kw, sh, sw, pad_top, pad_left, oh, ow)`` of a dense (one group, no dilation) NHWC
    convolution whose output dims follow from its input, kernel, strides and pads, else ``None``."""
    if n.get("groups") != 1 or n.get("dilation_height") != 1 or n.get("dilation_width") != 1:
        return None
    if len(x_dims) != 4 or len(w_dims) != 4 or len(y_dims) != 4:
        return None
    batch, h, w, c = x_dims
    kh, kw, sh, sw = (n.get(f) for f in ("kernel_height", "kernel_width", "subsampling_height", "subsampling_width"))
    pt, pr, pb, pl = (n.get(f) for f in _PADS)
    if (w_dims[1], w_dims[2], w_dims[3]) != (kh, kw, c) or min(kh, kw, sh, sw) < 1 or min(pt, pr, pb, pl) < 0:
        return None
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    if (batch, oh, ow, w_dims[0]) != tuple(y_dims) or oh < 1 or ow < 1:
        return None
    return batch, h, w, c, kh, kw, sh, sw, pt, pl, oh, ow


def qs8_dims(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]],
             const: set[int]) -> tuple[int, int, int] | None:
    """``(m, k, n)`` of an int8 dense convolution with constant per-channel weights that the kernel runs, else
    ``None``: a 1x1 stride-1 unpadded one as the product of its pixels and filter (input channels a multiple of 4),
    any other (kernel, strides, pads) on the rows ``qs8_im2col`` gathers, k its patch size rounded up to 4."""
    if n.kind != "XNNConv2d" or n.get("flags"):
        return None
    ins, out = n.inputs(), n.outputs()[0]
    if len(ins) not in (2, 3) or not all(v in const for v in ins[1:]):
        return None
    if _per_tensor(values[ins[0]]) is None or _per_tensor(values[out]) is None:
        return None
    w, wq = values[ins[1]], values[ins[1]].quant
    x_dims, w_dims = dims[ins[0]], dims[ins[1]]
    if w.datatype != QCINT8 or not isinstance(wq, PerChannelQuant) or wq.channel_dim != 0:
        return None
    geometry = _dense_geometry(n, x_dims, w_dims, dims[out])
    if geometry is None:
        return None
    cols = w_dims[0]
    if len(wq.scale) != cols or not all(math.isfinite(s) and s > 0 for s in wq.scale):
        return None
    if len(ins) == 3 and (values[ins[2]].datatype not in (QINT32, QCINT32) or dims[ins[2]] != (cols,)):
        return None
    batch, _, _, c, kh, kw = geometry[:6]
    rows = batch * geometry[10] * geometry[11]
    if _pointwise(geometry):
        return (rows, c, cols) if c % 4 == 0 else None
    return rows, -(-kh * kw * c // 4) * 4, cols


def _pointwise(geometry: tuple[int, ...]) -> bool:
    """A 1x1 stride-1 unpadded convolution: its input pixels are the product's rows as they lie."""
    kh, kw, sh, sw, pt, pl = geometry[4:10]
    return (kh, kw, sh, sw, pt, pl, geometry[1], geometry[2]) == (1, 1, 1, 1, 0, 0, geometry[10], geometry[11])


def _bounds(n: XNode, q: PerTensorQuant) -> tuple[int, int]:
    lo, hi = -128, 127
    if n.output_min_max is not None:
        a, b = n.output_min_max
        if math.isnan(a) or math.isnan(b) or a > b:
            raise ValueError(f"bad output range ({a}, {b})")
        if a > -math.inf:
            lo = int(np.clip(np.rint(a / q.scale) + q.zero_point, -128, 127))
        if b < math.inf:
            hi = int(np.clip(np.rint(b / q.scale) + q.zero_point, -128, 127))
    return lo, hi


def pack(w: np.ndarray, bias: np.ndarray | None, scales: Sequence[float], x_scale: float, x_zero: int,
         y_scale: float, k: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's operands: the filter as ``[ceil(n/16)][k/4][16][4]`` int8 (its rows padded with zeros to ``k``
    columns), the bias with both input offsets folded in (``bias - (128 + x_zero) * sum_k w``) and the
    requantization scales, both padded to the panel width."""
    w2 = np.asarray(w, np.int8).reshape(n, -1)
    n16 = -(-n // 16) * 16
    padded = np.zeros((n16, k), np.int8)
    padded[:n, :w2.shape[1]] = w2
    packed = np.ascontiguousarray(padded.reshape(n16 // 16, 16, k // 4, 4).transpose(0, 2, 1, 3))
    folded = np.zeros(n16, np.int64)
    if bias is not None:
        folded[:n] = np.asarray(bias, np.int64).reshape(n)
    folded[:n] -= (128 + x_zero) * w2.astype(np.int64).sum(axis=1)
    if np.abs(folded).max(initial=0) >= 2 ** 31:
        raise ValueError("int8 product: the folded bias overflows int32")
    scale = np.zeros(n16, np.float32)
    # XNNPACK's order of float32 operations: input_scale * filter_scale, then / output_scale
    scale[:n] = (np.float32(x_scale) * np.asarray(scales, np.float32)) / np.float32(y_scale)
    return packed, folded.astype(np.int32), scale


def qs8_op(n: XNode, mkn: tuple[int, int, int], dims: dict[int, tuple[int, ...]], values: dict[int, TensorValue],
           const: dict[int, np.ndarray], pool: Any) -> HostOp:
    """The host op of a product ``qs8_dims`` accepted, on ``pool`` (a ``native.ThreadPool`` or ``None``)."""
    import ctypes

    m, k, cols = mkn
    ins, out = n.inputs(), n.outputs()[0]
    out_shape = dims[out]
    xq, yq = _per_tensor(values[ins[0]]), _per_tensor(values[out])
    assert xq is not None and yq is not None and _gemm is not None
    wq = values[ins[1]].quant
    assert isinstance(wq, PerChannelQuant)
    w, bias, scale = pack(const[ins[1]], const[ins[2]] if len(ins) == 3 else None, wq.scale, xq.scale,
                          xq.zero_point, yq.scale, k, cols)
    lo, hi = _bounds(n, yq)
    handle = getattr(pool, "handle", None) or 0
    threads = getattr(pool, "num_threads", 1) if handle else 1
    parallelize = ctypes.cast(pool.lib.pool.pthreadpool_parallelize_1d, ctypes.c_void_p).value if handle else 0
    run, zo = _gemm.qs8_packed_gemm, yq.zero_point
    geometry = _dense_geometry(n, dims[ins[0]], dims[ins[1]], dims[out])
    if geometry is not None and not _pointwise(geometry):
        rows = np.empty((m, k), np.int8)  # the gathered patches, one buffer per op (calls on a handle are serial)
        gather, x_zero = _gemm.qs8_im2col, xq.zero_point

        def into(xs: Sequence[np.ndarray], dst: np.ndarray) -> None:
            a = xs[0] if xs[0].flags.c_contiguous else np.ascontiguousarray(xs[0])
            gather(a, rows, *geometry, k, x_zero)
            run(parallelize, handle, rows, w, bias, scale, dst, m, k, cols, zo, lo, hi, threads)
    else:
        def into(xs: Sequence[np.ndarray], dst: np.ndarray) -> None:
            a = xs[0] if xs[0].flags.c_contiguous else np.ascontiguousarray(xs[0])
            run(parallelize, handle, a, w, bias, scale, dst, m, k, cols, zo, lo, hi, threads)

    def compute(xs: Sequence[np.ndarray]) -> np.ndarray:
        dst = np.empty(out_shape, np.int8)
        into(xs, dst)
        return dst
    return HostOp(compute, into, view=False, reads=1)
