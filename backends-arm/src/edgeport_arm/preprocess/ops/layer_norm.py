"""``native_layer_norm`` in float graphs: mean and variance by REDUCE_SUM over the normalized axes, RSQRT,
then the affine weight and bias. Only output 0 (the normalized tensor) is lowered."""

from __future__ import annotations

import math

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType, Op
from edgeport_arm.preprocess.lowering import Lowering
from edgeport_arm.preprocess.ops._common import binary, mul, scalar, unary
from edgeport_arm.preprocess.values import Value


def _reduce_mean(ctx: Lowering, x: str, shape: list[int], axes: range, count: int) -> str:
    reduced = list(shape)
    for a in axes:
        reduced[a] = 1
        out = ctx.g.tensor(reduced, DType.FP32)
        ctx.g.op(Op.REDUCE_SUM, [x], [out], "ReduceSumAttribute", axis=a)
        x = out
    return mul(ctx, x, scalar(ctx, 1.0 / count, len(shape)), reduced, DType.FP32)


def layer_norm(ctx: Lowering, node: torch.fx.Node) -> tuple[Value, None, None]:
    if ctx.integer:
        raise LoweringError("int8 layer norm is not lowered yet; leave it in float (TOSA-1.0+FP) or on the CPU")
    x = ctx.nchw(ctx.value(node.args[0]))
    normalized, weight, bias, eps = node.args[1], node.args[2], node.args[3], float(node.args[4])
    shape, f, rank = list(x.shape), DType.FP32, len(x.shape)
    axes = range(rank - len(normalized), rank)
    count = math.prod(shape[a] for a in axes)
    centered = binary(ctx, Op.SUB, "SubAttribute", x.name, _reduce_mean(ctx, x.name, shape, axes, count), shape, f)
    var = _reduce_mean(ctx, mul(ctx, centered, centered, shape, f), shape, axes, count)
    reduced = [1 if i in axes else d for i, d in enumerate(shape)]
    rstd = unary(ctx, Op.RSQRT, "RsqrtAttribute", binary(ctx, Op.ADD, "AddAttribute", var, scalar(ctx, eps, rank),
                                                             reduced, f), reduced, f)
    y = mul(ctx, centered, rstd, shape, f)
    for param, op, attr in ((weight, Op.MUL, None), (bias, Op.ADD, "AddAttribute")):
        if param is None:
            continue
        c = ctx.const(param)
        if c is None:
            raise LoweringError("layer norm weight and bias must be constants")
        data = np.asarray(c.real(), np.float32).reshape((1,) * (rank - len(normalized)) + tuple(normalized))
        name = ctx.g.const(data, f, "ln_param")
        y = mul(ctx, y, name, shape, f) if attr is None else binary(ctx, op, attr, y, name, shape, f)
    return x.with_(name=y), None, None
