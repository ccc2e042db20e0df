"""mean over H and W / adaptive average pooling -> XNNGlobalAvgPooling2d (or XNNAvgPooling2d) on NHWC; mean over
the last dim (RMSNorm's ``x.pow(2).mean(-1, keepdim=True)``) -> XNNFullyConnected with a constant ``1/D`` filter,
as layer_norm's reductions (both libXNNPACK 2022 and ExecuTorch's runtime define it; neither has a mean node)."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeport_xnnpack.preprocess.builder import KEEP_DIMS, NCHW, NHWC, GraphBuilder, Val
from edgeport_xnnpack.preprocess.ops.pool import emit_pool
from edgeport_xnnpack.preprocess.registry import lowers
from edgeport_xnnpack.schema.graph import INVALID_ID


def _global(b: GraphBuilder, node: Any) -> None:
    xv = b.value(node.args[0], NHWC)
    n, c = xv.shape[0], xv.shape[1]
    pooled = b.new_val((n, c, 1, 1), NHWC)
    b.add("XNNGlobalAvgPooling2d", input_id=xv.id, output_id=pooled.id, flags=KEEP_DIMS)
    shape = tuple(node.meta["val"].shape)
    if len(shape) == 4:
        b.set(node, pooled)
        return
    out = Val(-1, NCHW, shape)
    out.id = b.new_value(list(shape))  # [N, 1, 1, C] and [N, C] share their bytes
    b.add("XNNStaticReshape", num_dims=len(shape), new_shape=list(shape), input_id=pooled.id, output_id=out.id)
    b.set(node, out)


def _last_dim(b: GraphBuilder, node: Any) -> None:
    xv = b.value(node.args[0], NCHW)
    d = xv.shape[-1]
    ones = b.constant_array(np.full((1, d), 1.0 / d, dtype=np.float32))
    out = b.new_val(xv.shape[:-1] + (1,))
    b.add("XNNFullyConnected", input1_id=xv.id, filter_id=ones, bias_id=INVALID_ID, output_id=out.id, flags=0)
    b.set(node, out)


@lowers("aten.mean.dim")
def mean(b: GraphBuilder, node: Any) -> None:
    rank = len(node.args[0].meta["val"].shape)
    if [int(d) % rank for d in node.args[1]] == [rank - 1]:
        _last_dim(b, node)
    else:
        _global(b, node)


@lowers("aten._adaptive_avg_pool2d.default")
def adaptive_avg_pool(b: GraphBuilder, node: Any) -> None:
    oh, ow = node.args[1]
    _, _, h, w = node.args[0].meta["val"].shape
    if (oh, ow) == (1, 1):
        _global(b, node)
    else:
        kernel = [h // oh, w // ow]
        emit_pool(b, node, "XNNAvgPooling2d", kernel, kernel, [0, 0])
