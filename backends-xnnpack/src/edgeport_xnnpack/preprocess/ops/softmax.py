"""_softmax over the last dimension -> XNNSoftmax (over channels of an NHWC tensor, softmax(dim=1) is free)."""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack.preprocess.builder import NCHW, NHWC, GraphBuilder
from edgeport_xnnpack.preprocess.registry import lowers


@lowers("aten._softmax.default")
def softmax(b: GraphBuilder, node: Any) -> None:
    x, dim = node.args[0], node.args[1]
    xv = b.val(x)
    rank = len(xv.shape)
    layout = NHWC if xv.layout == NHWC and dim % rank == 1 else NCHW
    if layout == NCHW and dim % rank != rank - 1:
        raise ValueError(f"softmax over dim {dim} of a rank-{rank} tensor")
    xv = b.convert(xv, layout)
    out = b.new_val(xv.shape, layout)
    b.add("XNNSoftmax", input_id=xv.id, output_id=out.id, flags=0)
    b.set(node, out)
