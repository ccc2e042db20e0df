"""pt2e quantize / dequantize nodes and the quantized forms of the ops between them.

A delegated ``quantize_per_tensor`` of a float value becomes QNN ``Quantize`` (uint8/int8 scale-offset tensor); a
delegated ``dequantize_per_tensor`` costs nothing: its value is the quantized tensor (:class:`Deq`), and a float op
that reads it gets a ``Dequantize``. An op in :data:`QUANT_OPS` whose inputs are all dequantized and whose only user
is a quantize runs quantized (:meth:`Lowering._quantized_output`): its output tensor carries that quantize's
parameters, and the quantize itself then emits nothing. Convolution and linear weights are int8 per output channel
(QNN per-axis), biases int32 with scale ``input_scale * weight_scale``. Every delegate still takes and returns
float32: the partitioner keeps a quantize and its dequantizes in one partition.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_qnn.preprocess.lowering import Deq, Lowering, QConst, Val, arg, static_shape
from edgeport_qnn.preprocess.ops._common import pair, u32

QUANTIZE = "quantized_decomposed.quantize_per_tensor.default"
DEQUANTIZE = "quantized_decomposed.dequantize_per_tensor.default"
DEQUANTIZE_PER_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"
_RANGES = {torch.uint8: (np.uint8, 0, 255), torch.int8: (np.int8, -128, 127)}

#: ops with a quantized form (the others dequantize their inputs and run in float)
QUANT_OPS = {"aten.convolution.default", "aten.linear.default", "aten.add.Tensor", "aten.relu.default",
             "aten.hardtanh.default", "aten.max_pool2d.default", "aten.avg_pool2d.default", "aten.mean.dim",
             "aten.view_copy.default", "aten.permute_copy.default", "aten.cat.default"}


_CLAMPS = {"aten.relu.default", "aten.hardtanh.default"}


def quantizing_user(node: torch.fx.Node) -> torch.fx.Node | None:
    """The quantize that fixes ``node``'s output parameters: its only user, or the only user of a relu / hardtanh
    that is its only user (fused, as the quantizer annotates it)."""
    from edgeport.aot.capability_partitioner import op_name

    users = list(node.users)
    if len(users) != 1 or users[0].op != "call_function" or users[0].args[0] is not node:
        return None
    user = users[0]
    name = op_name(user.target)
    if name == QUANTIZE:
        return user
    if name in _CLAMPS and op_name(node.target) not in _CLAMPS:
        return quantizing_user(user)
    return None


def quant_of(node: torch.fx.Node) -> tuple[Any, Any]:
    """(numpy dtype, QuantParams) of a per-tensor quantize / dequantize node."""
    from edgeport_qnn.sdk import QuantParams

    scale, zp, qmin, qmax, dtype = node.args[1:6]
    np_dtype, lo, hi = _RANGES.get(dtype, (None, None, None))
    if np_dtype is None or (int(qmin), int(qmax)) != (lo, hi):
        raise LoweringError(f"{node.name}: quantization {dtype} [{qmin}, {qmax}] is not lowered (full-range uint8 or "
                            "int8 only)")
    return np_dtype, QuantParams(float(scale), int(zp))


def quantize(lw: Lowering, node: torch.fx.Node) -> Val:
    dtype, q = quant_of(node)
    src = lw.values.get(node.args[0])
    if isinstance(src, Val) and src.quant == q and src.dtype == dtype:
        return src  # produced quantized by the op before it
    x = lw.value(node.args[0])
    return lw.node("Quantize", [x.name], x.qnn_shape, nhwc=x.nhwc, logical=x.shape,
                   like=Val("", (), dtype=dtype, quant=q))


def dequantize(lw: Lowering, node: torch.fx.Node) -> Deq:
    src = lw.values.get(node.args[0])
    if not (isinstance(src, Val) and src.quant is not None):
        raise LoweringError(f"{node.name}: dequantizes {node.args[0].name}, which is not a quantized tensor of this "
                            "partition")
    dtype, q = quant_of(node)
    if src.quant != q or src.dtype != dtype:
        raise LoweringError(f"{node.name}: its parameters differ from those of the quantize before it")
    return Deq(src)


def dequantize_per_channel(lw: Lowering, node: torch.fx.Node) -> QConst:
    raw, scales, zps = (lw.const(a) for a in node.args[:3])
    if raw is None or scales is None or zps is None:
        raise LoweringError(f"{node.name}: per-channel dequantize of a non-constant (weights only)")
    axis = int(node.args[3]) % raw.ndim
    shape = [1] * raw.ndim
    shape[axis] = -1
    real = (raw.astype(np.float64) - zps.reshape(shape)) * scales.reshape(shape)
    return QConst(real.astype(np.float32), raw=np.asarray(raw), scales=tuple(float(s) for s in scales),
                  zero_points=tuple(int(z) for z in zps), axis=axis)


def _weights(lw: Lowering, node: torch.fx.Node, index: int) -> QConst:
    w = lw.values.get(node.args[index])
    if not isinstance(w, QConst) or w.raw.dtype != np.int8 or w.axis != 0 or any(w.zero_points):
        raise LoweringError(f"{node.name}: quantized weights must be int8, symmetric, per output channel")
    return w


def _bias(lw: Lowering, node: torch.fx.Node, x: Val, w: QConst, index: int) -> str:
    from edgeport_qnn.sdk import QuantParams

    b_node = arg(node, index, "bias")
    b = lw.const(b_node) if b_node is not None else np.zeros(len(w.scales), np.float32)
    if b is None:
        raise LoweringError(f"{node.name}: the bias must be a constant")
    scales = np.float64(x.quant.scales[0]) * np.asarray(w.scales, np.float64)
    raw = np.clip(np.round(np.asarray(b, np.float64) / scales), -(2**31) + 1, 2**31 - 1).astype(np.int32)
    name = lw.fresh("qbias")
    lw.g.add_static(name, raw, QuantParams(tuple(scales), (0,) * len(scales), axis=0))
    return name


def _static_weights(lw: Lowering, data: np.ndarray, w: QConst, axis: int) -> str:
    from edgeport_qnn.sdk import QuantParams

    name = lw.fresh("qweight")
    lw.g.add_static(name, np.ascontiguousarray(data), QuantParams(w.scales, w.zero_points, axis=axis))
    return name


def convolution(lw: Lowering, node: torch.fx.Node) -> Val:
    x = lw.nhwc(lw.value(node.args[0]))
    w = _weights(lw, node, 1)
    if w.raw.ndim != 4:
        raise LoweringError("quantized convolution weights must be 4-D")
    stride, padding, dilation = (pair(arg(node, i, n, d)) for i, n, d in ((3, "stride", 1), (4, "padding", 0),
                                                                            (5, "dilation", 1)))
    groups = int(arg(node, 8, "groups", 1))
    out = static_shape(node)
    params: dict[str, Any] = {"stride": u32(stride), "pad_amount": u32([[padding[0]] * 2, [padding[1]] * 2]),
                              "dilation": u32(dilation)}
    depthwise = groups > 1 and groups == x.shape[1] and w.raw.shape[1] == 1
    if not depthwise:
        params["group"] = groups
    filt = _static_weights(lw, w.raw.transpose(2, 3, 1, 0), w, axis=3)
    ins = [x.name, filt, _bias(lw, node, x, w, 2)]
    return lw.node("DepthWiseConv2d" if depthwise else "Conv2d", ins, (out[0], out[2], out[3], out[1]), params,
                   nhwc=True)


def linear(lw: Lowering, node: torch.fx.Node) -> Val:
    import math

    x = lw.nchw(lw.value(node.args[0]))
    w = _weights(lw, node, 1)
    out = static_shape(node)
    rows = math.prod(x.shape[:-1])
    src = x.name if len(x.shape) == 2 else lw.node("Reshape", [x.name], (rows, x.shape[-1]), like=x).name
    ins = [src, _static_weights(lw, w.raw, w, axis=0), _bias(lw, node, x, w, 2)]
    y = lw.node("FullyConnected", ins, (rows, w.raw.shape[0]), {"keep_dims": False})
    return y if len(out) == 2 else lw.node("Reshape", [y.name], out)


LOWERINGS = {QUANTIZE: quantize, DEQUANTIZE: dequantize, DEQUANTIZE_PER_CHANNEL: dequantize_per_channel}
QUANTIZED_LOWERINGS = {"aten.convolution.default": convolution, "aten.linear.default": linear}

