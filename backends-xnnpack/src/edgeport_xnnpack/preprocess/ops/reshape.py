"""view / squeeze / unsqueeze / clone / alias -> a pending view (see preprocess.views), else XNNStaticReshape (clone: an
identity reshape); a no-op expand too (:mod:`.expand`)."""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack.preprocess.builder import NCHW, GraphBuilder
from edgeport_xnnpack.preprocess.registry import lowers


def _eager(b: GraphBuilder, node: Any) -> None:
    src = b.val(node.args[0])
    shape = tuple(node.meta["val"].shape)
    if shape == src.shape:  # clone, no-op expand/view: keep the layout
        out = b.new_val(shape, src.layout)
    else:
        src = b.convert(src, NCHW)
        out = b.new_val(shape, NCHW)
    b.add("XNNStaticReshape", num_dims=len(out.dims), new_shape=out.dims, input_id=src.id, output_id=out.id,
          flags=0)
    b.set(node, out)


@lowers("aten.view_copy.default", "aten._unsafe_view.default", "aten.squeeze_copy.dims", "aten.squeeze_copy.dim",
        "aten.unsqueeze_copy.default", "aten.clone.default", "aten.alias_copy.default")
def reshape(b: GraphBuilder, node: Any) -> None:
    shape = tuple(node.meta["val"].shape)
    if b.views is not None and b.views.defer(node, lambda i: i.reshape(shape), lambda: _eager(b, node)):
        return
    _eager(b, node)
