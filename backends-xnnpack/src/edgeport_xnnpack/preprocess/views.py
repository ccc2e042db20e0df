"""View folding, a graph-level rewrite of preprocess: chains of view ops become at most one reshape, slice,
transpose and reshape.

``permute_copy``, ``view_copy`` / ``_unsafe_view`` / ``squeeze`` / ``unsqueeze``, ``clone``, the no-op
``expand_copy``, ``select_copy`` and ``slice_copy`` emit nothing when lowered: the node becomes a *pending view*,
an index array (its logical shape, each entry the flat position in the memory of an already lowered source
value). A chain of view ops composes into one such array. When a non-view lowering (or the delegate's output)
reads the node, :meth:`Views.materialize` factors the array into ``(stride, length)`` runs and emits the fewest
nodes that produce it::

    XNNStaticReshape (source -> factored shape) -> XNNStaticSlice -> XNNStaticTranspose -> XNNStaticReshape

each step only when it changes something (a permutation that moves only size-1 dims is a reshape; a
composition that is the identity emits nothing; a clone or no-op expand aliases its input). Arrays no single
slice + transpose can produce are lowered op by op, as before.

Two rewrites ride on the index arrays, for constant-weight ``XNNFullyConnected`` sources (linear / addmm):

* a view that reads a contiguous range of the output features gets its own fully connected node over those
  rows of the weight (so the q / k / v split of an attention in-projection needs no slice);
* ``mul`` / ``div`` by a Python scalar of such a view scales the weight and bias instead (the attention's q and
  k scalings; the error is that of rounding the scaled weights, ~1e-7 relative).

Nodes left without readers by these rewrites are removed by :func:`~edgeport_xnnpack.preprocess.passes.prune`.
Not used in quantized partitions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from edgeport_xnnpack.preprocess.builder import NCHW, NHWC, TO_NCHW, Val, logical_shape
from edgeport_xnnpack.schema.graph import INVALID_ID

if TYPE_CHECKING:
    from edgeport_xnnpack.preprocess.builder import GraphBuilder

MAX_ELEMENTS = 1 << 22  # larger tensors are lowered op by op (index arrays would cost too much memory)
MAX_RANK = 6


@dataclass
class FcInfo:
    """A constant-weight fully connected node: its input, filter [out, in], bias [out] or None, flags, range."""

    input_id: int
    weight: np.ndarray
    bias: np.ndarray | None
    flags: int
    minmax: tuple[float, float] | None


@dataclass
class View:
    src: Val
    idx: np.ndarray
    eager: Callable[[], None]  # lowers the node op by op (its input materialized)


def _factor(f: np.ndarray, shape: tuple[int, ...]) -> list[tuple[int, int]] | None:
    """``(length, stride)`` runs of the flat index sequence ``f`` of an array of ``shape``, innermost first, or
    ``None``. A run never spans two dims of ``shape``, so a transpose of the runs yields ``shape`` itself."""
    m = f.size
    bounds = sorted({math.prod(shape[i:]) for i in range(len(shape))} | {m})
    runs: list[tuple[int, int]] = []
    block = 1
    while block < m:
        g = f[::block]
        s = int(g[1] - g[0])
        bad = np.flatnonzero(np.diff(g) != s)
        run = int(bad[0]) + 1 if bad.size else g.size
        span = min(b for b in bounds if b > block) // block
        length = max(d for d in range(1, min(run, span) + 1) if span % d == 0)
        if length == 1 or s <= 0:
            return None
        runs.append((length, s))
        block *= length
    return runs


@dataclass
class Plan:
    shape: tuple[int, ...]          # the source reshaped (outermost first)
    offsets: list[int]
    sizes: list[int]
    perm: list[int]                 # of the sliced tensor's axes


def plan(idx: np.ndarray, n_src: int) -> Plan | None:
    """Reshape + slice + transpose producing ``idx`` (then a reshape to ``idx.shape``), or ``None``."""
    f = idx.ravel()
    if f.size == 0:
        return None
    runs = _factor(f, tuple(idx.shape)) if f.size > 1 else []
    if runs is None or len({s for _, s in runs}) != len(runs):
        return None
    order = sorted(range(len(runs)), key=lambda i: runs[i][1])  # by stride, innermost first
    shape: list[int] = []   # innermost first
    role: list[int | None] = []
    cur = 1
    for j, i in enumerate(order):
        length, s = runs[i]
        if s % cur:
            return None
        if s > cur:
            shape.append(s // cur)
            role.append(None)
        nxt = runs[order[j + 1]][1] if j + 1 < len(order) else None
        size = length if nxt is None or nxt % (s * length) or nxt == s * length else nxt // s
        shape.append(size)
        role.append(i)
        cur = s * size
    if n_src % cur:
        return None
    if n_src > cur:
        shape.append(n_src // cur)
        role.append(None)
    shape, role = shape[::-1], role[::-1]  # outermost first
    off = int(f[0])
    offsets, sizes = [], []
    for j in range(len(shape)):
        inner = math.prod(shape[j + 1:])
        offsets.append(off // inner % shape[j])
        sizes.append(1 if role[j] is None else runs[role[j]][0])
    if any(o + s > d for o, s, d in zip(offsets, sizes, shape, strict=True)) or len(shape) > MAX_RANK:
        return None
    # out order, outermost first: runs reversed; size-1 (pad) axes go first
    pads = [j for j in range(len(shape)) if role[j] is None]
    by_run = {role[j]: j for j in range(len(shape)) if role[j] is not None}
    perm = pads + [by_run[i] for i in reversed(range(len(runs)))]
    p = Plan(tuple(shape), offsets, sizes, perm)
    check = np.arange(n_src).reshape(p.shape)[tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))]
    if not np.array_equal(check.transpose(perm).ravel(), f):
        return None
    return p


class Views:
    """The pending views of one partition (see the module docstring)."""

    def __init__(self, b: GraphBuilder, enabled: bool = True) -> None:
        self.b = b
        self.enabled = enabled
        self.pending: dict[torch.fx.Node, View] = {}
        self.fc: dict[int, FcInfo] = {}  # value id -> the constant-weight FC producing it
        self._derived: dict[tuple[Any, ...], Val] = {}
        self._steps: dict[tuple[Any, ...], Val] = {}

    # -- sources ------------------------------------------------------------------------------------------------
    def base(self, arg: Any) -> tuple[Val, np.ndarray] | None:
        if arg in self.pending:
            v = self.pending[arg]
            return v.src, v.idx
        if isinstance(arg, torch.fx.Node) and arg in self.b.env:
            v = self.b.env[arg]
            n = math.prod(v.dims)
            if n > MAX_ELEMENTS:
                return None
            idx = np.arange(n, dtype=np.int64).reshape(v.dims)
            return v, (idx.transpose(TO_NCHW) if v.layout == NHWC else idx)
        return None

    def defer(self, node: torch.fx.Node, fn: Callable[[np.ndarray], np.ndarray], eager: Callable[[], None]) -> bool:
        """Make ``node`` (a view op of ``node.args[0]``) pending; ``False`` if it must be lowered now."""
        if not self.enabled:
            return False
        got = self.base(node.args[0])
        shape = logical_shape(node)
        if got is None or shape is None:
            return False
        src, idx = got
        idx = fn(idx)
        if tuple(idx.shape) != tuple(shape):
            return False
        parent = node.args[0]
        if parent in self.b.env and np.array_equal(idx, got[1]) and idx.shape == got[1].shape:
            self.b.set(node, self.b.env[parent])  # clone / no-op expand: an alias
            return True
        src, idx = self._narrow(src, idx)
        self.pending[node] = View(src, idx, eager)
        return True

    def scale(self, node: torch.fx.Node, x: Any, factor: float, eager: Callable[[], None]) -> bool:
        """``node = x * factor`` folded into the weights of the constant FC that pending view ``x`` reads
        (``eager`` lowers ``node`` as a plain multiply, should the view not factor)."""
        if not self.enabled or x not in self.pending or not math.isfinite(factor):
            return False
        v = self.pending[x]
        info = self.fc.get(v.src.id)
        if info is None or info.minmax is not None:
            return False
        key = ("scale", v.src.id, float(factor))
        if key not in self._derived:
            bias = None if info.bias is None else info.bias * np.float32(factor)
            self._derived[key] = self._emit_fc(info, info.weight * np.float32(factor), bias)
        self.pending[node] = View(self._derived[key], v.idx, eager)
        return True

    # -- fully connected helpers --------------------------------------------------------------------------------
    def _emit_fc(self, info: FcInfo, weight: np.ndarray, bias: np.ndarray | None) -> Val:
        b = self.b
        in_dims = b.graph.values[info.input_id].dims
        out = b.new_val(tuple(in_dims[:-1]) + (weight.shape[0],))
        bias_id = INVALID_ID if bias is None else b.constant_array(bias)
        b.add("XNNFullyConnected", minmax=info.minmax, input1_id=info.input_id, filter_id=b.constant_array(weight),
              bias_id=bias_id, output_id=out.id, flags=info.flags)
        self.fc[out.id] = FcInfo(info.input_id, weight, bias, info.flags, info.minmax)
        return out

    def _narrow(self, src: Val, idx: np.ndarray) -> tuple[Val, np.ndarray]:
        """A view reading a contiguous range of a constant FC's output features reads its own, narrower FC."""
        info = self.fc.get(src.id)
        if info is None or src.layout != NCHW:
            return src, idx
        c = src.shape[-1]
        cols = idx % c
        lo, hi = int(cols.min()), int(cols.max()) + 1
        if hi - lo == c or np.unique(cols).size != hi - lo:
            return src, idx
        key = ("narrow", src.id, lo, hi)
        if key not in self._derived:
            bias = None if info.bias is None else info.bias[lo:hi]
            self._derived[key] = self._emit_fc(info, np.ascontiguousarray(info.weight[lo:hi]), bias)
        return self._derived[key], (idx // c) * (hi - lo) + (cols - lo)

    # -- materialization ----------------------------------------------------------------------------------------
    def materialize(self, node: torch.fx.Node) -> Val:
        v = self.pending.pop(node)
        shape = tuple(v.idx.shape)
        p = plan(v.idx, math.prod(v.src.dims))
        if p is None:
            v.eager()
            return self.b.env[node]
        val = self._emit(v.src, p, shape)
        self.b.set(node, val)
        return val

    def _step(self, key: tuple[Any, ...], kind: str, src: Val, shape: tuple[int, ...], **fields: Any) -> Val:
        full = (kind, src.id, *key)
        if full not in self._steps:
            out = self.b.new_val(shape)
            self.b.add(kind, input_id=src.id, output_id=out.id, flags=0, **fields)
            self._steps[full] = out
        return self._steps[full]

    def _emit(self, src: Val, p: Plan, shape: tuple[int, ...]) -> Val:
        moved = [a for a in p.perm if p.sizes[a] != 1]
        if list(p.sizes) == list(p.shape) and moved == sorted(moved):  # the same bytes: at most a reshape
            if tuple(src.dims) == shape:
                return Val(src.id, NCHW, shape)
            return self._step((shape,), "XNNStaticReshape", src, shape, num_dims=len(shape), new_shape=list(shape))
        cur = src
        if tuple(cur.dims) != p.shape:
            cur = self._step((p.shape,), "XNNStaticReshape", cur, p.shape, num_dims=len(p.shape),
                             new_shape=list(p.shape))
        if list(p.sizes) != list(p.shape):
            sizes = tuple(p.sizes)
            cur = self._step((tuple(p.offsets), sizes), "XNNStaticSlice", cur, sizes, num_dims=len(sizes),
                             offsets=list(p.offsets), sizes=list(sizes))
        if moved != sorted(moved):
            tshape = tuple(cur.shape[a] for a in p.perm)
            cur = self._step((tuple(p.perm),), "XNNStaticTranspose", cur, tshape, num_dims=len(p.perm),
                             perm=list(p.perm))
        if tuple(cur.dims) != shape:
            cur = self._step((shape,), "XNNStaticReshape", cur, shape, num_dims=len(shape), new_shape=list(shape))
        return cur
