"""Boolean ops of float graphs (``TOSA-1.0+FP``): ``eq.Scalar`` (EQUAL), ``logical_not`` (LOGICAL_NOT),
``any.dim`` (REDUCE_ANY) and ``where.self`` (SELECT).

They come from the decomposition of ``scaled_dot_product_attention`` with a mask (rows whose scores are all
``-inf`` are set to zero after the softmax). Boolean tensors live only inside the TOSA graph.
"""

from __future__ import annotations

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType, Op
from edgeport_arm.preprocess.lowering import Lowering
from edgeport_arm.preprocess.ops._common import align_rank, broadcast_shape, scalar, unary
from edgeport_arm.preprocess.ops.reduce import _reduce
from edgeport_arm.preprocess.values import Value


def _float_only(ctx: Lowering, what: str) -> None:
    if ctx.integer:
        raise LoweringError(f"{what} is lowered in float graphs (TOSA-1.0+FP) only")


def _operand(ctx: Lowering, node: object, dtype: object) -> Value:
    """A tensor argument; a constant one is emitted with ``dtype`` (BOOL conditions stay boolean)."""
    c = ctx.const(node)
    if c is None:
        v = ctx.nchw(ctx.value(node))
        if v.dtype != dtype:
            raise LoweringError(f"{getattr(node, 'name', node)} is {v.dtype}, expected {dtype}")
        return v
    data = np.asarray(c.data).astype(np.bool_) if dtype == DType.BOOL else c.real()
    return Value(ctx.g.const(data, dtype, "constant"), data.shape, dtype)


def eq_scalar(ctx: Lowering, node: torch.fx.Node) -> Value:
    _float_only(ctx, "eq.Scalar")
    x = _operand(ctx, node.args[0], DType.FP32)
    out = ctx.g.tensor(x.shape, DType.BOOL)
    ctx.g.op(Op.EQUAL, [x.name, scalar(ctx, float(node.args[1]), len(x.shape))], [out], "EqualAttribute")
    return Value(out, x.shape, DType.BOOL)


def logical_not(ctx: Lowering, node: torch.fx.Node) -> Value:
    _float_only(ctx, "logical_not")
    x = _operand(ctx, node.args[0], DType.BOOL)
    return Value(unary(ctx, Op.LOGICAL_NOT, "LogicalNotAttribute", x.name, x.shape, DType.BOOL), x.shape, DType.BOOL)


def any_dim(ctx: Lowering, node: torch.fx.Node) -> Value:
    _float_only(ctx, "any.dim")
    return _reduce(ctx, node, _operand(ctx, node.args[0], DType.BOOL), Op.REDUCE_ANY, "ReduceAnyAttribute")


def where(ctx: Lowering, node: torch.fx.Node) -> Value:
    _float_only(ctx, "where.self")
    cond, a, b = (_operand(ctx, n, t) for n, t in zip(node.args[:3], (DType.BOOL, DType.FP32, DType.FP32)))
    rank = max(len(v.shape) for v in (cond, a, b))
    cond, a, b = (align_rank(ctx, v, rank) for v in (cond, a, b))
    shape = broadcast_shape(broadcast_shape(cond.shape, a.shape), b.shape)
    out = ctx.g.tensor(shape, DType.FP32)
    ctx.g.op(Op.SELECT, [cond.name, a.name, b.name], [out], "SelectAttribute")
    return Value(out, shape, DType.FP32)
