"""``view_copy`` / ``_unsafe_view`` / ``squeeze_copy`` / ``unsqueeze_copy`` / ``clone`` -> TOSA RESHAPE (in
torch's order; a clone is free). Integer values keep their quantization parameters."""

from __future__ import annotations

import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.lowering import Lowering, static_shape
from edgeport_arm.preprocess.values import Value


def reshape(ctx: Lowering, node: torch.fx.Node) -> Value:
    x = ctx.value(node.args[0])
    shape = static_shape(node)
    if x.logical_shape == shape:
        return x
    x = ctx.nchw(x)
    if x.acc_scale is not None and getattr(x.acc_scale, "ndim", 0) and shape[-1:] != x.shape[-1:]:
        raise LoweringError("reshape of a per-channel int32 accumulator that moves its channel axis")
    return x.with_(name=ctx.g.reshape(x.name, shape, x.dtype), shape=shape)


def clone(ctx: Lowering, node: torch.fx.Node) -> Value:
    return ctx.value(node.args[0])
