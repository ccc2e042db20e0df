"""``mm`` / ``bmm`` -> TOSA MATMUL ([N, H, C] x [N, C, W]); integer operands keep their zero points as the
operator's inputs and give an int32 result with scale ``scale_a * scale_b``. ``addmm`` (float graphs: what
Hugging Face's GPT-2 ``Conv1D`` exports to) -> MATMUL + ADD of the bias."""

from __future__ import annotations

import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType, Op
from edgeport_arm.preprocess.lowering import Lowering, static_shape
from edgeport_arm.preprocess.ops._common import align_rank, binary, zero_point_const
from edgeport_arm.preprocess.values import Value


def matmul(ctx: Lowering, node: torch.fx.Node) -> Value:
    return _matmul(ctx, node, *node.args[:2])


def addmm(ctx: Lowering, node: torch.fx.Node) -> Value:
    """``beta * bias + alpha * (a @ b)`` with beta = alpha = 1, in float graphs."""
    if ctx.integer:
        raise LoweringError("addmm is lowered in float graphs only (the int8 quantizers leave it in float)")
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        raise LoweringError("addmm with beta or alpha other than 1")
    product = _matmul(ctx, node, *node.args[1:3])
    bias = align_rank(ctx, ctx.nchw(ctx.value(node.args[0])), len(product.shape))
    out = binary(ctx, Op.ADD, "AddAttribute", product.name, bias.name, product.shape, DType.FP32)
    return product.with_(name=out)


def _matmul(ctx: Lowering, node: torch.fx.Node, a_node: torch.fx.Node, b_node: torch.fx.Node) -> Value:
    a, b = (ctx.nchw(ctx.settle(ctx.value(n))) for n in (a_node, b_node))
    if len(a.shape) == 2:
        a = a.with_(name=ctx.g.reshape(a.name, (1, *a.shape), a.dtype), shape=(1, *a.shape))
        b = b.with_(name=ctx.g.reshape(b.name, (1, *b.shape), b.dtype), shape=(1, *b.shape))
    if len(a.shape) != 3 or len(b.shape) != 3:
        raise LoweringError("matmul operands must be 2-D (mm) or 3-D (bmm)")
    out_shape = (a.shape[0], a.shape[1], b.shape[2])
    if ctx.integer:
        if a.q is None or b.q is None:
            raise LoweringError("integer matmul needs dequantized int8 operands")
        zps = [zero_point_const(ctx, DType.INT8, a.q.zero_point), zero_point_const(ctx, DType.INT8, b.q.zero_point)]
        dtype, acc = DType.INT32, a.q.scale * b.q.scale
    else:
        zps = [zero_point_const(ctx, DType.FP32), zero_point_const(ctx, DType.FP32)]
        dtype, acc = DType.FP32, None
    out = ctx.g.tensor(out_shape, dtype)
    ctx.g.op(Op.MATMUL, [a.name, b.name, *zps], [out], "MatMulAttribute")
    shape = static_shape(node)
    if shape != out_shape:
        out = ctx.g.reshape(out, shape, dtype)
    return Value(out, shape, dtype, acc_scale=acc)
