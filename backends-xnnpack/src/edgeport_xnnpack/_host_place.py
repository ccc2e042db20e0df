"""Host-side refinement of a delegate's placement (torch-free): the attention's scaled key transpose on the host.

A decode step's attention scores are ``q @ (K^T * s)`` (the decomposed SDPA scales the transposed key cache by a
one-element value, a delegate input). :func:`~edgeport_xnnpack._plan.place` puts the 2-D transpose of the key
cache on XNNPACK's channel shuffle (``S``) and the multiply in a native runtime (``N``), so every step moves the
whole cache three times (a reshape copy into the shuffle's buffer, the shuffle, the multiply) before the host
product reads it a fourth time (the medium decoder: 256 KB each, ~0.1 ms per layer). :func:`absorb_scaled_transposes`
moves such a transpose and multiply to the host instead, where the transpose (and the reshapes around it) are
numpy views and ``HostSegment`` fuses the multiply into the product (``_gemm.bmm`` with its ``scale``: the cache is
read once, in place; :func:`fused_scales` finds such multiplies in a segment). It applies only when ``_gemm.bmm``
is built, every value on the way has a single reader, and the product has one query row (a decode step; a
prefill's products are large enough that moving the transpose to the host slowed them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from edgeport_xnnpack.schema.graph import XNode

if TYPE_CHECKING:
    from edgeport_xnnpack._host import HostOp

__all__ = ["absorb_scaled_transposes", "absorbs_scaled_transposes", "fused_scales"]


def absorbs_scaled_transposes() -> bool:
    """Whether :func:`absorb_scaled_transposes` can move anything (``_gemm.bmm`` is built)."""
    from edgeport_xnnpack import _host

    return _host._bmm is not None


def absorb_scaled_transposes(nodes: list[XNode], placement: Any, dims: dict[int, tuple[int, ...]]) -> list[int]:
    """Move to the host (side ``H``) each channel-shuffle transpose whose result reaches, through views, an
    unclamped multiply by a one-element value (native) whose result reaches, through views, only the second
    operand of a host ``XNNBatchMatrixMultiply``; ``placement`` (a ``_plan.Placement``) is changed in place.
    Returns the indices of the nodes moved (empty when ``_gemm.bmm`` is not built)."""
    from edgeport_xnnpack import _host

    if _host._bmm is None:
        return []
    sides, views = placement.sides, placement.views
    if not any(n.kind == "XNNBatchMatrixMultiply" and sides[b] == "H" for b, n in enumerate(nodes)):
        return []  # no candidate product: skip building the maps below
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs()}
    readers: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        for v in set(n.inputs()):
            readers.setdefault(v, []).append(i)

    def back(v: int) -> tuple[int, list[int]]:
        """The value ``v`` is a view of (through single-reader views), and those view nodes."""
        chain = []
        while v in producer and producer[v] in views and len(readers.get(v, ())) == 1:
            chain.append(producer[v])
            v = nodes[producer[v]].inputs()[0]
        return v, chain

    moved: list[int] = []
    for b, n in enumerate(nodes):
        if n.kind != "XNNBatchMatrixMultiply" or sides[b] != "H" or len(n.inputs()) != 2:
            continue
        q_dims = dims[n.inputs()[0]]
        if len(q_dims) < 2 or q_dims[-2] != 1:
            continue  # one query row (a decode step) only: a prefill's longer product keeps the native path
        v, after = back(n.inputs()[1])
        if v not in producer or len(readers.get(v, ())) != 1:
            continue
        mi = producer[v]
        mul = nodes[mi]
        if mul.kind != "XNNMultiply" or sides[mi] != "N" or not _unclamped(mul):
            continue
        a, s = mul.inputs()[:2]
        one = [x for x in (a, s) if math.prod(dims[x]) == 1]
        if len(one) != 1:
            continue
        x = s if one[0] == a else a
        if dims[x] != dims[mul.outputs()[0]]:
            continue
        u, before = back(x)
        if u not in producer or len(readers.get(u, ())) != 1:
            continue
        t = producer[u]
        if sides[t] != "S" or nodes[t].kind != "XNNStaticTranspose":
            continue
        for i in (t, *before, mi, *after):
            sides[i] = "H"
        placement.shuffles.pop(t, None)
        moved.extend(sorted({t, *before, mi, *after}))
    return moved


def fused_scales(nodes: Sequence[XNode], ops: Sequence[HostOp], materialize: set[int],
                 readers: dict[int, list[int]], dims: Callable[[int], tuple[int, ...]],
                 io: Sequence[tuple[list[int], list[int]]] | None = None) -> tuple[dict[int, int], dict[int, int]]:
    """``({multiply: its other operand}, {product: the scale value})`` for each unclamped ``XNNMultiply`` of a
    float32 operand by a one-element value whose result, never materialized, reaches only the second operand of an
    ``XNNBatchMatrixMultiply`` through single-reader reshapes (which ``_matmul(scaled=True)``
    then runs as ``a @ (b * s)``); ``io``: each node's ``(inputs(), outputs())`` when the caller has them."""
    if io is None:
        io = [(n.inputs(), n.outputs()) for n in nodes]
    aliased: dict[int, int] = {}
    scales: dict[int, int] = {}
    for j, n in enumerate(nodes):
        if n.kind != "XNNMultiply" or not _unclamped(n):
            continue
        a, b = io[j][0][:2]
        o = io[j][1][0]
        one = [v for v in (a, b) if math.prod(dims(v)) == 1]
        if len(one) != 1 or a == b:
            continue
        x = b if one[0] == a else a
        if dims(x) != dims(o) or o in materialize:
            continue
        v, ok = o, True
        while ok:
            r = readers.get(v, [])
            if len(r) != 1 or v in materialize:
                ok = False
            elif nodes[r[0]].kind == "XNNStaticReshape" and ops[r[0]].view:
                v = io[r[0]][1][0]
            else:
                break
        if not ok:
            continue
        p = readers[v][0]
        p_in = io[p][0]
        if nodes[p].kind == "XNNBatchMatrixMultiply" and len(p_in) == 2 and p_in[1] == v and \
                p_in[0] != v and p not in scales:
            aliased[j], scales[p] = x, one[0]
    return aliased, scales


def _unclamped(n: XNode) -> bool:
    lo, hi = n.output_min_max or (-math.inf, math.inf)
    return lo == -math.inf and hi == math.inf
