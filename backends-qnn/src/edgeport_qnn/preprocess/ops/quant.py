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
from edgeport_qnn.preprocess.lowering import Const, Deq, Lowering, QConst, Val, arg, static_shape
from edgeport_qnn.preprocess.ops._common import pair, u32

QUANTIZE = "quantized_decomposed.quantize_per_tensor.default"
DEQUANTIZE = "quantized_decomposed.dequantize_per_tensor.default"
DEQUANTIZE_PER_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"
#: (torch dtype, quant_min, quant_max) -> the numpy (QNN) type of the quantized tensor; 16-bit activations come
#: as int32 holding [0, 65535] (ExecuTorch's convention) and become QNN UFIXED_POINT_16
_RANGES = {(torch.uint8, 0, 255): np.uint8, (torch.int8, -128, 127): np.int8, (torch.int32, 0, 65535): np.uint16,
           (torch.uint16, 0, 65535): np.uint16, (torch.int16, -32768, 32767): np.int16}

#: ops with a quantized form (the others dequantize their inputs and run in float)
QUANT_OPS = {"aten.convolution.default", "aten.linear.default", "aten.add.Tensor", "aten.sub.Tensor",
             "aten.mul.Tensor", "aten.relu.default", "aten.hardtanh.default", "aten.max_pool2d.default",
             "aten.avg_pool2d.default", "aten.mean.dim", "aten.view_copy.default", "aten.permute_copy.default",
             "aten.cat.default", "aten.sigmoid.default", "aten.tanh.default", "aten.hardswish.default",
             "aten.gelu.default", "aten._softmax.default", "aten.native_layer_norm.default", "aten.bmm.default",
             "aten.mm.default", "aten.squeeze_copy.dims", "aten.unsqueeze_copy.default", "aten.clone.default",
             "aten.select_copy.int", "aten.slice_copy.Tensor", "aten.expand_copy.default",
             "aten.constant_pad_nd.default"}


_CLAMPS = {"aten.relu.default", "aten.hardtanh.default"}


def quantizing_user(node: torch.fx.Node) -> torch.fx.Node | None:
    """The quantize that fixes ``node``'s output parameters: its only user, or the only user of a relu / hardtanh
    that is its only user (fused, as the quantizer annotates it)."""
    import operator

    from edgeport.aot.capability_partitioner import op_name

    users = list(node.users)
    if len(users) != 1 or users[0].op != "call_function" or users[0].args[0] is not node:
        return None
    user = users[0]
    if user.target is operator.getitem:  # layer norm: its normalized output only
        return quantizing_user(user) if user.args[1] == 0 else None
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
    np_dtype = _RANGES.get((dtype, int(qmin), int(qmax)))
    if np_dtype is None:
        raise LoweringError(f"{node.name}: quantization {dtype} [{qmin}, {qmax}] is not lowered (full-range uint8, "
                            "int8, int16, or [0, 65535] in int32 for uint16)")
    return np_dtype, QuantParams(float(scale), int(zp))


def quantize(lw: Lowering, node: torch.fx.Node) -> Val:
    dtype, q = quant_of(node)
    src = lw.values.get(node.args[0])
    if isinstance(src, Val) and src.quant == q and src.dtype == dtype:
        return src  # produced quantized by the op before it
    x = lw.value(node.args[0])
    return lw.node("Quantize", [x.name], x.qnn_shape, nhwc=x.nhwc, logical=x.shape,
                   like=Val("", (), dtype=dtype, quant=q))


def dequantize(lw: Lowering, node: torch.fx.Node) -> Deq | QConst:
    src = lw.values.get(node.args[0])
    if isinstance(src, Const) and not isinstance(src, QConst):  # a quantized constant (folded by convert_pt2e)
        dtype, q = quant_of(node)
        raw = np.asarray(src.data).astype(dtype)
        real = (raw.astype(np.float64) - q.zero_points[0]) * q.scales[0]
        return QConst(real.astype(np.float32), raw=raw, scales=q.scales, zero_points=q.zero_points, axis=None)
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
    if (not isinstance(w, QConst) or w.raw.dtype not in (np.int8, np.int16) or w.axis != 0
            or any(w.zero_points)):
        raise LoweringError(f"{node.name}: quantized weights must be int8 or int16, symmetric, per output channel")
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


def gelu(lw: Lowering, node: torch.fx.Node) -> Val:
    """QNN ``Gelu`` on quantized tensors (the HTP prepares it quantized; only its fp32 form is refused)."""
    return lw.unary("Gelu", lw.value(node.args[0]))


def layer_norm(lw: Lowering, node: torch.fx.Node) -> tuple:
    """QNN ``LayerNorm`` on quantized tensors: the HTP takes it with a uint8 (asymmetric, per-tensor) gamma and an
    int32 beta, the only forms it validates (int8/16-bit/float gamma are refused)."""
    from edgeport_qnn.sdk import QuantParams

    v = lw.nchw(lw.value(node.args[0]))
    normalized = [int(d) for d in node.args[1]]
    w = lw.const(node.args[2]) if node.args[2] is not None else np.ones(normalized, np.float32)
    b = lw.const(node.args[3]) if node.args[3] is not None else np.zeros(normalized, np.float32)
    if w is None or b is None:
        raise LoweringError("layer norm weight and bias must be constants")
    w64 = np.asarray(w, np.float64)
    lo, hi = min(float(w64.min()), 0.0), max(float(w64.max()), 0.0)
    scale = (hi - lo) / 255 if hi > lo else 1.0
    zp = int(np.clip(round(-lo / scale), 0, 255))
    gamma = np.clip(np.round(w64 / scale) + zp, 0, 255).astype(np.uint8)
    g_name = lw.fresh("qgamma")
    lw.g.add_static(g_name, gamma, QuantParams(scale, zp))
    b64 = np.asarray(b, np.float64)
    b_scale = max(float(np.abs(b64).max()), 1e-6) / 2**30
    b_name = lw.fresh("qbeta")
    lw.g.add_static(b_name, np.round(b64 / b_scale).astype(np.int32), QuantParams(b_scale, 0))
    rank = len(v.shape)
    axes = np.asarray(range(rank - len(normalized), rank), np.uint32)
    y = lw.node("LayerNorm", [v.name, g_name, b_name], v.shape, {"axes": axes, "epsilon": float(node.args[4])})
    return (y, None, None)


def matmul(lw: Lowering, node: torch.fx.Node) -> Val:
    """QNN ``MatMul`` on quantized tensors. The HTP's 16-bit ``MatMul`` takes only a symmetric second operand
    (zero point 32768): another one is first re-encoded with QNN ``Convert`` to the symmetric range covering it."""
    from edgeport_qnn.sdk import QuantParams

    a, b = lw.nchw(lw.value(node.args[0])), lw.nchw(lw.value(node.args[1]))
    if b.dtype is np.uint16 and b.quant.zero_points[0] != 32768:
        s, z = b.quant.scales[0], b.quant.zero_points[0]
        bound = max(z * s, (65535 - z) * s)
        b = lw.node("Convert", [b.name], b.shape, like=Val("", (), dtype=np.uint16,
                                                            quant=QuantParams(bound / 32767, 32768)))
    return lw.node("MatMul", [a.name, b.name], static_shape(node), {"transpose_in0": False, "transpose_in1": False})


LOWERINGS = {QUANTIZE: quantize, DEQUANTIZE: dequantize, DEQUANTIZE_PER_CHANNEL: dequantize_per_channel}
QUANTIZED_LOWERINGS = {"aten.convolution.default": convolution, "aten.linear.default": linear,
                       "aten.gelu.default": gelu, "aten.native_layer_norm.default": layer_norm,
                       "aten.bmm.default": matmul, "aten.mm.default": matmul}

