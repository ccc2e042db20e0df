"""Partitions with bounded dynamic dims: one blob that declares the upper bounds, encoded as ExecuTorch's are.

ExecuTorch's XNNPACK blobs declare every value at its upper-bound dims; its runtime reshapes the XNNPACK
runtime to each call's input shapes and XNNPACK infers every other shape from the nodes' parameters, which
therefore must hold at every size: a static reshape marks the one dim it infers with 0 in ``new_shape`` (at
most one), a slice keeps a dynamic dim whole with size 0, and nothing else may depend on a dynamic dim.

Preprocess lowers such a partition twice, with each symbol at its upper bound and at another size
(:func:`points`, :func:`at_point`: every ``meta["val"]`` is made concrete), and :func:`merge` compares the two
graphs: the dims that differ are the dynamic ones, and the node parameters that differ must be encodable as
above, or :class:`NotEncodable` says which node is not. View folding factors index arrays, which can depend on
the sizes (or need a reshape with two dynamic dims); when it does, preprocess lowers op by op instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.export import ExportedProgram

from edgeport.errors import LoweringError
from edgeport_xnnpack.schema.graph import Graph, XNode

__all__ = ["NotEncodable", "at_point", "merge", "points"]

Point = dict[Any, int]


class NotEncodable(Exception):
    """The two lowerings differ in a way a blob cannot express for every size."""


def _vals(val: Any) -> list[Any]:
    return list(val) if isinstance(val, (tuple, list)) else [val]


def _symbols(ep: ExportedProgram) -> dict[Any, torch.SymInt]:
    """Each free symbol of the graph's shapes -> a SymInt it appears in."""
    syms: dict[Any, torch.SymInt] = {}
    for node in ep.graph.nodes:
        for v in _vals(node.meta.get("val")):
            dims = list(v.shape) if isinstance(v, torch.Tensor) else [v] if isinstance(v, torch.SymInt) else []
            for d in dims:
                if isinstance(d, torch.SymInt):
                    for s in d.node.expr.free_symbols:
                        syms.setdefault(s, d)
    return syms


def _range(ep: ExportedProgram, s: Any, d: torch.SymInt) -> tuple[int, int]:
    """(lower, upper) bound of symbol ``s``: the program's range constraints, else the shape environment's."""
    r = ep.range_constraints.get(s)
    try:
        if r is None:
            r = d.node.shape_env.bound_sympy(s)
        return int(r.lower), int(r.upper)
    except (AttributeError, TypeError, ValueError, OverflowError):
        raise LoweringError(f"dynamic dim {s} has no upper bound; export with a bounded dim, e.g. "
                            "torch.export.Dim('seq', max=N)") from None


def points(ep: ExportedProgram) -> tuple[Point, Point] | None:
    """``(upper, other)``: each symbol at its upper bound, and at a second size (one below, or above when the
    lower bound leaves no room); ``None`` for a static program."""
    syms = _symbols(ep)
    if not syms:
        return None
    upper: Point = {}
    other: Point = {}
    for s in sorted(syms, key=str):
        lo, hi = _range(ep, s, syms[s])
        upper[s] = hi
        other[s] = hi - 1 if hi - 1 >= max(2, lo) else hi + 1
    return upper, other


def _size(d: Any, point: Point) -> int:
    if not isinstance(d, torch.SymInt):
        return int(d)
    return int(d.node.expr.xreplace(point))


def _concrete(val: Any, point: Point) -> Any:
    if isinstance(val, (tuple, list)):
        return type(val)(_concrete(v, point) for v in val)
    if isinstance(val, torch.SymInt):
        return _size(val, point)
    if isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in val.shape):
        return torch.empty([_size(d, point) for d in val.shape], dtype=val.dtype, device="meta")
    return val


@contextmanager
def at_point(ep: ExportedProgram, point: Point) -> Iterator[None]:
    """Within the block every node's ``meta["val"]`` has the concrete sizes of ``point``."""
    saved: dict[torch.fx.Node, Any] = {}
    try:
        for node in ep.graph.nodes:
            val = node.meta.get("val")
            new = _concrete(val, point)
            if new is not val:
                saved[node] = val
                node.meta["val"] = new
        yield
    finally:
        for node, val in saved.items():
            node.meta["val"] = val


def _where(i: int, n: XNode) -> str:
    return f"node {i} ({n.kind})"


def merge(hi: Graph, lo: Graph, data_hi: bytes, data_lo: bytes) -> Graph:
    """``hi`` (the lowering at the upper bounds) with its dynamic dims encoded; checked against ``lo``."""
    if len(hi.values) != len(lo.values) or len(hi.nodes) != len(lo.nodes) or hi.num_externs != lo.num_externs:
        raise NotEncodable(f"the lowering has {len(hi.nodes)} nodes at the upper bounds and {len(lo.nodes)} at "
                           "another size")
    if bytes(data_hi) != bytes(data_lo) or hi.constant_data != lo.constant_data:
        raise NotEncodable("a constant depends on the dynamic dims")
    dims_lo: dict[int, list[int]] = {}
    for a, b in zip(hi.values, lo.values, strict=True):
        if (a.id_out, a.datatype, a.flags, a.external_id, a.constant_buffer_idx, a.quant) != (
                b.id_out, b.datatype, b.flags, b.external_id, b.constant_buffer_idx, b.quant) \
                or len(a.dims) != len(b.dims):
            raise NotEncodable(f"value {a.id_out} differs between sizes beyond its dims")
        if a.constant_buffer_idx and a.dims != b.dims:
            raise NotEncodable(f"constant value {a.id_out} has dynamic dims")
        dims_lo[b.id_out] = list(b.dims)
    dims_hi = {v.id_out: list(v.dims) for v in hi.values}
    for i, (a, b) in enumerate(zip(hi.nodes, lo.nodes, strict=True)):
        if a.kind != b.kind or a.output_min_max != b.output_min_max or set(a.fields) != set(b.fields):
            raise NotEncodable(f"{_where(i, a)} differs between sizes")
        if a.kind == "XNNStaticReshape":
            hi.nodes[i] = _reshape(i, a, b, dims_hi, dims_lo)
        elif a.kind == "XNNStaticSlice":
            _slice(i, a, b, dims_hi, dims_lo)
        elif a.fields != b.fields:
            raise NotEncodable(f"{_where(i, a)}: parameters depend on the dynamic dims")
    return hi


def _reshape(i: int, a: XNode, b: XNode, dims_hi: dict[int, list[int]], dims_lo: dict[int, list[int]]) -> XNode:
    src, dst = a.get("input_id"), a.get("output_id")
    new_hi, new_lo = list(a.get("new_shape")), list(b.get("new_shape"))
    if len(new_hi) != len(new_lo) or any(f not in ("new_shape",) and a.fields[f] != b.fields[f] for f in a.fields):
        raise NotEncodable(f"{_where(i, a)} differs between sizes")
    dynamic = [j for j, (x, y) in enumerate(zip(new_hi, new_lo)) if x != y]
    if len(dynamic) <= 1:
        a.fields["new_shape"] = [0 if j in dynamic else d for j, d in enumerate(new_hi)]
        return a
    pairs_in = list(zip(dims_hi[src], dims_lo[src]))
    pairs_out = list(zip(dims_hi[dst], dims_lo[dst]))
    if pairs_in == pairs_out:  # an identity copy (e.g. a delegate output that is also an input)
        return XNode("XNNCopy", {"input_id": src, "output_id": dst, "flags": 0}, a.debug_handle)
    perm = _unit_perm(pairs_in, pairs_out)
    if perm is not None:  # moves only size-1 dims: the same bytes, a transpose XNNPACK sizes itself
        return XNode("XNNStaticTranspose", {"num_dims": len(perm), "perm": perm, "input_id": src, "output_id": dst,
                                            "flags": 0}, a.debug_handle)
    raise NotEncodable(f"{_where(i, a)}: reshape to {new_hi} has {len(dynamic)} dynamic dims (XNNPACK infers one)")


def _unit_perm(src: list[tuple[int, int]], dst: list[tuple[int, int]]) -> list[int] | None:
    """A permutation of ``src`` giving ``dst`` that keeps the order of the dims that are not 1, else ``None``."""
    if len(src) != len(dst):
        return None
    big = [j for j, p in enumerate(src) if p != (1, 1)]
    ones = [j for j, p in enumerate(src) if p == (1, 1)]
    perm: list[int] = []
    for p in dst:
        pool = ones if p == (1, 1) else big
        if not pool or src[pool[0]] != p:
            return None
        perm.append(pool.pop(0))
    return perm


def _slice(i: int, a: XNode, b: XNode, dims_hi: dict[int, list[int]], dims_lo: dict[int, list[int]]) -> None:
    if any(a.fields[f] != b.fields[f] for f in a.fields if f != "sizes"):
        raise NotEncodable(f"{_where(i, a)}: offsets depend on the dynamic dims")
    src = a.get("input_id")
    sizes_hi, sizes_lo = list(a.get("sizes")), list(b.get("sizes"))
    offsets = list(a.get("offsets"))
    out = []
    for j, (x, y) in enumerate(zip(sizes_hi, sizes_lo, strict=True)):
        if x == y:
            out.append(x)
        elif offsets[j] == 0 and x == dims_hi[src][j] and y == dims_lo[src][j]:
            out.append(0)  # the whole (dynamic) dim
        else:
            raise NotEncodable(f"{_where(i, a)}: slice sizes depend on the dynamic dims")
    a.fields["sizes"] = out
