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

``qbint4`` filters (4-bit weights with one bfloat16 scale per block of ``group_size`` input channels, torchao's
8da4w) are dequantized the same way: ``(nibble - 8) * float32(scale)`` is exact in float32 (a 4-bit integer
times an 8-bit significand), so ``sum_k (q_k - zp) / inv * w_k * s_{k // g}`` equals XNNPACK's
``sum_g s_g * sum_{k in g} (q_k - zp) * w_k / inv`` up to float32 rounding of the sums.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from edgeport_xnnpack.schema.graph import (
    FP32,
    INVALID_ID,
    QBINT4,
    QCINT8,
    QDINT8,
    Graph,
    PerChannelGroupQuant,
    PerChannelQuant,
    PerTokenDynamicQuant,
    TensorValue,
)

__all__ = ["DYNAMIC_ROWS", "QD8", "Qd8Weights", "bf16_to_f32", "host_dynamic_products", "dequantize_blockwise", "dequantize_dynamic_filters",
           "dequantize_filter", "emulate_dynamic_values", "quantize_rows", "row_params"]


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


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as float32 (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def dequantize_blockwise(packed: np.ndarray, scales: np.ndarray, dims: tuple[int, ...], group: int) -> np.ndarray:
    """A ``qbint4`` filter ``[N, K]`` as float32: ``packed`` holds ``[N, ceil(K / 2)]`` bytes (the even input
    channel in the low nibble, each value + 8), ``scales`` the float32 ``[N, K / group]`` block scales."""
    if len(dims) != 2:
        raise ValueError(f"qbint4 filter must be 2-D, got dims {list(dims)}")
    n, k = dims
    if group <= 0 or k % group:
        raise ValueError(f"qbint4 filter {list(dims)}: group size {group} does not divide {k}")
    if packed.shape != (n, (k + 1) // 2) or packed.dtype != np.uint8:
        raise ValueError(f"qbint4 filter {list(dims)}: {packed.dtype} data of shape {list(packed.shape)}")
    s = np.asarray(scales, np.float32).reshape(-1)
    if s.size != n * (k // group):
        raise ValueError(f"qbint4 filter {list(dims)} in groups of {group}: {s.size} scales")
    vals = np.empty((n, 2 * packed.shape[1]), np.int8)
    vals[:, 0::2] = (packed & 0xF).astype(np.int8) - 8
    vals[:, 1::2] = (packed >> 4).astype(np.int8) - 8
    out = vals[:, :k].astype(np.float32).reshape(n, k // group, group)
    out *= s.reshape(n, k // group, 1)
    return out.reshape(n, k)


#: field set on an ``XNNConvert`` to qdint8 once :func:`emulate_dynamic_values` rewrote it (rows' trailing dims)
DYNAMIC_ROWS = "edgeport_dynamic_rows"


def emulate_dynamic_values(graph: Graph) -> set[int]:
    """Rewrite a blob's ``qdint8`` values (before its values are checked): each becomes a float32 value holding
    the dequantized numbers; the ``XNNConvert`` producing it is marked with :data:`DYNAMIC_ROWS` (a host step).
    Returns the rewritten value ids. Raises ``ValueError`` for a use this emulation does not cover."""
    rows: dict[int, int] = {}
    for v in graph.values:
        if v.datatype != QDINT8:
            continue
        if not isinstance(v.quant, PerTokenDynamicQuant):
            raise ValueError(f"qdint8 value {v.id_out} without per-token dynamic quantization parameters")
        if v.flags or v.constant_buffer_idx:
            raise ValueError(f"qdint8 value {v.id_out} cannot be a constant or an external value")
        if not 1 <= v.quant.num_nonbatch_dims <= len(v.dims):
            raise ValueError(f"qdint8 value {v.id_out}: num_nonbatch_dims {v.quant.num_nonbatch_dims} for dims "
                             f"{list(v.dims)}")
        rows[v.id_out] = v.quant.num_nonbatch_dims
    if not rows:
        return set()
    for n in graph.nodes:
        outs, ins = n.outputs(), n.inputs()
        if n.kind == "XNNConvert" and outs and outs[0] in rows:
            if ins[0] in rows:
                raise ValueError(f"XNNConvert from qdint8 value {ins[0]} to qdint8")
            n.fields[DYNAMIC_ROWS] = rows[outs[0]]
            continue
        if any(o in rows for o in outs):
            raise ValueError(f"{n.kind} writes qdint8 value(s): only XNNConvert may")
        for i in ins:
            if i in rows and not (n.kind == "XNNFullyConnected" and n.get("input1_id") == i):
                raise ValueError(f"{n.kind} reads qdint8 value {i}: only a fully connected node's input may")
    for v in graph.values:
        if v.id_out in rows:
            v.datatype, v.quant = FP32, None
    return set(rows)


#: field set on a fully connected node over a qdint8 value that the host kernel runs (``_qd8``): its Qd8Weights
QD8 = "edgeport_qd8"


@dataclass
class Qd8Weights:
    """What ``_qd8.fc`` needs of one fully connected node: the filter as stored in the blob (int8 ``[n, k]``, or
    packed 4-bit ``[n, k / 2]``), float32 scales ``[n, k / group]``, the bias, the bit width and the group."""

    w: np.ndarray
    scales: np.ndarray
    bias: np.ndarray | None
    bits: int
    group: int
    k: int
    n: int
    #: bits 4: the filter in the ``_qd8`` kernel's packed layout, made at the first load (``_host_qd8.packed_filter``)
    packed: np.ndarray | None = None


def host_dynamic_products(graph: Graph, dynamic: set[int], values: dict[int, TensorValue],
                          const: dict[int, np.ndarray], group_scales: dict[int, np.ndarray]) -> set[int]:
    """Let the host kernel run the fully connected nodes over qdint8 values it can: each then reads the float
    input of the ``XNNConvert`` directly (the kernel quantizes its rows as the convert does) and carries its int8 /
    packed int4 filter in ``fields[QD8]`` (no float32 copy); converts left without readers are dropped. Returns
    the filter and bias ids now held by those nodes. The other nodes keep the float32 path
    (:func:`dequantize_dynamic_filters`)."""
    source: dict[int, int] = {}
    for n in graph.nodes:
        if n.kind == "XNNConvert" and n.fields.get(DYNAMIC_ROWS) == 1:
            source[n.get("output_id")] = n.get("input_id")
    users: dict[int, int] = {}
    for n in graph.nodes:
        for i in n.inputs():
            users[i] = users.get(i, 0) + 1
    held: set[int] = set()
    for n in graph.nodes:
        x = n.get("input1_id")
        if n.kind != "XNNFullyConnected" or x not in dynamic or x not in source or n.get("flags"):
            continue
        fid, bid = n.get("filter_id"), n.get("bias_id")
        v = values.get(fid)
        if v is None or fid not in const or users.get(fid, 0) != 1 or len(v.dims) != 2:
            continue
        if bid != INVALID_ID and (bid not in const or values[bid].datatype != FP32 or users.get(bid, 0) != 1):
            continue
        cols, k = v.dims
        if v.datatype == QBINT4 and isinstance(v.quant, PerChannelGroupQuant) and fid in group_scales:
            group = v.quant.group_size
            if v.quant.channel_dim or group <= 0 or group % 32 or k % group:
                continue
            scales, bits = group_scales[fid].reshape(cols, k // group), 4
        elif v.datatype == QCINT8 and isinstance(v.quant, PerChannelQuant) and v.quant.channel_dim == 0:
            scales, bits, group = np.asarray(v.quant.scale, np.float32).reshape(cols, 1), 8, k
        else:
            continue
        bias = np.ascontiguousarray(const[bid], np.float32).reshape(cols) if bid != INVALID_ID else None
        n.fields[QD8] = Qd8Weights(np.ascontiguousarray(const[fid]), np.ascontiguousarray(scales, np.float32), bias,
                                   bits, group, k, cols)
        n.fields["input1_id"] = source[x]
        held.update(i for i in (fid, bid) if i != INVALID_ID)
    read = {i for n in graph.nodes for i in n.inputs()}
    graph.nodes[:] = [n for n in graph.nodes
                      if not (n.kind == "XNNConvert" and n.get("output_id") in source and n.get("output_id") not in read)]
    return held


def dequantize_dynamic_filters(graph: Graph, dynamic: set[int], values: dict[int, TensorValue],
                               const: dict[int, np.ndarray], group_scales: dict[int, np.ndarray] | None = None) -> None:
    """After constants are loaded: the ``qcint8`` / ``qbint4`` filters of fully connected nodes reading rewritten
    qdint8 values become float32 constants (``int8 * scale``; ``int4 * block scale``). Per-channel scales must
    already be resolved; ``group_scales`` holds each ``qbint4`` filter's float32 block scales."""
    users: dict[int, int] = {}
    for n in graph.nodes:
        for i in n.inputs():
            users[i] = users.get(i, 0) + 1
    for n in graph.nodes:
        if n.kind != "XNNFullyConnected" or n.get("input1_id") not in dynamic:
            continue
        fid, bid = n.get("filter_id"), n.get("bias_id")
        v = values.get(fid)
        blockwise = v is not None and v.datatype == QBINT4 and isinstance(v.quant, PerChannelGroupQuant)
        if v is None or fid not in const or not blockwise and (
                v.datatype != QCINT8 or not isinstance(v.quant, PerChannelQuant)):
            raise ValueError(f"fully connected over qdint8 needs a constant qcint8 or qbint4 filter (value {fid})")
        if users.get(fid, 0) != 1:
            raise ValueError(f"quantized filter {fid} is shared with other nodes")
        if bid != INVALID_ID and (bid not in const or values[bid].datatype != FP32):
            raise ValueError(f"fully connected over qdint8 needs a constant float32 bias (value {bid})")
        if blockwise:
            assert isinstance(v.quant, PerChannelGroupQuant)
            if v.quant.channel_dim != 0 or group_scales is None or fid not in group_scales:
                raise ValueError(f"qbint4 filter {fid}: channel dim {v.quant.channel_dim} (0 expected) or no scales")
            const[fid] = dequantize_blockwise(const[fid], group_scales[fid], tuple(v.dims), v.quant.group_size)
        else:
            const[fid] = dequantize_filter(const[fid], np.asarray(v.quant.scale, np.float32), v.quant.channel_dim)
        values[fid] = replace(v, datatype=FP32, quant=None)
