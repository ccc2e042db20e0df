"""``amax`` / ``sum.dim_IntList``: REDUCE_MAX / REDUCE_SUM along each reduced axis (torch's order).

Integer graphs: ``amax`` reduces the int8 codes themselves (the maximum of codes is the code of the maximum, so
the parameters are kept); ``sum`` removes the zero point in a RESCALE to int32, sums exactly in int32 and leaves
an accumulator (scale: the input's) for the quantize that follows, which rescales it once.
"""

from __future__ import annotations

import torch
import tosa_serializer as ts

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType, Op
from edgeport_arm.preprocess.lowering import Lowering, static_shape
from edgeport_arm.preprocess.ops._common import arg
from edgeport_arm.preprocess.values import Value


def _dims(node: torch.fx.Node, rank: int) -> list[int]:
    dims = arg(node, 1, "dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted({int(d) % rank for d in dims})


def _reduce(ctx: Lowering, node: torch.fx.Node, x: Value, op: object, attr: str, **fields: object) -> Value:
    shape, name = list(x.shape), x.name
    for d in _dims(node, len(shape)):
        shape[d] = 1
        out = ctx.g.tensor(shape, x.dtype)
        ctx.g.op(op, [name], [out], attr, axis=d, **fields)
        name = out
    y = x.with_(name=name, shape=tuple(shape))
    out_shape = static_shape(node)
    if tuple(shape) != out_shape:  # keepdim=False
        y = y.with_(name=ctx.g.reshape(y.name, out_shape, y.dtype), shape=out_shape)
    return y


def amax(ctx: Lowering, node: torch.fx.Node) -> Value:
    x = ctx.nchw(ctx.settle(ctx.value(node.args[0])))
    if ctx.integer and (x.dtype != DType.INT8 or x.q is None):
        raise LoweringError("integer amax needs a dequantized int8 input")
    return _reduce(ctx, node, x, Op.REDUCE_MAX, "ReduceMaxAttribute", nan_mode=ts.NanPropagationMode.PROPAGATE)


def sum_dim(ctx: Lowering, node: torch.fx.Node) -> Value:
    if arg(node, 3, "dtype") not in (None, torch.float32):
        raise LoweringError("sum with a dtype other than float32 is not lowered")
    x = ctx.nchw(ctx.value(node.args[0]))
    if ctx.integer:
        x = ctx.to_int32(x)
    return _reduce(ctx, node, x, Op.REDUCE_SUM, "ReduceSumAttribute")
