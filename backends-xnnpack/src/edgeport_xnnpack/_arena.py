"""The executor's own buffers of one plan, placed in one arena by lifetime (torch-free).

Values that cross the steps of a delegate's plan (native runtimes, host steps, operators) live in buffers the
executor owns. Giving each its own memory made a split delegate touch far more memory per call than one XNNPACK
runtime does (libXNNPACK reuses its workspace between operators): MobileNetV2 with its 1x1 convolutions on host
steps writes ~70 values of up to 4.8 MB, and every output then lands on lines no longer in any cache. Here a value
lives from the step that writes it to the last step that reads it (``spans``), and values whose spans do not meet
share memory (``place``: largest first, each at the lowest offset clear of every placed value it meets), as an
ahead-of-time memory planner does. A step's inputs and outputs are all live at that step, so they never overlap.

Every buffer is 64-byte aligned, followed by ``EXTRA_BYTES`` that belong to it (libXNNPACK may read that far past
an input) and does not end within ``EXTRA_BYTES`` of a page end (such an input would be staged in a copy on every
call); the arena starts on a page boundary so that an offset decides this alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from edgeport_xnnpack._native_run import EXTRA_BYTES, _PAGE, _near_page_end

__all__ = ["arena_buffers", "place", "spans"]

_ALIGN = 64


def spans(groups_io: Sequence[tuple[Iterable[int], Iterable[int]]], values: Iterable[int],
          aliases: dict[int, int] | None = None) -> dict[int, tuple[int, int]]:
    """``value -> (first, last)`` step indices during which each of ``values`` must keep its bytes: from the first
    step that writes it (or reads it, or 0 when none does) to the last that reads it. ``groups_io``: per step, the
    values it reads and those it writes. ``aliases`` (a view -> the value it is a view of; following them from a
    view ends at one of ``values``) extends that value's span over its views'; the views get no span of their own."""
    aliases = aliases or {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    wanted = set(values) | set(aliases)
    for si, (reads, writes) in enumerate(groups_io):
        for v in (*reads, *writes):
            if v in wanted:
                first.setdefault(v, si)
                last[v] = si
    out = {v: (first.get(v, 0), last.get(v, len(groups_io))) for v in wanted}
    for view in aliases:
        root = view
        while root in aliases:
            root = aliases[root]
        a, b = out[root]
        c, d = out.pop(view)
        out[root] = (min(a, c), max(b, d))
    return out


def place(sizes: dict[int, int], lifetimes: dict[int, tuple[int, int]]) -> tuple[dict[int, int], int]:
    """``(offsets, total bytes)``: an offset for each value of ``sizes`` (bytes) such that values whose
    ``lifetimes`` meet never overlap, counting the ``EXTRA_BYTES`` after each, every offset 64-byte aligned and no
    value ending within ``EXTRA_BYTES`` of a page end (offsets from a page-aligned base)."""
    order = sorted(sizes, key=lambda v: (-sizes[v], lifetimes[v], v))
    placed: list[tuple[int, int, int, int]] = []  # (start, end incl. extra, first, last)
    offsets: dict[int, int] = {}
    total = 0
    for v in order:
        n = sizes[v]
        a, b = lifetimes[v]
        busy = sorted((s, e) for s, e, f, l_ in placed if f <= b and a <= l_)
        off = 0
        while True:
            if n and _near_page_end(off + n):
                off += _ALIGN
                continue
            clash = next(((s, e) for s, e in busy if s < off + n + EXTRA_BYTES and off < e), None)
            if clash is None:
                break
            off = -(-clash[1] // _ALIGN) * _ALIGN
        offsets[v] = off
        placed.append((off, off + n + EXTRA_BYTES, a, b))
        total = max(total, off + n + EXTRA_BYTES)
    return offsets, total


def arena_buffers(specs: dict[int, tuple[tuple[int, ...], np.dtype]],
                  lifetimes: dict[int, tuple[int, int]]) -> dict[int, np.ndarray]:
    """Uninitialized C-contiguous arrays of these ``value -> (shape, dtype)``, values whose ``lifetimes`` meet in
    disjoint memory of one allocation (see the module docstring)."""
    if not specs:
        return {}
    sizes = {v: math.prod(shape) * np.dtype(dt).itemsize for v, (shape, dt) in specs.items()}
    offsets, total = place(sizes, lifetimes)
    raw = np.empty(total + _PAGE, np.uint8)
    base = -raw.ctypes.data % _PAGE
    return {v: raw[base + offsets[v]: base + offsets[v] + sizes[v]].view(dt).reshape(tuple(shape))
            for v, (shape, dt) in specs.items()}
