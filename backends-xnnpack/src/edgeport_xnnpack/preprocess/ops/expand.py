"""expand_copy: a no-op expand is a reshape (:func:`.reshape.reshape`); one that broadcasts size-1 dims (grouped-
query attention's ``repeat_kv`` of a key or value computed in the partition) is XNNConcatenate of that many copies
of the input along each expanded dim, in NCHW (leading dims the expand adds come first, by a reshape). XNNPACK has
no broadcast node in either library; concatenation is native in ExecuTorch's and a host copy on edgeport's runtime,
where it keeps the attention in the same delegate as the projections feeding it."""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack.preprocess.builder import NCHW, GraphBuilder, Val
from edgeport_xnnpack.preprocess.ops.cat import concatenate
from edgeport_xnnpack.preprocess.ops.reshape import reshape
from edgeport_xnnpack.preprocess.registry import lowers


@lowers("aten.expand_copy.default")
def expand(b: GraphBuilder, node: Any) -> None:
    shape = tuple(int(d) for d in node.meta["val"].shape)
    src_shape = tuple(int(d) for d in node.args[0].meta["val"].shape)
    if src_shape == shape:
        reshape(b, node)
        return
    cur = b.value(node.args[0], NCHW)
    padded = (1,) * (len(shape) - len(src_shape)) + src_shape
    if padded != src_shape:  # the dims the expand adds in front
        out = b.new_val(padded, NCHW)
        b.add("XNNStaticReshape", num_dims=len(padded), new_shape=out.dims, input_id=cur.id, output_id=out.id,
              flags=0)
        cur = out
    axes = [d for d, (a, o) in enumerate(zip(padded, shape, strict=True)) if a != o]
    for d in axes:
        copies = [Val(cur.id, NCHW, cur.shape)] * shape[d]
        cur = concatenate(b, copies, d, d, NCHW, node if d == axes[-1] else None)
