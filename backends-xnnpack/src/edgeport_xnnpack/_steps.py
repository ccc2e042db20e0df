"""The planned steps of an XNNPACK delegate and the handle ``XnnpackExecutor.init`` returns (see
:mod:`edgeport_xnnpack.runtime`): a native runtime, a numpy host segment, or a channel-shuffle operator; each
runs on the value environment of one call, and those that run inside XNNPACK through the C glue expose their
binding for the direct call (:mod:`edgeport_xnnpack._direct`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeport_xnnpack import native
from edgeport_xnnpack._direct import DirectCall
from edgeport_xnnpack._host import HostSegment
from edgeport_xnnpack._replay import SegmentBinding
from edgeport_xnnpack._operator_step import OperatorStep
from edgeport_xnnpack._specialize import Specializer

__all__ = ["XnnpackHandle", "HostStep", "NativeStep", "ShuffleStep"]


@dataclass
class NativeStep:
    """A native XNNPACK runtime; ``vids`` = the blob value bound to each of its external ids, in order."""

    runtime: native.Runtime
    vids: list[int]
    label: str
    debug_handles: tuple[int, ...] = ()  # the edge nodes this step carries out (ETDump sub-events name them)
    event_id: str = ""  # one blob node: its event id in ExecuTorch's XNNPACK profile (a delegate map key)

    def run(self, env: dict[int, np.ndarray]) -> None:
        self.runtime.run_list(list(map(env.__getitem__, self.vids)))

    def glue(self) -> tuple[Any, list[int]] | None:
        return None if self.runtime.glue is None else (self.runtime.glue, self.vids)

    def close(self) -> None:
        self.runtime.close()


@dataclass
class HostStep:
    """A numpy host segment (see :class:`~edgeport_xnnpack._host.HostSegment`)."""

    segment: HostSegment
    label: str
    debug_handles: tuple[int, ...] = ()
    event_id: str = ""

    def run(self, env: dict[int, np.ndarray]) -> None:
        self.segment.run(env)

    def glue(self) -> tuple[Any, list[int]] | None:
        """The segment as a direct-call step (see ``SegmentBinding``), when it reads and writes distinct values."""
        reads, writes = self.segment.io
        vids = [*reads, *writes]
        if len(vids) < 2 or not writes or set(reads) & set(writes):
            return None
        return SegmentBinding(self.segment, vids), vids

    def close(self) -> None:
        pass


@dataclass
class ShuffleStep(OperatorStep):
    """A 2-D transpose run by XNNPACK's channel-shuffle operator (``op``: a :class:`native.ChannelShuffle`)."""


@dataclass
class XnnpackHandle:
    """What ``init`` returns."""

    inputs: list[tuple[int, tuple[int, ...]]]   # (value id, dims) in call order
    outputs: list[tuple[int, tuple[int, ...]]]
    steps: list[NativeStep | HostStep | ShuffleStep]
    buffers: dict[int, np.ndarray]             # intermediates crossing steps, and host constants
    pool: native.ThreadPool | None
    summary: dict[str, int | str] = field(default_factory=dict)
    alive: bool = True
    direct: DirectCall | None = None  # every step in XNNPACK through the C glue (see edgeport_xnnpack._direct)
    n_args: int = -1                  # delegate arguments before the outputs (-1: len(inputs))
    arg_slots: tuple[int, ...] | None = None  # the argument of each input, when some argument is not a tensor
    specializer: Specializer | None = None    # plans for other input shapes (see edgeport_xnnpack._specialize)
    tracer: Any = None  # an ETDump event tracer while the program records one (see XnnpackExecutor.set_event_tracer)

    declared: tuple[tuple[int, ...], ...] = ()  # the inputs' declared dims (set from inputs)
    out_dims: tuple[tuple[int, ...], ...] = ()  # the outputs' declared dims (set from outputs)

    def __post_init__(self) -> None:
        self.declared = tuple(dims for _, dims in self.inputs)
        self.out_dims = tuple(dims for _, dims in self.outputs)
        if self.n_args < 0:
            self.n_args = len(self.inputs)
        if self.specializer is None:
            self.specializer = Specializer([], {}, self.inputs, self.outputs, _no_build, 0)

    def reshape_only(self) -> bool:
        """The delegate only reshapes: one input, one output of as many elements, and its one step a host segment
        of reshapes from that input to that output (the runtime may then run the call as a view; see
        ``RuntimeExecutor.reshape_only``)."""
        if len(self.inputs) != 1 or len(self.outputs) != 1 or len(self.steps) != 1 or self.n_args != 1:
            return False
        (i, in_dims), (o, out_dims) = self.inputs[0], self.outputs[0]
        step = self.steps[0]
        if not isinstance(step, HostStep) or not step.segment.reshape_only:
            return False
        size = 1
        for d in in_dims:
            size *= d
        total = 1
        for d in out_dims:
            total *= d
        return size == total and step.segment.io == ([i], [o])


def _no_build(dims: dict[int, tuple[int, ...]]) -> tuple[list, dict]:
    raise AssertionError("a specializer of capacity 0 builds nothing")
