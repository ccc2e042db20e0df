"""Small helpers shared by the op lowerings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType, Op
from edgeport_arm.preprocess.lowering import Lowering, static_shape
from edgeport_arm.preprocess.values import NCHW_TO_NHWC, QParams, Value

QUANTIZE = "quantized_decomposed.quantize_per_tensor.default"


def arg(node: Any, index: int, name: str, default: Any = None) -> Any:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def pair(v: Any) -> tuple[int, int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return (int(v[0]), int(v[-1]))


def nhwc_shape(node: Any) -> tuple[int, ...]:
    shape = static_shape(node)
    return tuple(shape[i] for i in NCHW_TO_NHWC)


def output_qparams(node: Any) -> QParams | None:
    """The parameters of the quantize node that is ``node``'s only user, if there is one."""
    from edgeport.aot.capability_partitioner import op_name

    users = list(node.users)
    if len(users) == 1 and users[0].op == "call_function" and op_name(users[0].target) == QUANTIZE:
        return QParams(float(users[0].args[1]), int(users[0].args[2]))
    return None


def zero_point_const(ctx: Lowering, dtype: Any, zp: int = 0) -> str:
    return ctx.g.const([0.0 if dtype == DType.FP32 else zp], dtype, "zp")


def align_rank(ctx: Lowering, v: Value, rank: int) -> Value:
    if len(v.shape) == rank:
        return v
    shape = (1,) * (rank - len(v.shape)) + v.shape
    return v.with_(name=ctx.g.reshape(v.name, shape, v.dtype), shape=shape)


def broadcast_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError as exc:
        raise LoweringError(f"shapes {tuple(a)} and {tuple(b)} do not broadcast") from exc


def same_layout(ctx: Lowering, a: Value, b: Value) -> tuple[Value, Value]:
    """Both operands NHWC when both are 4-D and one already is, else both NCHW (ranks aligned)."""
    if (a.nhwc or b.nhwc) and len(a.logical_shape) == 4 and len(b.logical_shape) == 4:
        return ctx.nhwc(a), ctx.nhwc(b)
    a, b = ctx.nchw(a), ctx.nchw(b)
    rank = max(len(a.shape), len(b.shape))
    return align_rank(ctx, a, rank), align_rank(ctx, b, rank)


def mul(ctx: Lowering, a: str, b: str, shape: Sequence[int], dtype: Any) -> str:
    out = ctx.g.tensor(shape, dtype)
    ctx.g.op(Op.MUL, [a, b, ctx.g.const([0], DType.INT8, "shift")], [out], "MulAttribute")
    return out


def binary(ctx: Lowering, op: Any, attr: str, a: str, b: str, shape: Sequence[int], dtype: Any) -> str:
    out = ctx.g.tensor(shape, dtype)
    ctx.g.op(op, [a, b], [out], attr)
    return out


def unary(ctx: Lowering, op: Any, attr: str, a: str, shape: Sequence[int], dtype: Any) -> str:
    out = ctx.g.tensor(shape, dtype)
    ctx.g.op(op, [a], [out], attr)
    return out


def scalar(ctx: Lowering, value: float, rank: int) -> str:
    return ctx.g.const(np.full((1,) * rank, value, np.float32), DType.FP32, "scalar")


def fit_padding(ctx: Lowering, x: Value, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
                pad: list[int]) -> tuple[Value, list[int]]:
    """TOSA wants ``(in - 1 + pads - (k - 1) * d) % stride == 0``; torch floors instead. Drop the bottom/right
    padding (then input rows/columns) that no output uses. ``x`` is NHWC; ``pad`` is [top, bottom, left, right]."""
    pad = list(pad)
    crop = [0, 0]
    for axis in range(2):
        size = x.shape[1 + axis]
        rem = (size - 1 + pad[2 * axis] + pad[2 * axis + 1] - (kernel[axis] - 1) * dilation[axis]) % stride[axis]
        take = min(rem, pad[2 * axis + 1])
        pad[2 * axis + 1] -= take
        crop[axis] = rem - take
    if any(crop):
        shape = (x.shape[0], x.shape[1] - crop[0], x.shape[2] - crop[1], x.shape[3])
        out = ctx.g.tensor(shape, x.dtype)
        ctx.g.op(Op.SLICE, [x.name, ctx.g.shape_const([0, 0, 0, 0], "start"), ctx.g.shape_const(shape, "size")], [out],
                 "SliceAttribute")
        x = x.with_(name=out, shape=shape)
    return x, pad
