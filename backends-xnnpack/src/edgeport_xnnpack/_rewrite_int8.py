"""Statically quantized (int8) blobs written by ExecuTorch, rewritten into what the 2022 libXNNPACK has (torch-free).

ExecuTorch's XNNPACK delegate lowers a pt2e-quantized linear (``XNNPACKQuantizer`` with per-channel weights) to an
``XNNFullyConnected`` reading a ``qint8`` input with a ``qcint8`` (per-channel) filter and a ``qcint32`` bias. The
2022 library has no per-channel int8 fully connected, but it has the per-channel int8 convolution, and a fully
connected over ``[..., K]`` is a 1x1 convolution over the NHWC view ``[M, 1, 1, K]``:

    XNNStaticReshape  x [..., K]        -> [M, 1, 1, K]   (qint8, same quantization; moves no bytes)
    XNNConv2d         1x1, groups 1, filter [N, 1, 1, K] (qcint8, channel_dim 0), the same qcint32 bias
    XNNStaticReshape  [M, 1, 1, N]      -> y [..., N]

which is what edgeport's own preprocess emits for a quantized linear (``preprocess/static_int8_emitters.py``). The filter
is the same int8 data viewed as ``[N, 1, 1, K]`` (transposed once if the node has the transposed-weights flag).

Transposes of int8 values that only move size-1 dims (``[1, 1, 1, C] -> [1, C, 1, 1]`` before a classifier)
become static reshapes (native for int8 here); other int8 transposes (ExecuTorch's NCHW <-> NHWC) run on the
host as numpy transposes, which need equal quantization on both sides. An int8 global average pooling whose
rounding on the 2022 kernel could differ (an even window and an odd zero point, or different input and output
quantization) is marked (:data:`INT8_MEAN`) to run on the host, rounded as newer XNNPACK does (:func:`int8_mean`).

Everything is checked before anything native is defined; a blob this rewrite cannot make sense of raises
``ValueError`` (the executor turns it into a ``ProgramError``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from edgeport_xnnpack._plan import squeeze_perm, valid_perm
from edgeport_xnnpack.schema.graph import (
    INVALID_ID,
    QCINT8,
    QCINT32,
    QINT8,
    Graph,
    PerChannelQuant,
    PerTensorQuant,
    TensorValue,
    XNode,
)

__all__ = ["int8_transpose_ok", "rewrite_int8"]

_TRANSPOSED_WEIGHTS = 0x1
_RESHAPE_2D = 0x4


def rewrite_int8(graph: Graph, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]],
                 const: dict[int, np.ndarray]) -> int:
    """Rewrite ``graph`` in place (after its values are checked and its constants loaded, before its nodes are
    checked): every ``qint8 x qcint8`` fully connected becomes reshape + 1x1 convolution + reshape, every int8
    transpose of size-1 dims a reshape, int8 global average poolings host-marked where needed. ``values``/``dims``/``const`` (the planner's) get the new values.
    Returns the number of fully connected nodes rewritten; raises ``ValueError`` on an inconsistent node."""
    if not any(v.datatype == QINT8 for v in values.values()):
        return 0
    next_id = max(values, default=-1) + 1
    nodes: list[XNode] = []
    rewritten = 0
    for i, n in enumerate(graph.nodes):
        if n.kind == "XNNStaticTranspose" and _is_int8(values.get(n.get("output_id"))):
            nodes.append(_transpose(n, values, dims, f"xnodes[{i}] ({n.kind})"))
            continue
        if n.kind == "XNNGlobalAvgPooling2d" and _is_int8(values.get(n.get("output_id"))):
            _mark_mean(n, values, dims, f"xnodes[{i}] ({n.kind})")
            nodes.append(n)
            continue
        if n.kind != "XNNFullyConnected" or not _is_int8(values.get(n.get("input1_id"))) \
                or getattr(values.get(n.get("filter_id")), "datatype", None) != QCINT8:
            nodes.append(n)
            continue
        where = f"xnodes[{i}] (XNNFullyConnected)"
        if next_id + 3 >= INVALID_ID:
            raise ValueError(f"{where}: no value ids left for the rewrite")
        new_values, new_nodes = _fully_connected(n, values, dims, const, next_id, where)
        for v in new_values:
            graph.values.append(v)
            values[v.id_out] = v
            dims[v.id_out] = tuple(int(d) for d in v.dims)
        next_id += len(new_values)
        nodes.extend(new_nodes)
        rewritten += 1
    graph.nodes[:] = nodes
    return rewritten


def int8_transpose_ok(n: XNode, values: dict[int, TensorValue]) -> bool:
    """An int8 transpose the host can run: qint8 in and out, same quantization (the bytes just move)."""
    vi, vo = values.get(n.get("input_id")), values.get(n.get("output_id"))
    return vi is not None and vo is not None and _is_int8(vi) and _is_int8(vo) and vi.quant == vo.quant


#: field set on an int8 ``XNNGlobalAvgPooling2d`` by :func:`rewrite_int8`: ``(multiplier, bias, qmin, qmax)`` of
#: :func:`int8_mean`; the node then runs on the host
INT8_MEAN = "edgeport_int8_mean"


def int8_mean(x: np.ndarray, params: tuple[float, float, int, int], out: np.ndarray) -> None:
    """Global average pooling of int8 ``x`` [N, H, W, C] into int8 ``out`` ([N, 1, 1, C] or [N, C]) as the int8
    mean of newer XNNPACK computes it: ``round_half_even(sum(q) * multiplier + bias)`` in float32, clamped. (The
    2022 kernels round ``sum(q - zero_point) * multiplier``, which breaks ties the other way for odd zero points:
    with shared quantization, one step off for ~15% of the channels of a 2x2 pooling.)"""
    mult, bias, lo, hi = params
    if x.dtype != np.int8 or out.dtype != np.int8 or x.ndim != 4 or out.size != x.shape[0] * x.shape[3]:
        raise ValueError(f"int8 mean of {x.dtype} {list(x.shape)} into {out.dtype} {list(out.shape)}")
    acc = x.reshape(x.shape[0], -1, x.shape[3]).sum(axis=1, dtype=np.int32).astype(np.float32)
    y = np.rint(acc * np.float32(mult) + np.float32(bias))
    np.copyto(out.reshape(acc.shape), np.clip(y, lo, hi), casting="unsafe")


def _mark_mean(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]], where: str) -> None:
    """Mark ``n`` to run on the host unless the 2022 kernel gives the same integers."""
    i, o = n.get("input_id"), n.get("output_id")
    if i not in dims or not _is_int8(values.get(i)) or len(dims[i]) != 4:
        raise ValueError(f"{where}: an int8 global average pooling needs a 4-D qint8 input")
    qi, qo = values[i].quant, values[o].quant
    assert isinstance(qi, PerTensorQuant) and isinstance(qo, PerTensorQuant)
    if not (math.isfinite(qi.scale) and math.isfinite(qo.scale) and qi.scale > 0 and qo.scale > 0):
        raise ValueError(f"{where}: quantization scales must be positive and finite")
    count = dims[i][1] * dims[i][2]
    if count == 0:
        raise ValueError(f"{where}: pooling over an empty window")
    if qi == qo and (count % 2 or qi.zero_point % 2 == 0):
        return  # no ties (odd count) or round-half-even commutes with the zero point (even): native is exact
    mult = np.float32(np.float32(qi.scale) / np.float32(qo.scale)) * np.float32(1.0 / count)
    bias = np.float32(qo.zero_point) - np.float32(qi.zero_point) * np.float32(count) * mult
    lo, hi = -128, 127
    if n.output_min_max is not None:
        a, b = n.output_min_max
        if math.isnan(a) or math.isnan(b) or a > b:
            raise ValueError(f"{where}: bad output range ({a}, {b})")
        if a > -math.inf:
            lo = int(np.clip(np.rint(a / qo.scale) + qo.zero_point, -128, 127))
        if b < math.inf:
            hi = int(np.clip(np.rint(b / qo.scale) + qo.zero_point, -128, 127))
    n.fields[INT8_MEAN] = (float(mult), float(bias), lo, hi)


def _is_int8(v: TensorValue | None) -> bool:
    return v is not None and v.datatype == QINT8 and isinstance(v.quant, PerTensorQuant)


def _transpose(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]], where: str) -> XNode:
    i, o = n.get("input_id"), n.get("output_id")
    if i not in dims or o not in dims:
        raise ValueError(f"{where}: reads or writes an undefined value")
    if not int8_transpose_ok(n, values):
        raise ValueError(f"{where}: an int8 transpose must keep its qint8 quantization")
    perm = [int(p) for p in n.get("perm")]
    if not valid_perm(dims[i], perm, dims[o]):
        raise ValueError(f"{where}: permutation {perm} does not take {list(dims[i])} to {list(dims[o])}")
    squeezed = squeeze_perm(dims[i], perm)[1]
    if squeezed != sorted(squeezed):  # moves data: runs on the host
        return n
    return XNode("XNNStaticReshape", {"num_dims": len(dims[o]), "new_shape": list(dims[o]), "input_id": i,
                                      "output_id": o, "flags": 0}, n.debug_handle, n.output_min_max)


def _fully_connected(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]],
                     const: dict[int, np.ndarray], first_id: int, where: str) -> tuple[list[TensorValue], list[XNode]]:
    xid, fid, bid, yid = n.get("input1_id"), n.get("filter_id"), n.get("bias_id"), n.get("output_id")
    flags = n.get("flags")
    for vid in (xid, fid, yid) + ((bid,) if bid != INVALID_ID else ()):
        if vid not in values:
            raise ValueError(f"{where}: value {vid} is not defined")
    x, f, y = values[xid], values[fid], values[yid]
    if flags & ~(_TRANSPOSED_WEIGHTS | _RESHAPE_2D):
        raise ValueError(f"{where}: flags {flags:#x} are not supported for int8")
    if not _is_int8(y):
        raise ValueError(f"{where}: a qint8 x qcint8 fully connected must write a qint8 value")
    if fid not in const or not isinstance(f.quant, PerChannelQuant) or len(dims[fid]) != 2:
        raise ValueError(f"{where}: the qcint8 filter must be a 2-D constant with per-channel scales")
    transposed = bool(flags & _TRANSPOSED_WEIGHTS)
    n_out, k = (dims[fid][1], dims[fid][0]) if transposed else dims[fid]
    if f.quant.channel_dim != (1 if transposed else 0) or len(f.quant.scale) != n_out:
        raise ValueError(f"{where}: the filter needs {n_out} scales along its output-channel dim, got "
                         f"{len(f.quant.scale)} along dim {f.quant.channel_dim}")
    if bid != INVALID_ID:
        b = values[bid]
        if bid not in const or b.datatype != QCINT32 or not isinstance(b.quant, PerChannelQuant) \
                or dims[bid] != (n_out,) or len(b.quant.scale) != n_out:
            raise ValueError(f"{where}: the bias of an int8 fully connected must be a constant qcint32 [{n_out}] "
                             "with per-channel scales")
    xd, yd = dims[xid], dims[yid]
    numel = math.prod(xd)
    if not xd or k == 0 or (numel % k if flags & _RESHAPE_2D else xd[-1] != k):
        raise ValueError(f"{where}: input {list(xd)} does not match the filter {list(dims[fid])}")
    m = numel // k
    want = (m, n_out) if flags & _RESHAPE_2D else xd[:-1] + (n_out,)
    if yd != want:
        raise ValueError(f"{where}: output dims {list(yd)} should be {list(want)}")
    x4, f4, y4 = first_id, first_id + 1, first_id + 2
    data = const[fid]
    if transposed:
        data = np.ascontiguousarray(data.T)
    const[f4] = data.reshape(n_out, 1, 1, k)
    new_values = [
        TensorValue(QINT8, [m, 1, 1, k], x4, quant=replace(x.quant)),
        TensorValue(QCINT8, [n_out, 1, 1, k], f4, constant_buffer_idx=f.constant_buffer_idx,
                    quant=PerChannelQuant(list(f.quant.scale), 0)),
        TensorValue(QINT8, [m, 1, 1, n_out], y4, quant=replace(y.quant)),
    ]
    conv = {"padding_top": 0, "padding_right": 0, "padding_bottom": 0, "padding_left": 0, "kernel_height": 1,
            "kernel_width": 1, "subsampling_height": 1, "subsampling_width": 1, "dilation_height": 1,
            "dilation_width": 1, "group_input_channels": k, "group_output_channels": n_out, "groups": 1,
            "adjustment_height": 0, "adjustment_width": 0, "input1_id": x4, "filter_id": f4, "bias_id": bid,
            "output_id": y4, "flags": 0}
    # new_shape marks the rows (0: inferred), so a specialization to other input shapes can follow: all of M
    # going in, and coming out the one leading dim that is not 1 (see edgeport_xnnpack._infer)
    lead = [j for j, d in enumerate(yd[:-1]) if d != 1]
    back = [0 if [j] == lead else d for j, d in enumerate(yd)]
    new_nodes = [
        XNode("XNNStaticReshape", {"num_dims": 4, "new_shape": [0, 1, 1, k], "input_id": xid, "output_id": x4,
                                   "flags": 0}, n.debug_handle),
        XNode("XNNConv2d", conv, n.debug_handle, n.output_min_max),
        XNode("XNNStaticReshape", {"num_dims": len(yd), "new_shape": back, "input_id": y4, "output_id": yid,
                                   "flags": 0}, n.debug_handle),
    ]
    return new_values, new_nodes
