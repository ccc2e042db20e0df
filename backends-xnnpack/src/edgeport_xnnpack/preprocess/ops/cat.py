"""cat -> XNNConcatenate2..5 (chained for more inputs); along channels of NHWC inputs it stays NHWC."""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack.preprocess.builder import NCHW, NHWC, GraphBuilder, Val, nhwc_dim
from edgeport_xnnpack.preprocess.registry import lowers
from edgeport_xnnpack.schema.graph import INVALID_ID


@lowers("aten.cat.default")
def cat(b: GraphBuilder, node: Any) -> None:
    tensors = [t for t in node.args[0] if t.meta["val"].numel() > 0 or len(node.args[0]) == 1]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    rank = len(node.meta["val"].shape)
    dim %= rank
    nhwc = rank == 4 and all(t in b.env and b.env[t].layout == NHWC for t in tensors)
    layout = NHWC if nhwc else NCHW
    axis = nhwc_dim(dim) if nhwc else dim
    vals = [b.value(t, layout) for t in tensors]
    if len(vals) == 1:
        out = b.new_val(vals[0].shape, layout)
        b.add("XNNStaticReshape", num_dims=rank, new_shape=out.dims, input_id=vals[0].id, output_id=out.id)
        b.set(node, out)
        return
    concatenate(b, vals, dim, axis, layout, node)


def concatenate(b: GraphBuilder, vals: list[Val], dim: int, axis: int, layout: str, node: Any = None) -> Val:
    """``vals`` (two or more, in ``layout``) joined along logical ``dim`` (XNNPACK ``axis``): XNNConcatenate2..5,
    each further group of up to four joined to the result so far; the result is ``node``'s output when given."""
    while True:
        group, vals = vals[:5], vals[5:]
        shape = list(group[0].shape)
        shape[dim] = sum(v.shape[dim] for v in group)
        final = not vals
        out = b.output_of(node, layout) if final and node is not None else b.new_val(tuple(shape), layout)
        if final and out.layout != layout:
            out = b.new_val(out.shape, layout)
        ids = [v.id for v in group] + [INVALID_ID] * (5 - len(group))
        b.add(f"XNNConcatenate{len(group)}", axis=axis, input1_id=ids[0], input2_id=ids[1], input3_id=ids[2],
              input4_id=ids[3], input5_id=ids[4], output_id=out.id, flags=0)
        if final:
            return b.set(node, out) if node is not None else out
        vals = [Val(out.id, layout, tuple(shape))] + vals
