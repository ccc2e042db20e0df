"""Specializing a delegate to the input shapes of a call (this libXNNPACK cannot reshape a runtime).

A blob declares each value at its upper-bound dims. Newer XNNPACK (ExecuTorch's runtime) reshapes its runtime
to every call's input shapes; the 2022 library cannot, so the executor *specializes* instead: for input shapes
it has not seen, it infers every value's dims (:func:`~edgeport_xnnpack._infer.infer_dims`), plans and builds the
delegate's steps again with those dims (the same definer code as at ``init``: native runtimes, host steps), and
keeps the result in a small least-recently-used cache keyed by the input shapes. Float32 fully connected layers
share their packed operators with every plan of the delegate (``_fc_ops``); other native nodes with weights
(convolutions) pack their own per specialization, freed with it. Torch-free.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport_xnnpack._direct import direct_call
from edgeport_xnnpack._infer import Dims, Rule, ShapeError, infer_dims, node_rules
from edgeport_xnnpack.capabilities import BACKEND_ID
from edgeport_xnnpack.schema.graph import XNode

DEFAULT_SPECIALIZATIONS = 8
ENV = "EDGEPORT_XNNPACK_SPECIALIZATIONS"


def specializations_from_env(value: int | None = None) -> int:
    """How many specializations a handle keeps: ``value``, else ``$EDGEPORT_XNNPACK_SPECIALIZATIONS``, else 8
    (0 turns specialization off: only the declared shapes run)."""
    if value is None:
        raw = os.environ.get(ENV, "")
        try:
            value = int(raw) if raw.strip() else DEFAULT_SPECIALIZATIONS
        except ValueError:
            raise RuntimeExecutionError(f"{BACKEND_ID}: {ENV}={raw!r} is not an integer") from None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 4096:
        raise RuntimeExecutionError(f"{BACKEND_ID}: the number of specializations must be an int in 0..4096, "
                                    f"got {value!r}")
    return value


@dataclass
class Plan:
    """The steps of one specialization (the same fields the handle has for the declared shapes)."""

    inputs: list[tuple[int, Dims]]
    outputs: list[tuple[int, Dims]]
    steps: list[Any]
    buffers: dict[int, np.ndarray]
    direct: Callable[[Sequence[Any], list[Any]], None] | None = None  # see edgeport_xnnpack._direct
    out_dims: tuple[Dims, ...] = field(init=False)  # the outputs' dims, in order

    def __post_init__(self) -> None:
        self.out_dims = tuple(d for _, d in self.outputs)

    def close(self) -> None:
        self.direct = None  # its bindings belong to the steps closed here
        for step in self.steps:
            step.close()
        self.steps, self.buffers = [], {}


Build = Callable[[dict[int, Dims]], tuple[list[Any], dict[int, np.ndarray]]]


class Specializer:
    """The specializations of one handle: ``plan_for(shapes)`` returns (and caches) the plan for these input
    shapes, or raises :class:`RuntimeExecutionError` saying which input or node does not fit."""

    def __init__(self, nodes: Sequence[XNode], declared: dict[int, Dims], inputs: list[tuple[int, Dims]],
                 outputs: list[tuple[int, Dims]], build: Build, capacity: int,
                 on_close: Callable[[], None] | None = None) -> None:
        self.nodes, self.declared, self.inputs, self.outputs = list(nodes), dict(declared), inputs, outputs
        # each node's output ids, read once: the nodes no longer change once the handle is loaded
        self.node_outputs = [n.outputs() for n in self.nodes]
        self.rules: list[Rule] | None = None  # each node's shape rule (_infer.node_rules), made by the second plan
        self.build, self.capacity = build, capacity
        self.on_close = on_close  # frees what every plan shares (the handle's packed operators), after the plans
        self.cache: OrderedDict[tuple[Dims, ...], Plan] = OrderedDict()
        self.built = 0  # specializations made so far (diagnostics: a re-made evicted one counts again)
        self.last: tuple[tuple[Dims, ...], Plan] | None = None  # what known() last found: (its cache key, plan)

    def check(self, k: int, shape: Dims) -> None:
        """Input ``k`` may take ``shape``: same rank as declared, each dim from 1 to its declared size."""
        bound = self.inputs[k][1]
        if len(shape) != len(bound) or any(not 1 <= s <= b for s, b in zip(shape, bound)):
            raise RuntimeExecutionError(
                f"{BACKEND_ID}: input {k} must be float32 of shape {list(bound)}, or smaller in a dynamic dim "
                f"(each dim from 1 to its declared size, the program's upper bound), got float32 {list(shape)}")

    def plan_for(self, shapes: Sequence[Dims]) -> Plan:
        key = tuple(tuple(s) for s in shapes)
        plan = self.cache.get(key)
        if plan is not None:
            self.cache.move_to_end(key)
            return plan
        for k, shape in enumerate(key):
            self.check(k, shape)
        if self.capacity == 0:
            raise RuntimeExecutionError(f"{BACKEND_ID}: input shapes {[list(s) for s in key]} differ from the "
                                        f"declared {[list(d) for _, d in self.inputs]} and specialization is off "
                                        f"({ENV}=0)")
        where = f"input shapes {[list(s) for s in key]}"
        if self.rules is None and self.built:  # from the second specialization on (making them costs one inference)
            self.rules = node_rules(self.nodes, self.declared)
        try:
            dims = infer_dims(self.nodes, self.declared, {vid: s for (vid, _), s in zip(self.inputs, key)},
                              self.node_outputs, self.rules)
        except ShapeError as exc:
            raise RuntimeExecutionError(f"{BACKEND_ID}: cannot run {where}: {exc}") from exc
        outputs = [(vid, dims[vid]) for vid, _ in self.outputs]
        for j, ((_, got), (_, bound)) in enumerate(zip(outputs, self.outputs)):
            if len(got) != len(bound) or any(a > b for a, b in zip(got, bound)):
                raise RuntimeExecutionError(f"{BACKEND_ID}: {where} give output {j} dims {list(got)}, beyond its "
                                            f"declared {list(bound)}")
        try:
            steps, buffers = self.build(dims)
        except ProgramError as exc:
            raise RuntimeExecutionError(f"{BACKEND_ID}: cannot run {where}: {exc}") from exc
        plan = Plan([(vid, dims[vid]) for vid, _ in self.inputs], outputs, steps, buffers)
        plan.direct = direct_call(plan.inputs, outputs, steps, buffers)
        self.cache[key] = plan
        self.built += 1
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)[1].close()
        return plan

    def known(self, shapes: tuple[Dims, ...]) -> Plan | None:
        """The cached plan for exactly these input shapes (marked most recently used), or None. A decode step asks
        for the same shapes again and again: while the plan found last is still cached under its key (the cache's
        own tuple, so a plan made again for those shapes is a new entry) no lookup is needed."""
        cache, last = self.cache, self.last
        if last is not None and last[0] == shapes:
            key, plan = last
            if next(reversed(cache), None) is key:  # the most recently used already
                return plan
            if cache.get(key) is plan:
                cache.move_to_end(key)  # keep the least-recently-used order exact
                return plan
        plan = cache.get(shapes)
        if plan is not None:
            cache.move_to_end(shapes)
            self.last = (next(reversed(cache)), plan)
        return plan

    def close(self) -> None:
        self.last = None
        for plan in self.cache.values():
            plan.close()
        self.cache.clear()
        if self.on_close is not None:
            self.on_close()
            self.on_close = None
