"""Dynamically quantized fully connected (``qdint8 x qcint8 -> float32``) on a libXNNPACK without ``qd8`` kernels.

ExecuTorch's XNNPACK delegate (and edgeport's, for ``XnnpackQuantizer(dynamic=True)``) lowers a dynamically
quantized linear to an ``XNNConvert`` (float32 -> ``qdint8``: int8 with one asymmetric scale / zero point per
row, computed at run time) and an ``XNNFullyConnected`` reading it with a per-channel int8 filter. The 2022
libXNNPACK has neither the datatype nor the kernels, so the executor computes the same arithmetic as:

* a host step that quantizes each row exactly as XNNPACK's ``f32 -> qd8`` convert does (range widened to contain
  0, ``inv = 255 / (max - min)``, nudged zero point, round half to even, saturate) and writes the dequantized
  values ``(q - zero_point) / inv`` as float32, and
* a native float32 fully connected whose filter is the int8 filter times its per-channel scales (exact in
  float32), so ``sum((q - zp) / inv * w * s) = (sum((q - zp) * w)) * s / inv`` up to float32 rounding.

Results match the int8 kernels of ExecuTorch's runtime to float32 rounding; the program keeps int8 weights
(4x smaller), but on this library the compute runs in float32 (no int8 speed-up).
"""

from __future__ import annotations

import numpy as np

__all__ = ["dequantize_filter", "quantize_rows", "row_params"]


def row_params(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row ``(inv_scale, zero_point)`` (float32) of XNNPACK's asymmetric int8 dynamic quantization."""
    rmin = np.minimum(rows.min(axis=1), 0).astype(np.float32)
    rmax = np.maximum(rows.max(axis=1), 0).astype(np.float32)
    span = (rmax - rmin).astype(np.float32)
    same = span == 0
    inv = np.where(same, np.float32(1), np.float32(255) / np.where(same, np.float32(1), span)).astype(np.float32)
    lo_err = np.float32(-128) + rmin * inv
    hi_err = np.float32(127) + rmax * inv
    zp = np.where(lo_err + hi_err > 0, np.float32(-128) - rmin * inv, np.float32(127) - rmax * inv)
    zp = np.rint(np.clip(zp, -128, 127)).astype(np.float32)
    return inv, zp


def quantize_rows(x: np.ndarray, out: np.ndarray, num_nonbatch_dims: int = 1) -> None:
    """Write into ``out`` the float32 values ``x`` takes after int8 dynamic quantization per row (the trailing
    ``num_nonbatch_dims`` dims form a row)."""
    if x.shape != out.shape or x.dtype != np.float32 or out.dtype != np.float32:
        raise ValueError(f"dynamic quantization: float32 {list(out.shape)} expected, got {x.dtype} {list(x.shape)}")
    if not 1 <= num_nonbatch_dims <= x.ndim:
        raise ValueError(f"dynamic quantization: num_nonbatch_dims {num_nonbatch_dims} for rank {x.ndim}")
    row = int(np.prod(x.shape[x.ndim - num_nonbatch_dims:]))
    rows = x.reshape(-1, row) if row else x.reshape(0, 0)
    if rows.size == 0:
        return
    inv, zp = row_params(rows)
    scaled = rows * inv[:, None]
    q = np.rint(np.clip(scaled, (-128 - zp)[:, None], (127 - zp)[:, None]))
    np.multiply(q, (np.float32(1) / inv)[:, None], out=out.reshape(rows.shape))


def dequantize_filter(data: np.ndarray, scales: np.ndarray, channel_dim: int) -> np.ndarray:
    """A per-channel int8 filter as float32 (``data * scale`` along ``channel_dim``; exact in float32)."""
    if data.dtype != np.int8:
        raise ValueError(f"int8 filter expected, got {data.dtype}")
    s = np.asarray(scales, np.float32).reshape(-1)
    if not 0 <= channel_dim < data.ndim or s.size != data.shape[channel_dim]:
        raise ValueError(f"{s.size} scales for channel dim {channel_dim} of a {list(data.shape)} filter")
    shape = [1] * data.ndim
    shape[channel_dim] = s.size
    return (data.astype(np.float32) * s.reshape(shape)).astype(np.float32)
