"""Memory planning: give every planned tensor an offset in one arena, reusing memory of dead tensors.

The planner sees :class:`TensorLifetime` records (size in bytes, first and last instruction index that touch
the tensor) and returns one offset per record. :class:`GreedyMemoryPlanner` (the default) places tensors largest
first at the lowest offset that does not overlap any already-placed tensor whose lifetime intersects. Any
callable with the same signature can replace it (``ExecutorchBackendConfig(memory_planning_pass=...)``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class TensorLifetime:
    """One planned tensor: ``nbytes`` live from instruction ``start`` to ``end`` inclusive."""

    name: str
    nbytes: int
    start: int
    end: int


@dataclass
class MemoryPlan:
    offsets: list[int]
    arena_bytes: int
    naive_bytes: int

    @property
    def saving(self) -> float:
        """Fraction of the naive (one buffer per tensor) total that planning saved."""
        return 0.0 if self.naive_bytes == 0 else 1.0 - self.arena_bytes / self.naive_bytes


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


class GreedyMemoryPlanner:
    """Largest-first placement at the lowest free offset among lifetime-overlapping tensors."""

    def __init__(self, alignment: int = 16) -> None:
        self.alignment = alignment

    def __call__(self, tensors: Sequence[TensorLifetime]) -> list[int]:
        order = sorted(range(len(tensors)), key=lambda i: (-tensors[i].nbytes, tensors[i].start))
        placed: list[tuple[int, int, int, int]] = []  # (start, end, offset, size) sorted by start
        starts: list[int] = []
        offsets = [0] * len(tensors)
        for i in order:
            t = tensors[i]
            size = _align(max(t.nbytes, 1), self.alignment)
            # Tensors whose lifetime overlaps [t.start, t.end]; placed is sorted by start.
            hi = bisect.bisect_right(starts, t.end)
            busy = sorted((off, off + sz) for (s, e, off, sz) in placed[:hi] if e >= t.start)
            offset = 0
            for lo, up in busy:
                if offset + size <= lo:
                    break
                offset = max(offset, up)
            offsets[i] = offset
            k = bisect.bisect_right(starts, t.start)
            starts.insert(k, t.start)
            placed.insert(k, (t.start, t.end, offset, size))
        return offsets


def plan_memory(tensors: Sequence[TensorLifetime], planner=None, alignment: int = 16) -> MemoryPlan:
    """Run ``planner`` (greedy by default), check its answer, and report arena size against the naive sum."""
    planner = planner or GreedyMemoryPlanner(alignment)
    offsets = list(planner(tensors))
    if len(offsets) != len(tensors):
        raise ValueError(f"memory planner returned {len(offsets)} offsets for {len(tensors)} tensors")
    _check_plan(tensors, offsets, alignment)
    arena = max((o + _align(t.nbytes, alignment) for o, t in zip(offsets, tensors)), default=0)
    naive = sum(_align(t.nbytes, alignment) for t in tensors)
    return MemoryPlan(offsets, arena, naive)


def _check_plan(tensors: Sequence[TensorLifetime], offsets: Sequence[int], alignment: int) -> None:
    """Reject plans that overlap two live tensors or misalign one (sweep over lifetimes)."""
    events = sorted(range(len(tensors)), key=lambda i: tensors[i].start)
    active: list[int] = []
    for i in events:
        t, off = tensors[i], offsets[i]
        if off < 0 or off % alignment:
            raise ValueError(f"memory planner put {t.name!r} at offset {off}, not a multiple of {alignment}")
        active = [j for j in active if tensors[j].end >= t.start]
        for j in active:
            other, o2 = tensors[j], offsets[j]
            if off < o2 + other.nbytes and o2 < off + t.nbytes and t.nbytes and other.nbytes:
                raise ValueError(
                    f"memory planner overlapped {t.name!r} and {other.name!r}, which are live at the same time"
                )
        active.append(i)
