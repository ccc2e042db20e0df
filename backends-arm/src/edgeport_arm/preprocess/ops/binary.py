"""``aten.add.Tensor`` / ``aten.sub.Tensor`` / ``aten.mul.Tensor`` with broadcasting.

Integer add/sub: both int8 operands are rescaled to int32 on a common scale (twice the larger input scale,
2**20 finer), added, and left as an int32 accumulator for the quantize that follows; mul multiplies the
zero-point-free int32 operands (scale ``scale_a * scale_b``).
"""

from __future__ import annotations

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType, Op
from edgeport_arm.preprocess.lowering import Lowering
from edgeport_arm.preprocess.ops._common import arg, binary, broadcast_shape, mul, same_layout, scalar
from edgeport_arm.preprocess.values import QParams, Value

_SHIFT = 20
_SHIFT_16 = 15


def _operands(ctx: Lowering, node: torch.fx.Node) -> tuple[Value, Value]:
    if arg(node, 2, "alpha", 1) != 1:
        raise LoweringError("alpha != 1 is not lowered")
    return ctx.settle(ctx.value(node.args[0])), ctx.settle(ctx.value(node.args[1]))


def _add_sub(ctx: Lowering, node: torch.fx.Node, op: object, attr: str) -> Value:
    a, b = same_layout(ctx, *_operands(ctx, node))
    shape = broadcast_shape(a.shape, b.shape)
    if not ctx.integer:
        return Value(binary(ctx, op, attr, a.name, b.name, shape, DType.FP32), shape, DType.FP32, nhwc=a.nhwc)
    if a.q is None or b.q is None:
        raise LoweringError("integer add/sub needs dequantized int8 operands")
    common = 2 * max(a.q.scale, b.q.scale)
    shift = _SHIFT_16 if DType.INT16 in (a.dtype, b.dtype) else _SHIFT  # int16 codes leave 15 bits of headroom
    ints = [ctx.g.rescale(v.name, v.shape, v.dtype, DType.INT32, [v.q.scale / common * (1 << shift)],
                          in_zp=v.q.zero_point) for v in (a, b)]
    out = binary(ctx, op, attr, ints[0], ints[1], shape, DType.INT32)
    return Value(out, shape, DType.INT32, nhwc=a.nhwc, acc_scale=common / (1 << shift))


def add(ctx: Lowering, node: torch.fx.Node) -> Value:
    return _add_sub(ctx, node, Op.ADD, "AddAttribute")


def sub(ctx: Lowering, node: torch.fx.Node) -> Value:
    return _add_sub(ctx, node, Op.SUB, "SubAttribute")


def multiply_scalar(ctx: Lowering, node: torch.fx.Node) -> Value:
    """``mul.Scalar`` by a positive constant: in integer graphs only the scale changes (no operator at all)."""
    x, c = ctx.settle(ctx.value(node.args[0])), float(node.args[1])
    if ctx.integer:
        if not c > 0:
            raise LoweringError(f"integer mul by {c}: only positive scalars are lowered")
        if x.dtype == DType.INT32:
            return x.with_(acc_scale=np.asarray(x.acc_scale, np.float64) * c)
        if x.q is None:
            raise LoweringError("integer mul.Scalar needs a dequantized int8 input")
        return x.with_(q=QParams(x.q.scale * c, x.q.zero_point))
    return x.with_(name=mul(ctx, x.name, scalar(ctx, c, len(x.shape)), x.shape, DType.FP32))


def multiply(ctx: Lowering, node: torch.fx.Node) -> Value:
    a, b = _operands(ctx, node)
    if ctx.integer:
        a, b = ctx.to_int32(a), ctx.to_int32(b)
    a, b = same_layout(ctx, a, b)
    shape = broadcast_shape(a.shape, b.shape)
    out = mul(ctx, a.name, b.name, shape, a.dtype)
    if not ctx.integer:
        return Value(out, shape, DType.FP32, nhwc=a.nhwc)
    return Value(out, shape, DType.INT32, nhwc=a.nhwc, acc_scale=float(a.acc_scale) * float(b.acc_scale))


def add_scalar(ctx: Lowering, node: torch.fx.Node) -> Value:
    """``add.Scalar`` (a constant, e.g. layer norm's eps): int8 input to int32 on a 2**20-times finer scale, plus
    the rounded constant; ADD of a constant in float graphs."""
    x, c = ctx.settle(ctx.value(node.args[0])), float(node.args[1])
    if arg(node, 2, "alpha", 1) != 1:
        raise LoweringError("alpha != 1 is not lowered")
    rank = len(x.shape)
    if not ctx.integer:
        return x.with_(name=binary(ctx, Op.ADD, "AddAttribute", x.name, scalar(ctx, c, rank), x.shape, DType.FP32))
    if x.q is None:
        raise LoweringError("integer add.Scalar needs a dequantized int8 input")
    fine = 2 * x.q.scale / (1 << _SHIFT)
    ints = ctx.g.rescale(x.name, x.shape, DType.INT8, DType.INT32, [x.q.scale / fine], in_zp=x.q.zero_point)
    const = ctx.g.const(np.full((1,) * rank, round(c / fine)), DType.INT32, "addend")
    out = binary(ctx, Op.ADD, "AddAttribute", ints, const, x.shape, DType.INT32)
    return x.with_(name=out, dtype=DType.INT32, q=None, acc_scale=fine)


def power(ctx: Lowering, node: torch.fx.Node) -> Value:
    """``pow.Tensor_Scalar`` by 2 or 3 (RMSNorm's square, GPT-2's tanh GELU cube) as MULs. Integer graphs
    multiply the zero-point-free int32 operand (a square of int8 codes fits in 15 bits, a cube in 22), leaving an
    int32 accumulator with scale ``scale ** exponent`` for the quantize that follows."""
    exponent = node.args[1]
    if exponent not in (2, 3) or isinstance(exponent, bool):
        raise LoweringError(f"pow by {exponent!r}: only squares and cubes are lowered")
    x = ctx.settle(ctx.value(node.args[0]))
    dtype = DType.FP32
    if ctx.integer:
        if x.dtype != DType.INT8:
            raise LoweringError("integer pow needs a dequantized int8 input")
        x, dtype = ctx.to_int32(x), DType.INT32
    out = mul(ctx, x.name, x.name, x.shape, dtype)
    if exponent == 3:
        out = mul(ctx, out, x.name, x.shape, dtype)
    if not ctx.integer:
        return x.with_(name=out)
    return x.with_(name=out, acc_scale=float(x.acc_scale) ** exponent)


def negate(ctx: Lowering, node: torch.fx.Node) -> Value:
    """``neg`` as SUB from zero: of the zero-point-free int32 operand in integer graphs (an int32 accumulator on
    the input's scale, rescaled once by the quantize that follows), of the float tensor otherwise."""
    x = ctx.settle(ctx.value(node.args[0]))
    rank = len(x.shape)
    if not ctx.integer:
        return x.with_(name=binary(ctx, Op.SUB, "SubAttribute", scalar(ctx, 0.0, rank), x.name, x.shape, DType.FP32))
    if x.dtype != DType.INT8:
        raise LoweringError("integer neg needs a dequantized int8 input")
    x = ctx.to_int32(x)
    zero = ctx.g.const(np.zeros((1,) * rank), DType.INT32, "zero")
    return x.with_(name=binary(ctx, Op.SUB, "SubAttribute", zero, x.name, x.shape, DType.INT32))
