"""slice_copy (step 1) / select_copy -> a pending view (see preprocess.views), else XNNStaticSlice (+ an
XNNStaticReshape for select)."""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack.preprocess.builder import NCHW, GraphBuilder
from edgeport_xnnpack.preprocess.registry import lowers


def _slice(b: GraphBuilder, x: Any, dim: int, start: int, end: int) -> Any:
    xv = b.value(x, NCHW)
    shape = list(xv.shape)
    offsets = [0] * len(shape)
    offsets[dim] = start
    sizes = list(shape)
    sizes[dim] = end - start
    out = b.new_val(tuple(sizes))
    b.add("XNNStaticSlice", num_dims=len(shape), offsets=offsets, sizes=sizes, input_id=xv.id, output_id=out.id,
          flags=0)
    return out


def _bounds(size: int, start: Any, end: Any) -> tuple[int, int]:
    start = 0 if start is None else start
    end = size if end is None else end
    start = max(0, min(size, start + size if start < 0 else start))
    end = max(start, min(size, end + size if end < 0 else end))
    return start, end


@lowers("aten.slice_copy.Tensor")
def slice_copy(b: GraphBuilder, node: Any) -> None:
    x = node.args[0]
    rank = len(x.meta["val"].shape)
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % rank
    start = node.args[2] if len(node.args) > 2 else node.kwargs.get("start")
    end = node.args[3] if len(node.args) > 3 else node.kwargs.get("end")
    start, end = _bounds(x.meta["val"].shape[dim], start, end)
    index = (slice(None),) * dim + (slice(start, end),)
    if b.views is not None and b.views.defer(node, lambda i: i[index],
                                             lambda: b.set(node, _slice(b, x, dim, start, end))):
        return
    b.set(node, _slice(b, x, dim, start, end))


@lowers("aten.select_copy.int")
def select_copy(b: GraphBuilder, node: Any) -> None:
    x, dim, index = node.args
    shape = x.meta["val"].shape
    dim %= len(shape)
    index = index + shape[dim] if index < 0 else index
    if b.views is not None and b.views.defer(node, lambda i: i.take(index, axis=dim),
                                             lambda: _select(b, node, x, dim, index)):
        return
    _select(b, node, x, dim, index)


def _select(b: GraphBuilder, node: Any, x: Any, dim: int, index: int) -> None:
    part = _slice(b, x, dim, index, index + 1)
    out = b.output_of(node)
    b.add("XNNStaticReshape", num_dims=len(out.dims), new_shape=out.dims, input_id=part.id, output_id=out.id,
          flags=0)
    b.set(node, out)
