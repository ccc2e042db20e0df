"""The direct call of a delegate whose every step has a binding: the C glue's (inside XNNPACK) or a host
segment's (:class:`edgeport_xnnpack._replay.SegmentBinding`).

Such a handle (a fully delegated CNN: the NCHW -> NHWC channel shuffle, then one runtime, or runtimes and host
products in turn) needs no per-step work beyond the binding's own: ``call(inputs, out)`` lays the caller's arrays
and the executor's own buffers out in one list and hands each step's binding its arrays. The bindings check what the
executor's general path checks -- every delegate input and output is bound by some step and expected as a
C-contiguous float32 array of its exact dims (outputs writable) -- and raise ``ValueError`` otherwise; the
executor then runs its general path, which converts what it can (lists, strided arrays) or raises the precise
error. ``out`` must hold exactly one numpy array per output (checked first; a ``None`` entry or another type
goes to the general path before any step runs); an input a later step refuses may leave earlier steps run
once more by the general path, which rewrites everything they wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, Protocol

import numpy as np

__all__ = ["direct_call"]

DirectCall = Callable[[Sequence[Any], list[Any]], None]


class _Step(Protocol):
    def glue(self) -> tuple[Any, list[int]] | None: ...


def direct_call(inputs: Sequence[tuple[int, tuple[int, ...]]], outputs: Sequence[tuple[int, tuple[int, ...]]],
                steps: Sequence[_Step], buffers: dict[int, np.ndarray]) -> DirectCall | None:
    """``call(inputs, out)`` for these planned steps, or ``None`` when some step has no binding (the glue is not
    built, or a host segment reads what it writes) or a delegate input / output is not bound by any step."""
    io = [vid for vid, _ in (*inputs, *outputs)]
    if len(set(io)) != len(io) or any(v in buffers for v in io):
        return None
    expected = dict((*inputs, *outputs))
    slot_of = {vid: k for k, vid in enumerate(io)}
    own = []
    for vid, a in buffers.items():
        slot_of[vid] = len(slot_of)
        own.append(a)
    plan: list[tuple[Callable[[Any], Any], Callable[[list[Any]], Any]]] = []
    bound: set[int] = set()
    expectations = []
    for step in steps:
        glue = step.glue()
        if glue is None:
            return None
        binding, vids = glue
        if len(vids) < 2 or any(v not in slot_of for v in vids):
            return None
        for k, vid in enumerate(vids):
            if vid in expected:
                expectations.append((binding, k, expected[vid]))
                bound.add(vid)
        plan.append((binding.run, itemgetter(*(slot_of[v] for v in vids))))
    if bound != set(io):
        return None
    for binding, k, dims in expectations:
        binding.expect(k, "f", dims)  # float32 of these dims (what the general path checks)
    run_steps = tuple(plan)
    own_tail = tuple(own)
    n_in, n_out = len(inputs), len(outputs)
    ndarray = np.ndarray

    def call(ins: Sequence[Any], out: list[Any]) -> None:
        if len(ins) != n_in or len(out) != n_out:
            raise ValueError(f"expected {n_in} inputs and {n_out} outputs")
        for a in out:
            if type(a) is not ndarray:  # None (a fresh array wanted) or not a plain numpy array
                raise ValueError("out entries must be numpy arrays")
        slots = [*ins, *out, *own_tail]
        for run, args_of in run_steps:
            run(args_of(slots))

    return call
