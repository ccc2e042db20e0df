"""``expand_copy`` -> TOSA TILE (leading unit dimensions added by a RESHAPE first). In integer graphs the
expanded tensor keeps its input's quantization parameters (the quantizers share them): only values are copied."""

from __future__ import annotations

import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import Op
from edgeport_arm.preprocess.lowering import Lowering, static_shape
from edgeport_arm.preprocess.ops._common import align_rank
from edgeport_arm.preprocess.values import Value


def expand(ctx: Lowering, node: torch.fx.Node) -> Value:
    x = ctx.nchw(ctx.settle(ctx.value(node.args[0])))
    shape = static_shape(node)
    if len(x.shape) > len(shape):
        raise LoweringError(f"expand of a rank-{len(x.shape)} tensor to rank {len(shape)}")
    x = align_rank(ctx, x, len(shape))
    if any(i != o and i != 1 for i, o in zip(x.shape, shape)):
        raise LoweringError(f"cannot expand shape {x.shape} to {shape}: only size-1 dimensions are repeated")
    if x.shape == shape:
        return x
    multiples = [o // i for i, o in zip(x.shape, shape)]
    out = ctx.g.tensor(shape, x.dtype)
    ctx.g.op(Op.TILE, [x.name, ctx.g.shape_const(multiples, "multiples")], [out], "TileAttribute")
    return x.with_(name=out, shape=shape)
