"""Which side runs each blob node, and in which order (torch-free).

Every node gets a side: ``N`` (inside a native XNNPACK runtime), ``H`` (a numpy host segment), ``S`` (the
library's channel-shuffle *operator*, for 2-D transposes of float32 elements, and of int8 elements that keep their
quantization when the library has the 8-bit operator) or ``F`` (a float32 fully connected node on the library's
fully connected *operator*, packed once and shared by every specialization: see ``_fc_ops``). Nodes this
libXNNPACK cannot define are ``H``; the others are ``N``, except flexible ones placed where they are cheapest:

- *views* (reshapes, copies, transposes that only move size-1 dims) go to the host, where they are free numpy
  views, unless they take a natively produced (or external) value to a native consumer;
- a multiplication by a one-element constant goes to the host when its operand comes from the host and
  nothing native reads its result (it would otherwise cut a host segment in two);
- a 2-D transpose becomes an ``S`` operator step unless it touches host values (then it is a free view), except
  the values of host matrix products (``gemm``: they read and write contiguous memory, so a view there would be
  copied by numpy's slow strided loop).

Then the nodes are list-scheduled (dependencies respected, blob order as tie-break) staying on one side as
long as a node of that side is ready, so each side's nodes cluster into few, long steps (``S`` and ``F`` nodes are one
step each).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeport_xnnpack._memo import BoundedMemo
from edgeport_xnnpack.schema.graph import FP32, QINT8, PerTensorQuant, TensorValue, XNode

_VIEW_KINDS = ("XNNStaticReshape", "XNNCopy")


def valid_perm(shape: Sequence[int], perm: Sequence[int], out: Sequence[int]) -> bool:
    """``perm`` permutes the axes of ``shape`` into ``out``."""
    return sorted(perm) == list(range(len(shape))) and tuple(shape[p] for p in perm) == tuple(out)


def squeeze_perm(shape: Sequence[int], perm: Sequence[int]) -> tuple[list[int], list[int]]:
    """``perm`` (a valid permutation) restricted to the axes of ``shape`` that are not 1: (sizes in input order,
    permutation)."""
    keep = [a for a in range(len(shape)) if shape[a] != 1]
    rank = {a: i for i, a in enumerate(keep)}
    return [shape[a] for a in keep], [rank[p] for p in perm if shape[p] != 1]


def shuffle_dims(shape: Sequence[int], perm: Sequence[int]) -> tuple[int, int, int] | None:
    """``(batch, groups, group_channels)`` if transposing ``shape`` by ``perm`` is ``batch`` independent 2-D
    transposes of ``[groups, group_channels]`` (both >= 2), else ``None``."""
    sizes, p = squeeze_perm(shape, perm)
    runs: list[list[int]] = []  # maximal runs of input axes that stay adjacent and in order
    for a in p:
        if runs and runs[-1][-1] + 1 == a:
            runs[-1].append(a)
        else:
            runs.append([a])
    merged = sorted(runs)
    size = [_prod(sizes[a] for a in r) for r in merged]
    order = [merged.index(r) for r in runs]
    if order == [1, 0]:
        return 1, size[0], size[1]
    if order == [0, 2, 1]:
        return size[0], size[1], size[2]
    return None


def _prod(xs: object) -> int:
    out = 1
    for x in xs:  # type: ignore[attr-defined]
        out *= x
    return out


def is_view(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]]) -> bool:
    """A node whose output is its input's data in the same order (a reshape)."""
    if n.kind == "XNNStaticTranspose":
        i, perm = n.get("input_id"), [int(a) for a in n.get("perm")]
        if not valid_perm(dims[i], perm, dims[n.outputs()[0]]) or squeeze_perm(dims[i], perm)[1] != sorted(squeeze_perm(dims[i], perm)[1]):
            return False
    elif n.kind not in _VIEW_KINDS:
        return False
    i, o = n.inputs()[0], n.outputs()[0]
    vi, vo = values[i], values[o]
    return vi.datatype == vo.datatype == FP32 and vi.quant is None and vo.quant is None


def shuffle_element_size(vi: TensorValue, vo: TensorValue) -> int | None:
    """The element size a channel shuffle moves from ``vi`` to ``vo``: 4 for float32, 1 for per-tensor qint8 with
    the same quantization on both sides (the bytes just move), else ``None``."""
    if vi.datatype == vo.datatype == FP32 and vi.quant is None and vo.quant is None:
        return 4
    if vi.datatype == vo.datatype == QINT8 and isinstance(vi.quant, PerTensorQuant) and vi.quant == vo.quant:
        return 1
    return None


@dataclass
class Placement:
    sides: list[str]   # per node: "N", "H", "S" or "F"
    views: set[int]    # node indices that are views
    shuffles: dict[int, tuple[int, int, int]]  # node index -> channel-shuffle dims (side "S" only)


def place(nodes: Sequence[XNode], native: Sequence[bool], values: dict[int, TensorValue],
          dims: dict[int, tuple[int, ...]], const: set[int], operators: bool,
          operators_x8: bool = False, gemm: frozenset[int] = frozenset(),
          fc: frozenset[int] = frozenset(), io: Sequence[tuple[list[int], list[int]]] | None = None) -> Placement:
    """Choose each node's side (see the module docstring). ``operators`` / ``operators_x8``: the library has the
    32-bit / 8-bit channel-shuffle operator; ``gemm``: indices of (non-native) nodes that run as host matrix
    products on contiguous memory; ``fc``: indices of (native) fully connected nodes that run on the shared
    fully connected operator; ``io``: each node's ``(inputs(), outputs())`` when the caller has them."""
    if io is None:
        io = [(n.inputs(), n.outputs()) for n in nodes]
    sizes = {4} if operators else set()
    if operators_x8:
        sizes.add(1)
    producer: dict[int, int] = {}
    consumers: dict[int, list[int]] = {}
    for i, (ins, outs) in enumerate(io):
        for o in outs:
            producer[o] = i
        for v in set(ins):
            consumers.setdefault(v, []).append(i)
    sides: list[str] = []
    views: set[int] = set()
    flex_mul: set[int] = set()
    shuffle: dict[int, tuple[int, int, int]] = {}
    for i, n in enumerate(nodes):
        nat = native[i]
        if is_view(n, values, dims):
            views.add(i)
        elif nat and n.kind == "XNNMultiply" and _scalar_operand(n, values, dims, const):
            flex_mul.add(i)
        elif n.kind == "XNNStaticTranspose" and n.get("input_id") not in const \
                and shuffle_element_size(values[n.get("input_id")], values[io[i][1][0]]) in sizes:
            shape, perm = dims[n.get("input_id")], [int(a) for a in n.get("perm")]
            sd = shuffle_dims(shape, perm) if valid_perm(shape, perm, dims[io[i][1][0]]) else None
            if sd is not None:
                shuffle[i] = sd
        sides.append("N" if nat else "G" if i in gemm else "H")  # "G": host, but not a view-friendly one
    for i in views | flex_mul:
        sides[i] = "H"
    for i in shuffle:
        sides[i] = "S"
    for i in fc:
        sides[i] = "F"

    def src(v: int) -> str:  # side that produces v's data, through views ("X": input or constant)
        while v in producer and producer[v] in views:
            v = io[producer[v]][0][0]
        return sides[producer[v]] if v in producer else "X"

    def users(v: int) -> set[str]:  # sides of the non-view nodes that read v, through views
        out: set[str] = set()
        for c in consumers.get(v, ()):
            out |= users(io[c][1][0]) if c in views else {sides[c]}
        return out

    for _ in range(8):
        changed = False
        for i in sorted(views | flex_mul | set(shuffle)):
            data_in = [v for v in io[i][0] if v not in const]
            s_in = src(data_in[0]) if data_in else "X"
            s_out = users(io[i][1][0])
            if i in views:
                new = "N" if s_in in ("N", "X") and "N" in s_out else "H"
            elif i in flex_mul:
                new = "H" if s_in == "H" and "N" not in s_out else "N"
            else:
                new = "H" if s_in == "H" or "H" in s_out else "S"
            if new != sides[i]:
                sides[i], changed = new, True
        if not changed:
            break
    sides = ["H" if s == "G" else s for s in sides]
    return Placement(sides, views, {i: sd for i, sd in shuffle.items() if sides[i] == "S"})


def _scalar_operand(n: XNode, values: dict[int, TensorValue], dims: dict[int, tuple[int, ...]],
                    const: set[int]) -> bool:
    a, b = n.get("input1_id"), n.get("input2_id")
    scalar = [v for v in (a, b) if v in const and _prod(dims[v]) == 1]
    return len(scalar) == 1 and all(values[v].datatype == FP32 and values[v].quant is None
                                    for v in (a, b, n.get("output_id")))


def schedule(nodes: Sequence[XNode], sides: Sequence[str],
             io: Sequence[tuple[list[int], list[int]]] | None = None) -> list[tuple[str, list[int]]]:
    """Group node indices into steps ``(side, [node indices])`` in a dependency-respecting order that stays on
    one side while it can (``S`` and ``F`` nodes are one step each); ``io``: each node's ``(inputs(), outputs())``
    when the caller has them."""
    if io is None:
        io = [(n.inputs(), n.outputs()) for n in nodes]
    producer = {o: i for i, (_, outs) in enumerate(io) for o in outs}
    deps = [{producer[v] for v in ins if v in producer} for ins, _ in io]
    users: list[list[int]] = [[] for _ in nodes]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    waiting = [len(d) for d in deps]
    ready: dict[str, list[int]] = {"N": [], "H": [], "S": [], "F": []}
    for i, w in enumerate(waiting):
        if w == 0:
            heapq.heappush(ready[sides[i]], i)
    groups: list[tuple[str, list[int]]] = []
    side = ""
    while any(ready.values()):
        if side in ("N", "H") and ready[side]:
            pick = heapq.heappop(ready[side])
        else:
            side = min((h[0], s) for s, h in ready.items() if h)[1]
            pick = heapq.heappop(ready[side])
            groups.append((side, []))
        groups[-1][1].append(pick)
        for u in users[pick]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready[sides[u]], u)
    return groups


# -- layouts shared by delegates of one structure -----------------------------------------------------------------
# A decoder's layers lower to delegates that differ only in their constants' bytes: same nodes, same values, same
# dims. What planning decides from those alone -- each node's side, the schedule, which values cross steps -- is
# then the same, so a specialization of the second layer takes the first one's decisions (a bounded memo). The
# key is a *structure token* (equal for equal structures, see structure_token) with every value's dims.

_LAYOUT_ENTRIES = 64  # layouts kept (least recently used dropped)
_STRUCTURE_ENTRIES = 1024  # distinct structures remembered (least recently used forgotten; tokens never reused)
_LAYOUTS = BoundedMemo(_LAYOUT_ENTRIES)
_STRUCTURES = BoundedMemo(_STRUCTURE_ENTRIES)
_TOKENS = itertools.count(1)


def structure_token(nodes: Sequence[XNode], values: dict[int, TensorValue], const: dict[int, Any],
                    extra: tuple[Any, ...]) -> int:
    """A number that two delegates share exactly when their nodes (kinds, parameters, output clamps; not debug
    handles), values (ids, datatypes, dims, flags, external ids, quantization) and constants' shapes and dtypes
    (not their bytes), and ``extra`` (the planning options) are equal."""
    key = (tuple(_node_key(n) for n in nodes),
           tuple(_value_key(values[vid], const.get(vid)) for vid in sorted(values)), _frozen(extra))
    token = _STRUCTURES.get(key)
    return token if token is not None else _STRUCTURES.put(key, next(_TOKENS))


def known_layout(key: tuple[Any, ...]) -> Any | None:
    """The layout kept under ``key`` (marked most recently used), or None."""
    return _LAYOUTS.get(key)


def keep_layout(key: tuple[Any, ...], layout: Any) -> None:
    _LAYOUTS.put(key, layout)


def clear_layouts() -> None:
    """Forget every kept layout (tests; plans made from them are unaffected)."""
    _LAYOUTS.clear()


def _node_key(n: XNode) -> tuple[Any, ...]:
    return (n.kind, tuple((name, _frozen(v)) for name, v in sorted(n.fields.items())), _frozen(n.output_min_max))


def _value_key(v: TensorValue, data: Any) -> tuple[Any, ...]:
    c = None if data is None else ("const", tuple(getattr(data, "shape", ())), str(getattr(data, "dtype", "")))
    return (v.id_out, v.datatype, tuple(v.dims), bool(v.constant_buffer_idx), v.external_id, v.flags,
            v.dq_datatype, _frozen(v.quant), v.quant_kind, c)


def _frozen(value: Any) -> Any:
    """``value`` as a hashable description: arrays by shape and dtype (planning decisions never read their
    elements: the kernels built from them are made per delegate), any other object as never equal."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, np.ndarray):
        return ("ndarray", value.shape, value.dtype.str)
    if isinstance(value, dict):
        return ("dict", tuple((k, _frozen(v)) for k, v in sorted(value.items())))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,
                tuple((f.name, _frozen(getattr(value, f.name))) for f in dataclasses.fields(value)))
    return ("object", type(value).__name__, object())  # equal to nothing else
