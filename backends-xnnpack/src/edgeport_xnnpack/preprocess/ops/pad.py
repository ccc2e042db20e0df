"""constant_pad_nd -> XNNStaticConstantPad (in the input's layout)."""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack.preprocess.builder import NHWC, GraphBuilder, nhwc_dim
from edgeport_xnnpack.preprocess.registry import lowers


@lowers("aten.constant_pad_nd.default")
def constant_pad(b: GraphBuilder, node: Any) -> None:
    xv = b.val(node.args[0])
    pads = list(node.args[1])
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0.0)
    rank = len(xv.shape)
    pre, post = [0] * rank, [0] * rank
    for i in range(len(pads) // 2):
        d = rank - 1 - i
        pre[d], post[d] = pads[2 * i], pads[2 * i + 1]
    if xv.layout == NHWC:
        pre_p, post_p = [0] * 4, [0] * 4
        for d in range(4):
            pre_p[nhwc_dim(d)], post_p[nhwc_dim(d)] = pre[d], post[d]
        pre, post = pre_p, post_p
    out = b.output_of(node, xv.layout)
    b.add("XNNStaticConstantPad", pre_paddings=pre, post_paddings=post, padding_value=float(value),
          input_id=xv.id, output_id=out.id, flags=0)
    b.set(node, out)
