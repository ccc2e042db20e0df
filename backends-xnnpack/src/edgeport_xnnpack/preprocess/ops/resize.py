"""upsample_bilinear2d -> XNNStaticResizeBilinear2D on NHWC (the output size from the node's shape)."""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack.preprocess.builder import NHWC, GraphBuilder
from edgeport_xnnpack.preprocess.registry import lowers

XNN_FLAG_ALIGN_CORNERS = 0x00000008


@lowers("aten.upsample_bilinear2d.vec")
def upsample_bilinear(b: GraphBuilder, node: Any) -> None:
    xv = b.value(node.args[0], NHWC)
    out = b.output_of(node, NHWC)
    height, width = (int(d) for d in node.meta["val"].shape[2:])
    align_corners = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("align_corners", False))
    b.add("XNNStaticResizeBilinear2D", new_height=height, new_width=width, input_id=xv.id, output_id=out.id,
          flags=XNN_FLAG_ALIGN_CORNERS if align_corners else 0)
    b.set(node, out)
