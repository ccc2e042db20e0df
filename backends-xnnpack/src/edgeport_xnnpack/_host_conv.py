"""Float32 dense convolutions on edgeport's indirect-GEMM kernel (``edgeport_xnnpack._gemm.conv_packed``).

Debian's 2022 libXNNPACK runs float32 convolutions on AVX-512 CPUs with a 7x16 micro-kernel that leaves the FMA
units half idle; ExecuTorch's 2025 XNNPACK has a 7x32 one. This module is a stand-in for that newer kernel: the
same indirect GEMM (a row of tap offsets per output pixel, a zero row for taps in the padding), each output element
accumulated in libXNNPACK's order (bias, then one fused multiply-add per tap and channel) and clamped as it does, so
the results equal libXNNPACK's bit for bit (``tests/test_host_conv.py`` checks both ISAs against it and eager).
AVX-512: 7 pixels x 32 channels per micro-kernel call; AVX2 + FMA: 6 x 16. Torch-free.

A stem (fewer than ``MIN_CHANNELS`` input channels, e.g. ResNet-18's 7x7 over 3) runs on *row taps*: the input is
copied into a zero-padded buffer kept by the op, and each kernel row ``ky`` becomes one tap of ``kw * c``
contiguous floats (the ``kx`` taps of that row and their channels, in libXNNPACK's (kx, c) order; the padding
reads zeros as libXNNPACK's zero row does), so the same kernel makes the same fused multiply-adds with a seventh
of the per-tap pointer work.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgeport_xnnpack._host import HostOp
from edgeport_xnnpack._host_qs8 import _dense_geometry
from edgeport_xnnpack.schema.graph import FP32, TensorValue, XNode

try:
    from edgeport_xnnpack import _gemm
except ImportError:  # pragma: no cover - built without a C compiler
    _gemm = None

#: ``EDGEPORT_XNNPACK_CONV_ISA=avx2`` runs the AVX2 kernel on an AVX-512 CPU (tests and the AVX2-emulated bench)
ISA_ENV = "EDGEPORT_XNNPACK_CONV_ISA"
# A stem's few input channels (3) make the per-tap pointer work rival the multiply-adds (ResNet-18's stem took
# 1.4-1.6x the 2022 library's time on per-pixel taps): below MIN_CHANNELS a convolution runs on row taps (see the
# module docstring) when a kernel row holds at least MIN_CHANNELS floats, else it stays in XNNPACK (MobileNetV2's
# 3x3 stem over 3 channels: rows of 9)
MIN_CHANNELS = 16
_SHAPE = {2: (7, 32), 1: (6, 16)}  # kernel level -> (pixels, channels) of one micro-kernel call


def kernel_level() -> int:
    """2: the AVX-512 kernel runs here, 1: the AVX2 one, 0: neither (``EDGEPORT_XNNPACK_CONV_ISA=avx2`` caps it at
    1; any other value than ``avx2``, ``avx512`` or empty raises ``ValueError``)."""
    if _gemm is None or not hasattr(_gemm, "conv_isa"):
        return 0
    level = int(_gemm.conv_isa())
    want = os.environ.get(ISA_ENV, "").strip().lower()
    if want not in ("", "avx2", "avx512"):
        raise ValueError(f"{ISA_ENV} must be 'avx2', 'avx512' or unset, got {want!r}")
    return min(level, 1) if want == "avx2" else level


def conv_dims(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]],
              const: set[int]) -> tuple[int, int, int] | None:
    """``(pixels, taps * channels, output channels)`` of a float32 dense (one group, no dilation) convolution with
    more than one tap (or one that skips pixels or reads padding: ResNet's strided 1x1 projections), at least
    ``MIN_CHANNELS`` input channels and constant filter and bias that the kernel runs, else ``None``. 1x1
    convolutions over every pixel are not this kernel's: they are plain GEMMs, which ``_fc_ops.conv_operands`` runs
    on the fully connected operator where the CPU has AVX-512F (else they stay in XNNPACK)."""
    if n.kind != "XNNConv2d" or n.get("flags"):
        return None
    ins, out = n.inputs(), n.outputs()[0]
    if len(ins) not in (2, 3) or not all(v in const for v in ins[1:]):
        return None
    if not all(values[v].datatype == FP32 and values[v].quant is None for v in (*ins, out)):
        return None
    geometry = _dense_geometry(n, dims[ins[0]], dims[ins[1]], dims[out])
    if geometry is None:
        return None
    cols = dims[ins[1]][0]
    if len(ins) == 3 and dims[ins[2]] != (cols,):
        return None
    batch, _, _, c, kh, kw, sh, sw, pt, pl = geometry[:10]
    if (kh * kw == 1 and sh * sw == 1 and pt == pl == 0) or kw * c < MIN_CHANNELS:
        return None  # 1x1 over every pixel: a plain GEMM (see above)
    return batch * geometry[10] * geometry[11], kh * kw * c, cols


def padded_extent(geometry: tuple[int, ...]) -> tuple[int, int]:
    """``(rows, cols)`` of the zero-padded input that row taps read: every input pixel the output reaches."""
    _, h, w, _, kh, kw, sh, sw, pt, pl, oh, ow = geometry
    return max(pt + h, (oh - 1) * sh + kh), max(pl + w, (ow - 1) * sw + kw)


def row_offsets(geometry: tuple[int, ...], mr: int) -> np.ndarray:
    """``[ceil(m / mr)][kh][mr]`` int64: for each tile of ``mr`` output pixels and each kernel row ``ky``, the
    offset in floats (into the padded input of ``padded_extent``) of the first of the ``kw * c`` floats that row
    of taps reads; the last tile's missing pixels repeat its last pixel."""
    batch, _, _, c, kh, _, sh, sw, _, _, oh, ow = geometry
    hp, wp = padded_extent(geometry)
    b, oy, ox = np.meshgrid(np.arange(batch), np.arange(oh), np.arange(ow), indexing="ij")
    iy = oy.reshape(-1, 1) * sh + np.arange(kh).reshape(1, -1)  # [m, kh]
    off = (((b.reshape(-1, 1) * hp + iy) * wp + ox.reshape(-1, 1) * sw) * c).astype(np.int64)
    m = off.shape[0]
    tiles = -(-m // mr)
    off = np.concatenate([off, np.repeat(off[-1:], tiles * mr - m, axis=0)])
    return np.ascontiguousarray(off.reshape(tiles, mr, kh).transpose(0, 2, 1))


def tap_offsets(geometry: tuple[int, ...], mr: int) -> np.ndarray:
    """``[ceil(m / mr)][taps][mr]`` int64: for each tile of ``mr`` output pixels and each tap (``ky``, ``kx``), the
    offset in floats of the input pixel it reads, -1 in the padding; the last tile's missing pixels repeat its last
    pixel (their results are not stored)."""
    batch, h, w, c, kh, kw, sh, sw, pt, pl, oh, ow = geometry
    b, oy, ox = np.meshgrid(np.arange(batch), np.arange(oh), np.arange(ow), indexing="ij")
    ky, kx = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    iy = oy.reshape(-1, 1) * sh - pt + ky.reshape(1, -1)  # [m, taps]
    ix = ox.reshape(-1, 1) * sw - pl + kx.reshape(1, -1)
    inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
    off = np.where(inside, ((b.reshape(-1, 1) * h + iy) * w + ix) * c, -1).astype(np.int64)
    m = off.shape[0]
    tiles = -(-m // mr)
    off = np.concatenate([off, np.repeat(off[-1:], tiles * mr - m, axis=0)])
    return np.ascontiguousarray(off.reshape(tiles, mr, kh * kw).transpose(0, 2, 1))


def aligned(a: np.ndarray, align: int = 64) -> np.ndarray:
    """A C-contiguous copy of ``a`` whose data starts on an ``align``-byte boundary. numpy's allocations are
    16-byte aligned only (glibc malloc), so a kernel's 64-byte vector loads from a packed filter would each straddle
    two cache lines; libXNNPACK aligns its packed weights to 64 bytes likewise."""
    buf = np.empty(a.nbytes + align, np.uint8)
    start = -buf.ctypes.data % align
    out = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    np.copyto(out, a)
    return out


def pack(w: np.ndarray, bias: np.ndarray | None, taps: int, c: int, n: int,
         nr: int) -> tuple[np.ndarray, np.ndarray]:
    """The filter (XNNPACK's ``[n][kh][kw][c]``) as ``[ceil(n/nr)][taps][c][nr]`` floats and the bias as
    ``ceil(n/nr) * nr``, both zero-padded."""
    npad = -(-n // nr) * nr
    rows = np.zeros((npad, taps * c), np.float32)
    rows[:n] = np.asarray(w, np.float32).reshape(n, taps * c)
    packed = aligned(rows.reshape(npad // nr, nr, taps * c).transpose(0, 2, 1))  # 64-byte vector loads
    packed_bias = np.zeros(npad, np.float32)
    if bias is not None:
        packed_bias[:n] = np.asarray(bias, np.float32).reshape(n)
    return packed, aligned(packed_bias)


def conv_op(n: XNode, dims: dict[int, tuple[int, ...]], const: dict[int, np.ndarray], pool: Any,
            level: int) -> HostOp:
    """The host op of a convolution ``conv_dims`` accepted, on the kernel of ``level`` (see ``kernel_level``),
    tiled on ``pool`` (a ``native.ThreadPool`` or ``None``)."""
    assert _gemm is not None and level in _SHAPE
    ins, out = n.inputs(), n.outputs()[0]
    geometry = _dense_geometry(n, dims[ins[0]], dims[ins[1]], dims[out])
    assert geometry is not None
    lo, hi = n.output_min_max or (-math.inf, math.inf)
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"bad output range ({lo}, {hi})")
    mr, nr = _SHAPE[level]
    batch, h, wd, c, kh, kw = geometry[:6]
    pt, pl, oh, ow = geometry[8:]
    m, taps, cols = batch * oh * ow, kh * kw, dims[ins[1]][0]
    rows = c < MIN_CHANNELS  # a stem: one tap per kernel row (module docstring)
    if rows:
        taps, c = kh, kw * c
    w, b = pack(const[ins[1]], const[ins[2]] if len(ins) == 3 else None, taps, c, cols, nr)
    offsets = row_offsets(geometry, mr) if rows else tap_offsets(geometry, mr)
    zero = np.zeros(c, np.float32)
    x_len = math.prod(dims[ins[0]])
    out_shape = dims[out]
    if rows:
        hp, wp = padded_extent(geometry)
        x_len = batch * hp * wp * geometry[3]
        inner = (slice(None), slice(pt, pt + h), slice(pl, pl + wd))
        kept, lock = np.zeros((batch, hp, wp, geometry[3]), np.float32), threading.Lock()
    handle = getattr(pool, "handle", None) or 0
    threads = getattr(pool, "num_threads", 1) if handle else 1
    parallelize = ctypes.cast(pool.lib.pool.pthreadpool_parallelize_1d, ctypes.c_void_p).value if handle else 0
    run = _gemm.conv_packed

    def into(xs: Sequence[np.ndarray], dst: np.ndarray) -> None:
        if rows:
            # the padding stays zero; a concurrent call on the same op pads into a fresh buffer of its own
            mine = lock.acquire(blocking=False)
            try:
                pad = kept if mine else np.zeros_like(kept)
                pad[inner] = np.asarray(xs[0]).reshape(dims[ins[0]])
                run(parallelize, handle, level, pad, x_len, w, b, zero, offsets, dst, m, taps, c, cols, lo, hi,
                    threads)
            finally:
                if mine:
                    lock.release()
            return
        x = xs[0] if xs[0].flags.c_contiguous and xs[0].dtype == np.float32 else np.ascontiguousarray(xs[0],
                                                                                                       np.float32)
        run(parallelize, handle, level, x, x_len, w, b, zero, offsets, dst, m, taps, c, cols, lo, hi, threads)

    def compute(xs: Sequence[np.ndarray]) -> np.ndarray:
        dst = np.empty(out_shape, np.float32)
        into(xs, dst)
        return dst
    return HostOp(compute, into, view=False, reads=1, scratch=(tuple(out_shape), np.float32))
