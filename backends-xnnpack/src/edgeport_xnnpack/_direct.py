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

A call with the same input and output arrays as the two calls before it runs a flat list of calls of no
arguments made at the second: each native step's binding on its arrays (it still checks them), each host segment
bound to its arrays (:mod:`edgeport_xnnpack._replay`) as its checks and kernel calls. The list holds the arrays
until a call with other arrays or until the handle is destroyed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from operator import is_, itemgetter
from typing import Any, Protocol

import numpy as np

from edgeport_xnnpack._replay import IO_CHECK

try:  # optional, built with the C glue when a compiler is present
    from edgeport_xnnpack._glue import Chain as _Chain
except ImportError:  # pragma: no cover - no compiler at install time
    _Chain = None

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
    plan_bindings: list[Any] = []
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
        plan_bindings.append(binding)
    if bound != set(io):
        return None
    for binding, k, dims in expectations:
        binding.expect(k, "f", dims)  # float32 of these dims (what the general path checks)
    run_steps = tuple(plan)
    bindings = tuple(plan_bindings)
    own_tail = tuple(own)
    n_in, n_out = len(inputs), len(outputs)
    ndarray = np.ndarray
    # the same arrays as the last two calls: every step as one call of no arguments (see ``_flat``)
    state: list[Any] = [None, None, ()]  # [flat calls, the io arrays they hold, ids of the last call's io]

    def call(ins: Sequence[Any], out: list[Any]) -> None:
        if len(ins) != n_in or len(out) != n_out:
            raise ValueError(f"expected {n_in} inputs and {n_out} outputs")
        for a in out:
            if type(a) is not ndarray:  # None (a fresh array wanted) or not a plain numpy array
                raise ValueError("out entries must be numpy arrays")
        io = (*ins, *out)
        chained = state[0]
        if chained is not None:
            if all(map(is_, io, state[1])):
                chained()
                return
            state[0] = state[1] = None  # other arrays: the held ones are released
        slots = [*io, *own_tail]
        for run, args_of in run_steps:
            run(args_of(slots))
        seen = tuple(map(id, io))
        if seen == state[2]:
            state[0], state[1] = _chained(_flat(bindings, run_steps, slots), io, n_in), io
        state[2] = seen

    return call


def _flat(bindings: Sequence[Any], run_steps: Sequence[tuple[Callable[[Any], Any], Callable[[list[Any]], Any]]],
          slots: list[Any]) -> list[Callable[[], Any]]:
    """The steps on ``slots`` as calls of no arguments: a host segment bound to its arrays (``_replay``) spliced in
    as its checks and kernel calls, every other step its binding's ``run`` on its arrays (checked by it); a native
    step's call carries the binding's ``plan`` on those arrays (see ``_chained``)."""
    flat: list[Callable[[], Any]] = []
    for binding, (run, args_of) in zip(bindings, run_steps, strict=True):
        args = args_of(slots)
        bound = getattr(binding, "bound_calls", None)
        calls = bound(args) if bound is not None else None
        if calls is not None:
            flat += calls
            continue
        f = partial(run, args)
        plan = getattr(binding, "plan", None)  # the C glue's Binding
        if plan is not None:
            f.plan = partial(plan, args)  # type: ignore[attr-defined]
        flat.append(f)
    return flat


def _chained(flat: list[Callable[[], Any]], io: tuple[Any, ...], n_in: int) -> Callable[[], Any]:
    """The flat calls as one call: with the C glue a ``_glue.Chain`` of bound steps (each call's ``plan`` made on
    its arrays; a call without one, or whose kernel refuses the arrays, stays a Python call), which checks the io
    arrays' layout itself before any step -- so the host segments' own checks of them (``IO_CHECK``) are left out;
    without the glue a loop over the calls."""
    if _Chain is None:
        calls = tuple(flat)

        def loop() -> None:
            for f in calls:
                f()
        return loop
    entries: list[Any] = []
    for f in flat:
        plan = getattr(f, "plan", None)
        if plan is IO_CHECK:
            continue
        step = plan() if plan is not None else None
        entries.append(f if step is None else step)
    return _Chain(io, n_in, entries)
