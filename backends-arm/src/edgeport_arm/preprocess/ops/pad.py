"""``constant_pad_nd`` -> TOSA PAD (the pad value quantized in integer graphs)."""

from __future__ import annotations

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType, Op
from edgeport_arm.preprocess.lowering import Lowering, static_shape
from edgeport_arm.preprocess.ops._common import arg
from edgeport_arm.preprocess.values import Value


def constant_pad(ctx: Lowering, node: torch.fx.Node) -> Value:
    x = ctx.nchw(ctx.settle(ctx.value(node.args[0])))
    pads = [int(p) for p in node.args[1]]
    value = float(arg(node, 2, "value", 0.0))
    rank = len(x.shape)
    if any(p < 0 for p in pads) or len(pads) % 2 or len(pads) // 2 > rank:
        raise LoweringError(f"padding {pads}: only non-negative padding of at most {rank} dims is lowered")
    padding = [0] * (2 * rank)
    for i in range(len(pads) // 2):  # torch lists the last dim first
        d = rank - 1 - i
        padding[2 * d], padding[2 * d + 1] = pads[2 * i], pads[2 * i + 1]
    if ctx.integer:
        if x.q is None:
            raise LoweringError("integer pad needs a dequantized int8 input")
        pad_value = ctx.g.const([int(np.clip(round(value / x.q.scale) + x.q.zero_point, -128, 127))], DType.INT8)
    else:
        pad_value = ctx.g.const([value], DType.FP32)
    shape = static_shape(node)
    out = ctx.g.tensor(shape, x.dtype)
    ctx.g.op(Op.PAD, [x.name, ctx.g.shape_const(padding, "padding"), pad_value], [out], "PadAttribute")
    return x.with_(name=out, shape=shape)
