"""A host segment's program bound to the arrays of a direct call, replayed while the call passes the same arrays.

The core runtime hands a delegate the same planned arrays on every call, so everything a host segment derives
from them but their contents -- the reshapes, transposes and slices it reads through, the buffers it computes
into, each operator's operands -- is the same on every call too. :class:`SegmentBinding` (a host segment as a step
of :mod:`edgeport_xnnpack._direct`) binds the segment's program to the arrays once they came twice in a row:
views made once, each computing step a call of no arguments (``HostOp.bind``: a small matrix product is one
``_gemm.bmm`` call on views made at bind time, a view copied out one ``dst[...] = view``); then, while the very same
array objects come again, it runs those calls only. The same kernels run on the same memory in the same order,
so the results are the program's bit for bit. The binding keeps references to the arrays it bound (the
program's planned buffers) until a call with other arrays (which runs the program and releases them) or until
the handle is destroyed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from operator import is_
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from edgeport_xnnpack._host import HostSegment

__all__ = ["IO_CHECK", "TRANSPOSE_KERNEL_MIN", "SegmentBinding", "bind_program", "bind_reshape_copy", "bind_view_copy",
           "is_view_of"]

try:  # optional, built with the C glue when a compiler is present
    from edgeport_xnnpack._kernels import copy_plan as _copy_plan
except ImportError:  # pragma: no cover - no compiler at install time
    _copy_plan = None

_F32 = np.dtype(np.float32)
#: from this many elements a transposed copy runs on the transpose kernel (``_host._transposed_into``); below
#: it, numpy's copy (what a bound view copy runs)
TRANSPOSE_KERNEL_MIN = 4096

Thunk = Callable[[], Any]

#: the ``plan`` of a thunk that only checks the delegate's own inputs and outputs: a direct call's chain leaves it
#: out, since the chain checks those very arrays itself before any step (``_direct``). Any other thunk may carry a
#: ``plan`` attribute too: a callable making the same call as a bound step of the chain (``_step.h``; ``None`` when
#: the C kernel refuses the arrays, and the thunk stays a Python call).
IO_CHECK = "io-check"


def is_view_of(v: np.ndarray, a: np.ndarray) -> bool:
    """``v`` reads ``a``'s memory (a view, not a copy numpy made because the layout asked for one)."""
    return v.size > 0 and bool(np.may_share_memory(v, a))


def bind_view_copy(compute: Callable[[Sequence[np.ndarray]], np.ndarray],
                   into: Callable[[Sequence[np.ndarray], np.ndarray], None]) -> Callable[..., Thunk]:
    """``HostOp.bind`` of a view op whose result is copied out: below the transpose kernel's size one copy of the
    view into ``out`` seen in the view's shape (the same elements in the same C order as ``into`` copies them):
    ``dst[...] = view`` when the dtypes are equal (~0.5 us a call against ~1.2 us for ``np.copyto`` with its
    keyword), else ``np.copyto`` with ``same_kind`` casting."""
    def bind(xs: Sequence[np.ndarray], out: np.ndarray) -> Thunk:
        r = compute(xs)
        if r.size >= TRANSPOSE_KERNEL_MIN or r.size != out.size:
            return partial(into, xs, out)
        dst = out.reshape(r.shape)
        if not (is_view_of(r, xs[0]) and is_view_of(dst, out)):
            return partial(into, xs, out)
        if dst.dtype == r.dtype:
            thunk = partial(dst.__setitem__, Ellipsis, r)
            if _copy_plan is not None:
                thunk.plan = partial(_copy_plan, r, dst)  # type: ignore[attr-defined]
            return thunk
        return partial(np.copyto, dst, r, casting="same_kind")
    return bind


def bind_reshape_copy(xs: Sequence[np.ndarray], out: np.ndarray) -> Thunk:
    """``HostOp.bind`` of a reshape (or copy) node computed into ``out``: one ``np.copyto`` into ``out`` seen in
    the input's shape (``out`` is C-contiguous: a view), with the strided copy's ``plan``."""
    src = xs[0]
    dst = out.reshape(src.shape)
    thunk = partial(np.copyto, dst, src)
    if _copy_plan is not None and is_view_of(dst, out) and dst.dtype == src.dtype:
        thunk.plan = partial(_copy_plan, src, dst)  # type: ignore[attr-defined]
    return thunk


def bind_program(segment: HostSegment, env: dict[int, np.ndarray]) -> list[Thunk] | None:
    """The calls that do what ``segment.program`` does on ``env`` (updated with the views and buffers it makes),
    or ``None`` when the program computes a value that is not a view (a fresh array on every call) or numpy
    would copy where the program takes a view."""
    thunks: list[Thunk] = []
    for kind, op, ins, o, extra in segment.specs:
        if kind == "alias":
            env[o] = env[ins[0]]
            continue
        assert op is not None
        xs = [env[i] for i in ins]
        if kind == "compute":
            if not op.view:
                return None
            r = op.compute(xs)
            if not is_view_of(r, xs[0]):
                return None
            env[o] = r
            continue
        if kind == "into":
            out = env[o]
        elif kind == "scratch":
            out = env[o] = extra
        else:  # "target": computed straight into (a reshape of) a materialized value
            root, shape = extra
            out = env[o] = env[root].reshape(shape)
            if not is_view_of(out, env[root]):
                return None
        thunks.append(op.bind(xs, out) if op.bind is not None else partial(op.into, xs, out))
    return thunks


class SegmentBinding:
    """A host segment as a step of the direct call (:mod:`edgeport_xnnpack._direct`): ``run(arrays)`` takes the
    values of ``HostSegment.io`` in order (read, then written). Like the C glue's bindings it checks the arrays the
    direct call says are the delegate's own inputs and outputs (``expect``) and raises ``ValueError`` for anything
    but a C-contiguous float32 array of the exact dims, so the executor's general path handles those calls.
    ``replay``: whether it binds the program to arrays that come twice in a row (see the module)."""

    def __init__(self, segment: HostSegment, vids: Sequence[int], replay: bool = True) -> None:
        self.segment, self.vids = segment, tuple(vids)
        self.expected: list[tuple[int, tuple[int, ...], bool]] = []
        self.replay = replay
        self._bound: tuple[tuple[np.ndarray, ...], list[Thunk]] | None = None
        self._seen: tuple[int, ...] = ()  # ids of the last call's arrays (no references)

    def expect(self, k: int, fmt: str, dims: Sequence[int]) -> None:
        if fmt != "f":
            raise ValueError(f"unsupported format {fmt!r}")
        self.expected.append((k, tuple(dims), k >= len(self.segment.io[0])))

    def bound_calls(self, arrays: Sequence[np.ndarray]) -> list[Thunk] | None:
        """What a call with these very arrays runs, as calls of no arguments (the checks of ``expect`` first), when
        the segment is bound to them and needs nothing around its kernels (no copy plan, no OpenBLAS limit);
        else ``None``. For a caller that knows the next calls pass the same arrays (``_direct``)."""
        bound, segment = self._bound, self.segment
        if bound is None or segment.copies is not None or segment.blas is not None or \
                len(arrays) != len(bound[0]) or not all(map(is_, arrays, bound[0])):
            return None
        if not self.expected:
            return list(bound[1])
        check = partial(self.check, arrays)
        check.plan = IO_CHECK  # type: ignore[attr-defined]
        return [check, *bound[1]]

    def plan(self, arrays: Sequence[np.ndarray]) -> Any:
        """A segment that only moves data (its copy plan) on these arrays as a bound step of a direct call's chain,
        which checks the arrays ``expect`` names itself; else ``None``."""
        copies = self.segment.copies
        return None if copies is None or len(arrays) != len(self.vids) else copies.plan(arrays)

    def check(self, arrays: Sequence[np.ndarray]) -> None:
        """Raise ``ValueError`` unless the arrays ``expect`` names are what it expects."""
        for k, dims, output in self.expected:
            a = arrays[k]
            if type(a) is not np.ndarray or a.dtype is not _F32 and a.dtype != _F32 or a.shape != dims or \
                    not a.flags.c_contiguous or (output and not a.flags.writeable):
                raise ValueError(f"value {self.vids[k]}: expected a C-contiguous float32 array of shape {list(dims)}")

    def run(self, arrays: Sequence[np.ndarray]) -> None:
        self.check(arrays)
        segment = self.segment
        copies = segment.copies
        if copies is not None and copies.run(arrays):
            return
        if len(arrays) != len(self.vids):
            raise ValueError(f"expected {len(self.vids)} arrays, got {len(arrays)}")
        bound = self._bound
        if bound is not None:
            if all(map(is_, arrays, bound[0])):
                segment.replay(bound[1])
                return
            self._bound = None  # other arrays: the bound ones are no longer referenced
        env = dict(zip(self.vids, arrays))
        if self.replay:
            seen = tuple(map(id, arrays))
            if seen == self._seen:
                thunks = bind_program(segment, env)
                if thunks is not None:
                    self._bound = (tuple(arrays), thunks)
                    segment.replay(thunks)
                    return
                self.replay = False  # this program cannot be bound: run it as it is from now on
                env = dict(zip(self.vids, arrays))
            self._seen = seen
        segment.run(env)
