"""``aten.linear`` -> a 1x1 TOSA CONV2D over ``[rows, 1, 1, in_features]`` (how Vela maps fully connected).

With int16 activations (a16w8) the int48 accumulator is narrowed to int32 (by the right shift its bound needs,
none for small layers) before it is reshaped back, as TOSA does not reshape int48."""

from __future__ import annotations

import math

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType
from edgeport_arm.preprocess.lowering import Lowering, static_shape
from edgeport_arm.preprocess.ops._common import arg
from edgeport_arm.preprocess.ops.conv import emit_conv
from edgeport_arm.preprocess.values import Const, Value


def linear(ctx: Lowering, node: torch.fx.Node) -> Value:
    x = ctx.nchw(ctx.settle(ctx.value(node.args[0])))
    w = ctx.const(node.args[1])
    bias_node = arg(node, 2, "bias")
    bias = ctx.const(bias_node) if bias_node is not None else None
    if w is None or (bias_node is not None and bias is None):
        raise LoweringError("weights and bias must be constants")
    out_features, in_features = w.data.shape
    rows = math.prod(x.shape[:-1])
    x4 = x.with_(name=ctx.g.reshape(x.name, (rows, 1, 1, in_features), x.dtype), shape=(rows, 1, 1, in_features),
                 nhwc=True)
    w4 = Const(w.data.reshape(out_features, in_features, 1, 1), w.scales, w.zero_points, w.axis)
    y = emit_conv(ctx, x4, w4, bias, (rows, 1, 1, out_features), depthwise=False, stride=(1, 1), pad=[0, 0, 0, 0],
                  dilation=(1, 1))
    if y.dtype == DType.INT48:  # TOSA cannot reshape int48: narrow to int32 first, by the shift the bound needs
        bound = 32768 * 128 * in_features + float(np.max(np.abs(bias.real()) / y.acc_scale)) if bias else 0.0
        bound = max(bound, 32768 * 128 * in_features)
        shift = max(0, math.ceil(math.log2(bound / 2**31)))
        name = ctx.g.rescale(y.name, y.shape, DType.INT48, DType.INT32, [2.0**-shift] * out_features)
        y = y.with_(name=name, dtype=DType.INT32, acc_scale=np.asarray(y.acc_scale) * 2.0**shift)
    shape = static_shape(node)
    return y.with_(name=ctx.g.reshape(y.name, shape, y.dtype), shape=shape, nhwc=False)
