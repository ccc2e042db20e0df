"""A host segment that only moves data -- reshapes, transposes, slices, copies and concatenations, the attention's
head split, the rotary halves, a reshape-only delegate -- run as one C call (``_kernels.copy_runs``) instead of one
numpy call per node.

The copies are planned once per segment by running the segment's own numpy program on index arrays (each element
of a value it reads holds its own position), so the plan is whatever numpy computes, element for element: every
written element comes from the element its index names. Runs of consecutive source elements, and equally spaced
runs of one length, become the rows of the table the kernel walks. The kernel checks the buffers on every call
and declines (``False``) when a destination shares memory with another array; the caller then runs numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from edgeport_xnnpack.schema.graph import CAT_INPUTS, XNode

try:  # optional, built with the C glue when a compiler is present
    from edgeport_xnnpack import _kernels
except ImportError:  # pragma: no cover - no compiler at install time
    _kernels = None

__all__ = ["MOVES", "CopyPlan", "plan_copies"]

# node kinds that only move data (a multiply, a product, ... computes: such a segment keeps its numpy program)
MOVES = frozenset({"XNNStaticReshape", "XNNStaticTranspose", "XNNStaticSlice", "XNNCopy", *CAT_INPUTS})
_MAX_RUNS = 1 << 14  # runs (consecutive source elements) planned at most: a large transpose stays on numpy
#                      and _kernels.transpose_scale (a table of its single elements would cost more than it saves)
_MAX_SLOTS = 64      # the kernel's limit on arrays per call
_run = getattr(_kernels, "copy_runs", None)


class CopyPlan:
    """``run(arrays)``: the segment's values in ``HostSegment.io`` order (read, then written), each C-contiguous
    float32 of its planned dims; ``False`` when the kernel declines them (nothing written: run numpy instead)."""

    def __init__(self, n_src: int, table: np.ndarray) -> None:
        self.n_src, self.table = n_src, table
        self.rows = len(table)

    def run(self, arrays: Sequence[np.ndarray]) -> bool:
        return bool(_run(arrays, self.n_src, self.table, 4))


def plan_copies(nodes: Sequence[XNode], program: Sequence[Callable[[dict[int, np.ndarray]], None]],
                reads: Sequence[int], writes: Sequence[int],
                dims: Callable[[int], tuple[int, ...]]) -> CopyPlan | None:
    """The copy plan of a segment of ``nodes`` whose ``program`` (``HostSegment.program``) reads ``reads`` and
    writes ``writes``; ``None`` when some node computes, there is no kernel, or the plan would not pay."""
    if _run is None or not writes or any(n.kind not in MOVES for n in nodes) or \
            len(reads) + len(writes) > _MAX_SLOTS:
        return None
    sizes = [math.prod(dims(v)) for v in reads]
    starts = np.cumsum([0, *sizes])
    env: dict[int, np.ndarray] = {}
    for v, start, size in zip(reads, starts, sizes, strict=False):
        env[v] = (np.arange(size, dtype=np.int64) + start).reshape(dims(v))
    for v in writes:
        env[v] = np.full(dims(v), -1, np.int64)
    outs = [env[v] for v in writes]
    try:
        for step in program:
            step(env)
    except (ValueError, TypeError):  # pragma: no cover - the float32 program ran the same steps at planning
        return None
    rows: list[tuple[int, ...]] = []
    runs = 0
    for k, out in enumerate(outs):
        idx = out.reshape(-1)
        if idx.size == 0:
            continue
        if idx.min() < 0:
            return None  # an element the program does not write (never expected): keep numpy's program
        more = _rows(idx, starts, len(reads) + k, _MAX_RUNS - runs)
        if more is None:
            return None
        runs += sum(r[4] for r in more)
        rows.extend(more)
    if not rows:
        return None
    return CopyPlan(len(reads), np.array(rows, np.int64).reshape(-1, 7))


def _rows(idx: np.ndarray, starts: np.ndarray, dst: int, budget: int) -> list[tuple[int, ...]] | None:
    """Rows (src, dst, src_off, dst_off, count, len, src_step) for destination ``dst`` whose flat elements come
    from the global source positions ``idx``; ``None`` past ``budget`` runs."""
    src = np.searchsorted(starts, idx, side="right") - 1
    off = idx - starts[src]
    brk = np.flatnonzero((np.diff(off) != 1) | (np.diff(src) != 0)) + 1
    run_at = np.concatenate(([0], brk))
    run_len = np.diff(np.concatenate((run_at, [idx.size])))
    if len(run_at) > budget:
        return None
    r_src, r_off, r_at, r_len = src[run_at].tolist(), off[run_at].tolist(), run_at.tolist(), run_len.tolist()
    rows: list[tuple[int, ...]] = []
    j, m = 0, len(r_at)
    while j < m:
        k, step = j + 1, 0
        if k < m and r_src[k] == r_src[j] and r_len[k] == r_len[j]:
            step = r_off[k] - r_off[j]
            while k + 1 < m and r_src[k + 1] == r_src[j] and r_len[k + 1] == r_len[j] and \
                    r_off[k + 1] - r_off[k] == step:
                k += 1
            k += 1
        rows.append((r_src[j], dst, r_off[j], r_at[j], k - j, r_len[j], step))
        j = k
    return rows
