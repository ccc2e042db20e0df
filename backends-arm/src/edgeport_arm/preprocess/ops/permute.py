"""``permute_copy`` -> one TOSA TRANSPOSE (composed with the NHWC layout when the input lives in it)."""

from __future__ import annotations

import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.lowering import Lowering, static_shape
from edgeport_arm.preprocess.values import NHWC_TO_NCHW, Value


def permute(ctx: Lowering, node: torch.fx.Node) -> Value:
    x = ctx.value(node.args[0])
    rank = len(x.shape)
    perm = [int(d) % rank for d in node.args[1]]
    if x.acc_scale is not None and getattr(x.acc_scale, "ndim", 0) and perm[-1] != rank - 1:
        raise LoweringError("permute of a per-channel int32 accumulator that moves its channel axis")
    physical = [NHWC_TO_NCHW[p] for p in perm] if x.nhwc else perm
    shape = static_shape(node)
    if physical == list(range(rank)):
        return x.with_(shape=shape, nhwc=False)
    return x.with_(name=ctx.g.transpose(x.name, x.shape, physical, x.dtype), shape=shape, nhwc=False)
