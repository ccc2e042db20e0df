"""permute_copy -> a pending view (see preprocess.views), else XNNStaticTranspose."""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack.preprocess.builder import NCHW, GraphBuilder
from edgeport_xnnpack.preprocess.registry import lowers


def _eager(b: GraphBuilder, node: Any) -> None:
    xv = b.value(node.args[0], NCHW)
    rank = len(xv.shape)
    perm = [d % rank for d in node.args[1]]
    out = b.output_of(node)
    if out.layout != NCHW:
        out = b.new_val(out.shape, NCHW)
    b.add("XNNStaticTranspose", num_dims=rank, perm=perm, input_id=xv.id, output_id=out.id, flags=0)
    b.set(node, out)


@lowers("aten.permute_copy.default")
def permute(b: GraphBuilder, node: Any) -> None:
    rank = len(node.meta["val"].shape)
    perm = [d % rank for d in node.args[1]] if rank else []
    if b.views is not None and b.views.defer(node, lambda i: i.transpose(perm), lambda: _eager(b, node)):
        return
    _eager(b, node)
