"""A host segment that only moves data -- reshapes, transposes, slices, copies and concatenations, the attention's
head split, the rotary halves, a reshape-only delegate -- run as one C call (``_kernels.copy_runs``) instead of one
numpy call per node.

The copies are planned once per segment by running the segment's own numpy program on index arrays (each element
of a value it reads holds its own position), so the plan is whatever numpy computes, element for element: every
written element comes from the element its index names. Runs of consecutive source elements, and equally spaced
runs of one length, become the rows of the table the kernel walks. The kernel checks the buffers on every call
and declines (``False``) when a destination shares memory with another array; the caller then runs numpy.
Tables are kept by segment structure and dims (a bounded memo), so the next layer of a decoder, specialized to
the same shapes, reuses the first one's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edgeport_xnnpack._memo import BoundedMemo
from edgeport_xnnpack.schema.graph import CAT_INPUTS, INVALID_ID, XNode, id_fields

try:  # optional, built with the C glue when a compiler is present
    from edgeport_xnnpack import _kernels
except ImportError:  # pragma: no cover - no compiler at install time
    _kernels = None

__all__ = ["MOVES", "CopyPlan", "clear_memo", "plan_copies", "signature"]

# node kinds that only move data (a multiply, a product, ... computes: such a segment keeps its numpy program)
MOVES = frozenset({"XNNStaticReshape", "XNNStaticTranspose", "XNNStaticSlice", "XNNCopy", *CAT_INPUTS})
_MAX_RUNS = 1 << 14  # runs (consecutive source elements) planned at most: a large transpose stays on numpy
#                      and _kernels.transpose_scale (a table of its single elements would cost more than it saves)
_MAX_SLOTS = 64      # the kernel's limit on arrays per call
_run = getattr(_kernels, "copy_runs", None)
_bound = getattr(_kernels, "copy_runs_plan", None)
# copy plans kept by segment structure and dims (see plan_copies): at most this many, of this many table bytes
_MEMO_ENTRIES = 512
_MEMO_BYTES = 8 << 20
_MEMO = BoundedMemo(_MEMO_ENTRIES, _MEMO_BYTES, size=lambda plan: 0 if plan is None else plan.table.nbytes)
_MISS = object()


class CopyPlan:
    """``run(arrays)``: the segment's values in ``HostSegment.io`` order (read, then written), each C-contiguous
    float32 of its planned dims; ``False`` when the kernel declines them (nothing written: run numpy instead)."""

    def __init__(self, n_src: int, table: np.ndarray) -> None:
        self.n_src, self.table = n_src, table
        self.rows = len(table)

    def run(self, arrays: Sequence[np.ndarray]) -> bool:
        return bool(_run(arrays, self.n_src, self.table, 4))

    def plan(self, arrays: Sequence[np.ndarray]) -> Any:
        """``run`` on these very arrays as a bound step of a direct call's chain (``_step.h``), its checks done
        now; ``None`` when the kernel declines them."""
        return None if _bound is None else _bound(arrays, self.n_src, self.table, 4)


def plan_copies(nodes: Sequence[XNode], program: Sequence[Callable[[dict[int, np.ndarray]], None]],
                reads: Sequence[int], writes: Sequence[int],
                dims: Callable[[int], tuple[int, ...]]) -> CopyPlan | None:
    """The copy plan of a segment of ``nodes`` whose ``program`` (``HostSegment.program``) reads ``reads`` and
    writes ``writes``; ``None`` when some node computes, there is no kernel, or the plan would not pay.

    Plans are kept by the segment's structure and dims (:func:`signature`): what the segment computes follows
    from its nodes' kinds and parameters, which values it reads and writes, and their dims, so a segment of the
    same structure at the same dims (the next layer of a decoder, the same delegate loaded again) gets the same
    table without running its program."""
    if _run is None or not writes or any(n.kind not in MOVES for n in nodes) or \
            len(reads) + len(writes) > _MAX_SLOTS:
        return None
    key = (signature(nodes, reads, writes, dims), _MAX_RUNS)
    try:
        got = _MEMO.get(key, _MISS)
    except TypeError:  # a parameter that cannot be hashed (not expected): plan without the memo
        return _plan(program, reads, writes, dims)
    if got is not _MISS:
        return got
    plan = _plan(program, reads, writes, dims)
    if plan is None or plan.table.nbytes <= _MEMO_BYTES // 8:
        _MEMO.put(key, plan)
    return plan


def signature(nodes: Sequence[XNode], reads: Sequence[int], writes: Sequence[int],
              dims: Callable[[int], tuple[int, ...]]) -> tuple[Any, ...]:
    """A hashable description of a data-moving segment that does not name its values: each value id is replaced
    by its order of first appearance (reads, then writes, then the nodes' other ids), each node by its kind,
    parameters and output clamp, and every value's dims are included."""
    order: dict[int, int] = {}
    for v in (*reads, *writes):
        order.setdefault(v, len(order))
    described = []
    for n in nodes:
        ins, outs = id_fields(n.kind)
        ids = frozenset((*ins, *outs))
        fields = []
        for name, value in sorted(n.fields.items()):
            if name in ids:
                value = 0 if value is None else value  # as XNode.inputs() reads a missing id
                value = ("id", order.setdefault(value, len(order)) if value != INVALID_ID else -1)
            elif isinstance(value, list):
                value = tuple(value)
            fields.append((name, value))
        described.append((n.kind, tuple(fields), n.output_min_max))
    return (tuple(described), len(reads), len(writes), tuple(tuple(dims(v)) for v in order))


def clear_memo() -> None:
    """Forget every kept copy plan (tests; the plans in use stay valid)."""
    _MEMO.clear()


def _plan(program: Sequence[Callable[[dict[int, np.ndarray]], None]], reads: Sequence[int],
          writes: Sequence[int], dims: Callable[[int], tuple[int, ...]]) -> CopyPlan | None:
    """Run ``program`` on index arrays (each read element holds its global position; written ones start at -1)
    and turn where every written element came from into the kernel's rows."""
    r_dims, w_dims = [tuple(dims(v)) for v in reads], [tuple(dims(v)) for v in writes]
    r_sizes, w_sizes = [math.prod(d) for d in r_dims], [math.prod(d) for d in w_dims]
    starts = np.cumsum([0, *r_sizes])
    w_starts = [0, *itertools.accumulate(w_sizes)]
    sources = np.arange(int(starts[-1]), dtype=np.int64)
    idx = np.full(w_starts[-1], -1, np.int64)  # every destination, one after the other
    env: dict[int, np.ndarray] = {}
    for v, d, start, size in zip(reads, r_dims, starts.tolist()[:-1], r_sizes, strict=True):
        env[v] = sources[start:start + size].reshape(d)
    for v, d, start, size in zip(writes, w_dims, w_starts[:-1], w_sizes, strict=True):
        env[v] = idx[start:start + size].reshape(d)
    try:
        for step in program:
            step(env)
    except (ValueError, TypeError):  # pragma: no cover - the float32 program ran the same steps at planning
        return None
    if idx.size == 0:
        return None
    if idx.min() < 0:
        return None  # an element the program does not write (never expected): keep numpy's program
    src = np.searchsorted(starts, idx, side="right") - 1
    off = idx - starts[src]
    brk = (np.diff(off) != 1) | (np.diff(src) != 0)
    for b in w_starts[1:-1]:
        if 0 < b < idx.size:
            brk[b - 1] = True  # a run never crosses from one destination into the next
    run_at = np.concatenate(([0], np.flatnonzero(brk) + 1))
    if len(run_at) > _MAX_RUNS:
        return None
    run_len = np.diff(np.concatenate((run_at, [idx.size])))
    dst = np.searchsorted(np.asarray(w_starts), run_at, side="right") - 1
    r_src, r_off, r_len = src[run_at].tolist(), off[run_at].tolist(), run_len.tolist()
    r_dst, r_at = dst.tolist(), (run_at - np.asarray(w_starts)[dst]).tolist()
    n_src = len(reads)
    rows: list[tuple[int, ...]] = []
    j, m = 0, len(r_at)
    while j < m:
        s, d, ln = r_src[j], r_dst[j], r_len[j]
        k, step = j + 1, 0
        if k < m and r_src[k] == s and r_dst[k] == d and r_len[k] == ln:
            step = r_off[k] - r_off[j]
            while k + 1 < m and r_src[k + 1] == s and r_dst[k + 1] == d and r_len[k + 1] == ln and \
                    r_off[k + 1] - r_off[k] == step:
                k += 1
            k += 1
        rows.append((s, n_src + d, r_off[j], r_at[j], k - j, ln, step))
        j = k
    table = np.array(rows, np.int64).reshape(-1, 7)
    table.setflags(write=False)  # kept and shared by every segment of this structure
    return CopyPlan(n_src, table)
