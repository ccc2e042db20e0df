"""mean over dimensions (``ReduceMean``); an NHWC input stays NHWC when the dimensions are kept."""

from __future__ import annotations

import torch

from edgeport_qnn.preprocess.lowering import NCHW_TO_NHWC, Lowering, Val, arg, static_shape
from edgeport_qnn.preprocess.ops._common import u32


def mean_dim(lw: Lowering, node: torch.fx.Node) -> Val:
    v = lw.value(node.args[0])
    rank = len(v.shape)
    dims = arg(node, 1, "dim", None)
    dims = sorted({int(d) % rank for d in (dims if dims else range(rank))})
    keep = bool(arg(node, 2, "keepdim", False))
    out = static_shape(node)
    # reduce with keep_dims (QNN's HTP prepares that form reliably), then reshape away the reduced dimensions;
    # an NHWC input stays NHWC when the kept dimensions are in the same order in both layouts
    # a 4-D mean over H and W (not C) always runs NHWC: in NCHW (QNN axes 2, 3, the last two) a FullyConnected or
    # MatMul after it fails to prepare (graphFinalize: QNN_COMMON_ERROR_MEM_ALLOC; HF ResNet's pooler -> classifier)
    spatial = rank == 4 and {2, 3} <= set(dims) and 1 not in dims
    if spatial and not v.nhwc:
        v = lw.nhwc(v)
    if v.nhwc and (keep or {2, 3} <= set(dims)):
        axes = sorted(NCHW_TO_NHWC.index(d) for d in dims)
        kept = tuple(1 if d in dims else v.shape[d] for d in range(rank))
        y = lw.node("ReduceMean", [v.name], tuple(kept[i] for i in NCHW_TO_NHWC),
                    {"axes": u32(axes), "keep_dims": True}, nhwc=True)
    else:
        v = lw.nchw(v)
        kept = tuple(1 if d in dims else v.shape[d] for d in range(rank))
        y = lw.node("ReduceMean", [v.name], kept, {"axes": u32(dims), "keep_dims": True})
    if keep:
        return y
    return lw.node("Reshape", [y.name], out if out else (1,), logical=out)

LOWERINGS = {"aten.mean.dim": mean_dim}
