"""``aten.convolution`` (2-D, regular or depthwise) -> TOSA CONV2D / DEPTHWISE_CONV2D in NHWC.

Integer graphs: int8 input (zero point as the operator's input_zp), int8 symmetric weights (per channel or per
tensor), bias int32 with scale ``input_scale * weight_scale`` (as the quantizer made it, or quantized here from a
float bias); the int32 result keeps that scale per output channel for the RESCALE of the quantize that follows.
"""

from __future__ import annotations

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType, Op
from edgeport_arm.preprocess.lowering import Lowering
from edgeport_arm.preprocess.ops._common import arg, fit_padding, nhwc_shape, pair, zero_point_const
from edgeport_arm.preprocess.values import Const, Value


def weight_scales(w: Const, channels: int) -> np.ndarray:
    if w.zero_points is not None and np.any(np.asarray(w.zero_points) != 0):
        raise LoweringError("weights must be quantized symmetrically (zero point 0)")
    scales = np.asarray(w.scales, np.float64).reshape(-1)
    return np.broadcast_to(scales, (channels,)).copy() if scales.size == 1 else scales


def _is_accumulator_bias(bias: Const, acc_scale: np.ndarray) -> bool:
    """An int32 bias quantized (zero point 0) on the accumulator's scale ``input_scale * weight_scale``."""
    if not bias.quantized or bias.data.dtype != np.int32 or np.any(np.asarray(bias.zero_points) != 0):
        return False
    scales = np.broadcast_to(np.asarray(bias.scales, np.float64).reshape(-1), acc_scale.shape)
    if not np.allclose(scales, acc_scale, rtol=1e-6, atol=0):
        raise LoweringError(f"int32 bias scales {scales[:4]} ... differ from input_scale * weight_scale "
                            f"{acc_scale[:4]} ...; quantize the bias with a DerivedQuantizationSpec of those two")
    return True


def emit_conv(ctx: Lowering, x: Value, w: Const, bias: Const | None, out_shape: tuple[int, ...], *,
              depthwise: bool, stride: tuple[int, int], pad: list[int], dilation: tuple[int, int]) -> Value:
    """``x`` NHWC; ``w`` in torch layout [O, I/g, KH, KW]; returns the NHWC result (int32 or float32)."""
    x, pad = fit_padding(ctx, x, w.data.shape[2:], stride, dilation, pad)
    out_ch = w.data.shape[0]
    if depthwise:
        cin = x.shape[3]
        kernel = w.data.reshape(cin, out_ch // cin, *w.data.shape[2:]).transpose(2, 3, 0, 1)
    else:
        kernel = w.data.transpose(0, 2, 3, 1)
    op, attr = (Op.DEPTHWISE_CONV2D, "DepthwiseConv2dAttribute") if depthwise else (Op.CONV2D, "Conv2dAttribute")
    if ctx.integer:
        if not w.quantized or x.q is None:
            raise LoweringError("integer convolution needs a quantized input and quantized weights")
        acc_scale = x.q.scale * weight_scales(w, out_ch)
        # int8 activations accumulate in int32; int16 (a16w8) in int48, TOSA's int16 extension
        dtype, bits = (DType.INT48, 48) if x.dtype == DType.INT16 else (DType.INT32, 32)
        if bias is not None and _is_accumulator_bias(bias, acc_scale):
            qbias = bias.data.astype(np.int64).reshape(-1)  # the quantizer's int32 bias: exactly what pt2e adds
        else:
            b = np.zeros(out_ch) if bias is None else bias.real().astype(np.float64)
            qbias = np.clip(np.round(b / acc_scale), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        inputs = [x.name, ctx.g.const(kernel.astype(np.int8), DType.INT8, "weight"),
                  ctx.g.const(qbias, dtype, "bias"), zero_point_const(ctx, x.dtype, x.q.zero_point),
                  zero_point_const(ctx, DType.INT8)]
    else:
        if w.quantized:
            raise LoweringError("quantized weights in a float graph: lower with TosaCompileSpec('TOSA-1.0+INT')")
        b = np.zeros(out_ch, np.float32) if bias is None else bias.real()
        inputs = [x.name, ctx.g.const(kernel, DType.FP32, "weight"), ctx.g.const(b, DType.FP32, "bias"),
                  zero_point_const(ctx, DType.FP32), zero_point_const(ctx, DType.FP32)]
        dtype, acc_scale = DType.FP32, None
    out = ctx.g.tensor(out_shape, dtype)
    ctx.g.op(op, inputs, [out], attr, pad=pad, stride=list(stride), dilation=list(dilation), local_bound=False,
             acc_type=dtype if ctx.integer else DType.FP32)
    return Value(out, out_shape, dtype, nhwc=True, acc_scale=acc_scale)


def convolution(ctx: Lowering, node: torch.fx.Node) -> Value:
    x = ctx.nhwc(ctx.settle(ctx.value(node.args[0])))
    w = ctx.const(node.args[1])
    bias = ctx.const(arg(node, 2, "bias")) if arg(node, 2, "bias") is not None else None
    if w is None or (arg(node, 2, "bias") is not None and bias is None):
        raise LoweringError("weights and bias must be constants")
    groups = int(arg(node, 8, "groups", 1))
    if bool(arg(node, 6, "transposed", False)) or w.data.ndim != 4:
        raise LoweringError("only 2-D, non-transposed convolutions are lowered")
    depthwise = groups > 1
    if depthwise and not (groups == x.shape[3] and w.data.shape[1] == 1):
        raise LoweringError(f"grouped convolution with groups={groups} is neither regular nor depthwise")
    ph, pw = pair(arg(node, 4, "padding", 0))
    return emit_conv(ctx, x, w, bias, nhwc_shape(node), depthwise=depthwise, stride=pair(arg(node, 3, "stride", 1)),
                     pad=[ph, ph, pw, pw], dilation=pair(arg(node, 5, "dilation", 1)))
