"""mean over H and W / adaptive average pooling -> XNNGlobalAvgPooling2d (or XNNAvgPooling2d) on NHWC."""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack.preprocess.builder import KEEP_DIMS, NCHW, NHWC, GraphBuilder, Val
from edgeport_xnnpack.preprocess.ops.pool import emit_pool
from edgeport_xnnpack.preprocess.registry import lowers


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


@lowers("aten.mean.dim")
def mean(b: GraphBuilder, node: Any) -> None:
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
