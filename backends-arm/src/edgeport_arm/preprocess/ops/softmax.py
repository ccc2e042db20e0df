"""``_softmax`` in float graphs: REDUCE_MAX, SUB, EXP, REDUCE_SUM, RECIPROCAL, MUL along the axis."""

from __future__ import annotations

import torch
import tosa_serializer as ts

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType, Op
from edgeport_arm.preprocess.lowering import Lowering
from edgeport_arm.preprocess.ops._common import binary, mul, unary
from edgeport_arm.preprocess.values import Value


def softmax(ctx: Lowering, node: torch.fx.Node) -> Value:
    if ctx.integer:
        raise LoweringError("int8 softmax is not lowered yet; leave it in float (TOSA-1.0+FP) or on the CPU")
    x = ctx.nchw(ctx.value(node.args[0]))
    axis = int(node.args[1]) % len(x.shape)
    shape, f = x.shape, DType.FP32
    reduced = list(shape)
    reduced[axis] = 1
    peak = ctx.g.tensor(reduced, f)
    ctx.g.op(Op.REDUCE_MAX, [x.name], [peak], "ReduceMaxAttribute", axis=axis,
             nan_mode=ts.NanPropagationMode.PROPAGATE)
    e = unary(ctx, Op.EXP, "ExpAttribute", binary(ctx, Op.SUB, "SubAttribute", x.name, peak, shape, f), shape, f)
    total = ctx.g.tensor(reduced, f)
    ctx.g.op(Op.REDUCE_SUM, [e], [total], "ReduceSumAttribute", axis=axis)
    inv = unary(ctx, Op.RECIPROCAL, "ReciprocalAttribute", total, reduced, f)
    return x.with_(name=mul(ctx, e, inv, shape, f))
