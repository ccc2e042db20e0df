"""``slice_copy`` (step 1) -> TOSA SLICE in torch's order."""

from __future__ import annotations

import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import Op
from edgeport_arm.preprocess.lowering import Lowering, static_shape
from edgeport_arm.preprocess.ops._common import arg
from edgeport_arm.preprocess.values import Value


def slice_copy(ctx: Lowering, node: torch.fx.Node) -> Value:
    x = ctx.nchw(ctx.settle(ctx.value(node.args[0])))
    rank = len(x.shape)
    dim = int(arg(node, 1, "dim", 0)) % rank
    if int(arg(node, 4, "step", 1)) != 1:
        raise LoweringError("slices with a step other than 1 are not lowered")
    start = arg(node, 2, "start", 0) or 0
    start = max(0, min(int(start) + (x.shape[dim] if int(start) < 0 else 0), x.shape[dim]))
    shape = static_shape(node)
    starts = [0] * rank
    starts[dim] = start
    out = ctx.g.tensor(shape, x.dtype)
    ctx.g.op(Op.SLICE, [x.name, ctx.g.shape_const(starts, "start"), ctx.g.shape_const(shape, "size")], [out],
             "SliceAttribute")
    return x.with_(name=out, shape=shape)


def select(ctx: Lowering, node: torch.fx.Node) -> Value:
    """``select_copy.int``: a one-wide SLICE, then a RESHAPE without that dimension."""
    x = ctx.nchw(ctx.settle(ctx.value(node.args[0])))
    rank = len(x.shape)
    dim = int(node.args[1]) % rank
    index = int(node.args[2])
    index += x.shape[dim] if index < 0 else 0
    if not 0 <= index < x.shape[dim]:
        raise LoweringError(f"select index {node.args[2]} out of range for size {x.shape[dim]}")
    starts, size = [0] * rank, list(x.shape)
    starts[dim], size[dim] = index, 1
    out = ctx.g.tensor(size, x.dtype)
    ctx.g.op(Op.SLICE, [x.name, ctx.g.shape_const(starts, "start"), ctx.g.shape_const(size, "size")], [out],
             "SliceAttribute")
    shape = static_shape(node)
    return x.with_(name=ctx.g.reshape(out, shape, x.dtype), shape=shape)


def split_with_sizes(ctx: Lowering, node: torch.fx.Node) -> tuple[Value, ...]:
    """``split_with_sizes_copy`` (GPT-2's q / k / v split): one SLICE per piece along ``dim``; integer pieces keep
    the input's parameters (a quantize after each rescales where its own differ)."""
    x = ctx.nchw(ctx.settle(ctx.value(node.args[0])))
    rank = len(x.shape)
    sizes = [int(s) for s in node.args[1]]
    dim = int(arg(node, 2, "dim", 0)) % rank
    if sum(sizes) != x.shape[dim] or any(s < 0 for s in sizes):
        raise LoweringError(f"split sizes {sizes} do not add up to dimension {dim} of shape {x.shape}")
    pieces, start = [], 0
    for size in sizes:
        starts, shape = [0] * rank, list(x.shape)
        starts[dim], shape[dim] = start, size
        out = ctx.g.tensor(shape, x.dtype)
        ctx.g.op(Op.SLICE, [x.name, ctx.g.shape_const(starts, "start"), ctx.g.shape_const(shape, "size")], [out],
                 "SliceAttribute")
        pieces.append(x.with_(name=out, shape=tuple(shape)))
        start += size
    return tuple(pieces)
