"""Persistent expands of KV caches, decided at load: the ``expand_copy`` of grouped-query attention (``repeat_kv``)
copies a whole cache (``[b, kv_heads, 1, ctx, d]`` to ``[b, kv_heads, groups, ctx, d]``) in every layer of every
decode step, although a step changes one row of it. Where the program proves that the copy may be kept, its out
tensor gets memory of its own (outside the arenas, so nothing else overwrites it) that persists from run to run,
and the runtime keeps it equal to what the copy would write: the cache writes (``index_put_``) record the rows
they write, and the ``expand_copy`` copies only those rows (everything, the first time and after any write it
cannot describe). Results are bit-identical to the full copy.

Applied to an ``expand_copy.out`` call (the portable kernel) whose input is a cache ``S`` or a reshaped view of it
(:mod:`._views`) that only inserts size-1 dims, when: the method has no jumps; ``S`` is a statically planned,
C-ordered tensor (no method input or output, no list item, its slot never rebound, no constant); every write
to ``S``, to its view, to any planned tensor overlapping its memory, or to any tensor outside planned memory (a
view of anything) is a portable ``index_put_`` on ``S`` itself, and no delegate call takes any of them (a
delegate may update state in place); the out tensor ``E`` is statically planned and C-ordered, written by this
call alone, no method input or output, list item, state, reshape view's input or output, and no elided view (a
planned tensor nothing writes) overlaps its memory; ``size`` and ``implicit`` are constants. Delegates write only
the outputs their executors declare (``num_outputs``; else every argument counts as written).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeport.program import schema as S
from edgeport.runtime._cse import run_accesses
from edgeport.runtime._instructions import InstructionAnalysis
from edgeport.runtime._values import MethodValues
from edgeport.runtime._views import overlaps, writers_with_views
from edgeport.runtime.portable import LIBRARY
from edgeport.runtime.portable import shape as _shape

__all__ = ["ExpandTracker", "PersistentExpand", "expand_op", "persistent_expands", "tracked_index_put"]

_INDEX_PUT = ("aten::index_put_", "aten::index_put_.default")
#: recorded row ranges beyond which a refresh copies everything
_MAX_DIRTY = 16


class ExpandTracker:
    """Per execution context and persistent expand: whether its out tensor holds the expand of the cache as of
    the last refresh, and the ``(cache dim, slice of it)`` rows written since."""

    __slots__ = ("dirty", "valid")

    def __init__(self) -> None:
        self.valid = False
        self.dirty: list[tuple[int, slice]] = []


@dataclass(frozen=True)
class PersistentExpand:
    """One persistent expand: the cache ``source``, the expand's input ``view`` (``source`` or a view of it), its
    out tensor ``out``; ``dims`` maps each cache dim of size > 1 to its dim in ``view``; ``writers`` are the
    ``index_put_`` calls on the cache."""

    source: int
    view: int
    out: int
    dims: dict[int, int]
    writers: tuple[tuple[int, int], ...]


def persistent_expands(mv: MethodValues, plan: S.ExecutionPlan, analysis: InstructionAnalysis,
                       delegates: Sequence[Any] = ()) -> dict[tuple[int, int], PersistentExpand]:
    """``(chain, instruction) -> PersistentExpand`` of the ``expand_copy`` calls whose result persists."""
    access = run_accesses(mv, plan, analysis, delegates)
    if access is None:
        return {}
    kinds, specs = mv.kinds, mv.specs
    reads = access[0]
    viewed = analysis.viewed_delegates
    view_src = {o: i for i, o in viewed.values()}
    in_views = {i for i, _ in viewed.values()} | set(view_src)
    writes, writers, listed, never_written = writers_with_views(access, mv, plan, analysis)
    inputs, outputs = set(plan.inputs), set(plan.outputs)

    def static(i: int) -> bool:
        sp = specs.get(i) if kinds[i] is S.Tensor else None
        return (sp is not None and sp.mem_id != 0 and not sp.dynamic and sp.constant is None and sp.contiguous_order
                and sp.nbytes > 0 and i not in analysis.rw and i not in inputs and i not in outputs
                and i not in listed)

    def skipped(at: tuple[int, int]) -> bool:
        return at in analysis.fused or at in analysis.fused_away or at in analysis.reused

    def cache_writers(src: int, view: int) -> tuple[tuple[int, int], ...] | None:
        """The ``index_put_`` calls on ``src`` when they are all that writes its memory, else ``None``; also
        ``None`` when a delegate call takes the cache (a delegate may update state in place)."""
        s_src = specs[src]

        def touches(ts: set[int]) -> bool:
            for t in ts:
                st = specs.get(t) if kinds[t] is S.Tensor else None
                if t in (src, view) or (st is not None and st.constant is None
                                        and (not st.mem_id or (t not in view_src and overlaps(st, s_src)))):
                    return True
            return False

        found = []
        for at, r in reads.items():
            if at not in viewed and type(plan.chains[at[0]].instructions[at[1]].instr_args) is S.DelegateCall \
                    and touches(r):
                return None
        for at, w in writes.items():
            if not touches(w):
                continue
            call = analysis.chains[at[0]][at[1]]
            if call is None or call.folded or skipped(at) or call.name not in _INDEX_PUT \
                    or call.entry.library != LIBRARY or call.params[0] != src or call.mut or w != {src}:
                return None
            found.append(at)
        return tuple(found)

    result: dict[tuple[int, int], PersistentExpand] = {}
    for ci, infos in enumerate(analysis.chains):
        for ii, call in enumerate(infos):
            at = (ci, ii)
            if call is None or call.folded or skipped(at) or call.name != "aten::expand_copy.out" \
                    or call.entry.library != LIBRARY or len(call.params) != 4 or call.outs != [3] or call.mut:
                continue
            view, size, implicit, out = call.params
            src = view_src.get(view, view)
            if any(i in analysis.rw or kinds[i] is S.Tensor for i in (size, implicit)) \
                    or kinds[size] is not S.IntList or any(j in analysis.rw for j in mv.items(size)):
                continue
            if not (static(src) and static(out)) or out in in_views or out in analysis.state_tensors \
                    or call.rets not in ([], [out]) or writers.get(out) != {at}:
                continue
            s_out, s_src = specs[out], specs[src]
            if view != src and (view in analysis.rw or kinds[view] is not S.Tensor):
                continue
            if any(overlaps(s_out, o) for o in never_written) or s_out.dtype != s_src.dtype:
                continue
            dims = _dim_map(tuple(s_src.sizes), tuple(specs[view].sizes), tuple(s_out.sizes))
            cw = cache_writers(src, view)
            if dims is None or cw is None:
                continue
            result[at] = PersistentExpand(src, view, out, dims, cw)
    return result


def _dim_map(src: tuple[int, ...], view: tuple[int, ...], out: tuple[int, ...]) -> dict[int, int] | None:
    """Cache dim -> view dim for the dims of size > 1, when the view only inserts size-1 dims and the expand keeps
    every such dim (its size in ``out`` is the same); else ``None``."""
    a = [d for d, n in enumerate(src) if n != 1]
    b = [d for d, n in enumerate(view) if n != 1]
    lead = len(out) - len(view)
    if [src[d] for d in a] != [view[d] for d in b] or lead < 0 or any(out[lead + d] != view[d] for d in b):
        return None
    return dict(zip(a, b))


def tracked_index_put(self: np.ndarray, indices: Any, values: Any, accumulate: bool,
                      *trackers: ExpandTracker) -> np.ndarray:
    """``aten::index_put_`` on a cache whose persistent expands follow it: records the rows it writes."""
    at = None if accumulate else _shape._one_position(self, indices)
    if at is None:
        for t in trackers:
            t.valid = False
        return _shape.index_put_inplace(self, indices, values, accumulate)
    d = 0
    for k, ix in enumerate(indices):  # _one_position's key: one index tensor, the other dims whole
        if ix is not None:
            d = k
    for t in trackers:
        if t.valid:
            if len(t.dirty) < _MAX_DIRTY:
                t.dirty.append((d, at[d]))
            else:
                t.valid = False
    self[at] = values
    return self


def expand_op(pe: PersistentExpand, full: Callable[..., Any]) -> Callable[..., Any]:
    """The operation of a persistent expand: ``op(view, size, implicit, out, tracker)``; ``full`` is the
    ``expand_copy`` kernel (the first run, and after writes the tracker could not describe)."""
    vdims = pe.dims
    #: cache dim -> (the view's and the out tensor's whole dims before it), made on first use
    prefixes: dict[int, tuple[tuple[slice, ...], tuple[slice, ...]]] = {}

    def expand_persistent(view, size, implicit, out, tracker):
        if tracker.valid:
            tracker.valid = False  # until the rows are in (an error leaves the next run a full copy)
            for d, rows in tracker.dirty:
                pre = prefixes.get(d)
                if pre is None:
                    vd = vdims.get(d)
                    if vd is None:  # a size-1 cache dim: everything
                        return _full(view, size, implicit, out, tracker)
                    pre = prefixes[d] = ((slice(None),) * vd, (slice(None),) * (out.ndim - view.ndim + vd))
                np.copyto(out[pre[1] + (rows,)], view[pre[0] + (rows,)])
            tracker.dirty.clear()
            tracker.valid = True
            return out
        return _full(view, size, implicit, out, tracker)

    def _full(view, size, implicit, out, tracker):
        tracker.valid = False
        tracker.dirty.clear()
        res = full(view, size, implicit, out)
        tracker.valid = res is out
        return res

    return expand_persistent
