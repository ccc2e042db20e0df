"""Numpy implementations of the graph nodes this libXNNPACK cannot define (torch-free).

The 2022 snapshot of XNNPACK that Debian ships has no static transpose, concatenate, slice, batch matrix
multiply, copy, tanh, exp, ... nodes; ExecuTorch's XNNPACK delegate emits them (a transpose at every NCHW/NHWC
boundary). The executor runs them in host segments between XNNPACK runtimes: transposes, slices and reshapes are numpy
views, and only values leaving a segment are written (into preallocated buffers). ``make_host_op`` checks the
node's parameters against the shapes it was planned with and raises ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from edgeport_xnnpack._blas import blas_threads
from edgeport_xnnpack._copies import plan_copies
from edgeport_xnnpack._dynamic_quant import DYNAMIC_ROWS, quantize_rows
from edgeport_xnnpack._host_gelu import gelu, gelu_calls
from edgeport_xnnpack._host_place import fused_scales
from edgeport_xnnpack._replay import TRANSPOSE_KERNEL_MIN, bind_reshape_copy, bind_view_copy, is_view_of
from edgeport_xnnpack._rewrite_int8 import INT8_MEAN, int8_mean
from edgeport_xnnpack.schema.graph import CAT_INPUTS, XNode

try:  # optional, built with the C glue when a compiler is present
    from edgeport_xnnpack import _kernels
except ImportError:  # pragma: no cover - no compiler at install time
    _kernels = None
try:
    from edgeport_xnnpack._gemm import bmm as _bmm
    from edgeport_xnnpack._gemm import bmm_plan as _bmm_plan
except ImportError:  # pragma: no cover - no compiler at install time, or an extension built before bmm
    _bmm = _bmm_plan = None

_F32 = np.dtype(np.float32)
#: batch matrix products of at most this many multiply-adds run on ``_gemm.bmm`` (one call for the whole batch,
#: no Python per batch element; a decode step's attention products are 65k); larger ones on numpy's OpenBLAS
BMM_MAX_MACS = 1 << 18


def _gelu_op(shape: tuple[int, ...], pool: Any) -> HostOp:
    """GELU on the C kernel, written straight into the output, in chunks on ``pool`` when it has workers."""
    into, bind = gelu_calls(pool)
    op = _op(into=into, out_shape=shape)
    op.bind = bind
    return op


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "XNNTanh": np.tanh,
    "XNNExp": np.exp,
    "XNNLog": np.log,
    "XNNSin": np.sin,
    "XNNCos": np.cos,
    "XNNReciprocalSquareRoot": lambda x: 1.0 / np.sqrt(x),
    "XNNGelu": gelu,
    "XNNCopy": lambda x: x,
}

# node kinds the executor can run on the host when this libXNNPACK cannot (reshapes and binary operators may
# run on the host too, where the planner finds that cheaper)
HOST_KINDS = frozenset({"XNNStaticTranspose", "XNNStaticSlice", "XNNBatchMatrixMultiply", "XNNFullyConnected",
                        *CAT_INPUTS, *_UNARY})


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass
class HostOp:
    """One node on the host: ``compute(xs)`` returns its result (a view of an input when ``view``), ``into(xs,
    out)`` writes it into ``out`` (a C-contiguous array of the output shape)."""

    compute: Callable[[Sequence[np.ndarray]], np.ndarray]
    into: Callable[[Sequence[np.ndarray], np.ndarray], None]
    view: bool
    uses_blas: bool = False  # runs numpy's OpenBLAS (the segment then limits it to one thread, see _blas)
    reads: int | None = None  # how many of the node's leading inputs it reads (None: all; the rest it holds)
    # (shape, dtype) when ``compute`` is ``into`` on a fresh array of that C-contiguous shape: a segment may then
    # keep one such array for the op and compute into it on every call (no allocation, no fresh pages)
    scratch: tuple[tuple[int, ...], Any] | None = None
    # ``bind(xs, out)``: ``into`` for these very arrays as a call of no arguments, views made once (see
    # :mod:`edgeport_xnnpack._replay`); ``None``: the replay calls ``into(xs, out)`` itself
    bind: Callable[[Sequence[np.ndarray], np.ndarray], Callable[[], Any]] | None = None


def _op(compute: Callable[[Sequence[np.ndarray]], np.ndarray] | None = None, view: bool = False,
        into: Callable[[Sequence[np.ndarray], np.ndarray], None] | None = None,
        out_shape: tuple[int, ...] | None = None, out_dtype: type = np.float32) -> HostOp:
    """A host op from ``compute``, ``into`` or both (``compute`` alone copies into ``out``; ``into`` alone
    computes into a fresh ``out_dtype`` array of ``out_shape``)."""
    bind = None
    if into is None:
        def into(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
            r = compute(xs)
            if view and _transposed_into(r, None, out):
                return
            np.copyto(out, r.reshape(out.shape), casting="same_kind")
        if view:
            bind = bind_view_copy(compute, into)
    scratch = None
    if compute is None:
        def compute(xs: Sequence[np.ndarray]) -> np.ndarray:
            out = np.empty(out_shape, out_dtype)
            into(xs, out)
            return out
        scratch = (tuple(out_shape), out_dtype) if out_shape is not None else None
    return HostOp(compute, into, view, scratch=scratch, bind=bind)


def _clamp(node: XNode) -> tuple[float, float] | None:
    lo, hi = node.output_min_max or (-math.inf, math.inf)
    _check(not (math.isnan(lo) or math.isnan(hi) or lo > hi), f"bad output range ({lo}, {hi})")
    return (lo, hi) if lo > -math.inf or hi < math.inf else None


def make_host_op(node: XNode, in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...],
                 pool: Any = None) -> HostOp:
    """The host implementation of ``node``; validates its parameters against the planned shapes now. ``pool`` (the
    delegate's ``native.ThreadPool``, or ``None``) is where GELU's C kernel runs its chunks."""
    kind = node.kind
    rank = len(out_shape)
    if kind in ("XNNStaticReshape", "XNNCopy"):
        _check(math.prod(in_shapes[0]) == math.prod(out_shape), f"reshape of {in_shapes[0]} into {out_shape}")
        op = _op(lambda xs: xs[0].reshape(out_shape), view=True,
                 into=lambda xs, out: np.copyto(out.reshape(xs[0].shape), xs[0]))
        op.bind = bind_reshape_copy
        return op
    if kind == "XNNStaticTranspose":
        perm = [int(p) for p in node.get("perm")]
        _check(sorted(perm) == list(range(len(in_shapes[0]))), f"bad permutation {perm} for rank {len(in_shapes[0])}")
        _check(tuple(in_shapes[0][p] for p in perm) == out_shape, f"transpose {perm} of {in_shapes[0]} != {out_shape}")
        return _op(lambda xs: xs[0].transpose(perm), view=True)
    if kind in CAT_INPUTS:
        axis = int(node.get("axis"))
        _check(axis < rank, f"concatenate axis {axis} out of range for rank {rank}")
        _check(all(len(s) == rank for s in in_shapes), "concatenate inputs differ in rank")
        _check(sum(s[axis] for s in in_shapes) == out_shape[axis], "concatenate sizes do not add up")
        _check(all(s[:axis] + s[axis + 1:] == out_shape[:axis] + out_shape[axis + 1:] for s in in_shapes),
               "concatenate inputs differ outside the axis")
        return _op(lambda xs: np.concatenate(list(xs), axis=axis),
                   into=lambda xs, out: np.concatenate(list(xs), axis=axis, out=out))
    if kind == "XNNStaticSlice":
        offsets, sizes = [int(v) for v in node.get("offsets")], [int(v) for v in node.get("sizes")]
        shape = in_shapes[0]
        _check(len(offsets) == len(sizes) == len(shape), "slice offsets/sizes do not match the input rank")
        sizes = [s if s else d - o for s, d, o in zip(sizes, shape, offsets, strict=True)]  # 0 = to the end
        _check(all(o + s <= d for o, s, d in zip(offsets, sizes, shape, strict=True)), "slice out of bounds")
        _check(tuple(sizes) == out_shape, f"slice sizes {sizes} != output shape {out_shape}")
        index = tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))
        return _op(lambda xs: xs[0][index], view=True)
    if kind in ("XNNBatchMatrixMultiply", "XNNFullyConnected"):
        return _matmul(node, in_shapes, out_shape)
    if kind in _BINARY:
        return _binary(node, in_shapes, out_shape)
    if kind == "XNNConvert" and DYNAMIC_ROWS in node.fields:  # float32 -> qdint8, emulated (see _dynamic_quant)
        _check(in_shapes[0] == out_shape, f"dynamic quantization of {in_shapes[0]} into {out_shape}")
        rows = int(node.fields[DYNAMIC_ROWS])
        return _op(into=lambda xs, out: quantize_rows(np.ascontiguousarray(xs[0], np.float32), out, rows),
                   out_shape=out_shape)
    if kind == "XNNGlobalAvgPooling2d" and INT8_MEAN in node.fields:  # int8, rounded as newer XNNPACK does
        params = node.fields[INT8_MEAN]
        _check(len(in_shapes[0]) == 4 and math.prod(out_shape) == in_shapes[0][0] * in_shapes[0][3],
               f"global average pooling of {in_shapes[0]} into {out_shape}")
        return _op(into=lambda xs, out: int8_mean(xs[0], params, out), out_shape=out_shape, out_dtype=np.int8)
    fn = _UNARY.get(kind)
    if fn is None:
        raise ValueError(f"no host implementation of {kind}")
    _check(in_shapes[0] == out_shape, f"{kind}: input {in_shapes[0]} and output {out_shape} shapes differ")
    if kind == "XNNGelu" and _kernels is not None:
        return _gelu_op(out_shape, pool)
    return _op(lambda xs: np.asarray(fn(xs[0]), np.float32))


def _matmul(node: XNode, in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...],
            scaled: bool = False) -> HostOp:
    """A matrix product; ``scaled``: it also reads a one-element third input ``s`` and computes ``a @ (b * s)`` (a
    multiply by a scalar fused into its consumer, see ``HostSegment``; ``b * s`` rounded as if materialized)."""
    kind = node.kind
    transpose_b = bool(node.get("flags") & 1)
    if kind == "XNNFullyConnected":
        transpose_b = not transpose_b  # the filter is [out, in] unless XNN_FLAG_TRANSPOSE_WEIGHTS
    has_bias = len(in_shapes) > 2 and not scaled
    a, b = in_shapes[0], in_shapes[1]
    _check(len(a) >= 1 and len(b) >= 2, "matrix multiply needs a matrix operand")
    k_b, n_b = (b[-1], b[-2]) if transpose_b else (b[-2], b[-1])
    flat = kind == "XNNFullyConnected" and bool(node.get("flags") & 4)  # XNN_FLAG_TENSORFLOW_RESHAPE_2D
    _check(math.prod(a) % max(k_b, 1) == 0 if flat else a[-1] == k_b,
           f"matrix multiply inner sizes differ: {a} x {b}")
    if has_bias:
        _check(in_shapes[2] == (n_b,), f"bias {in_shapes[2]} does not match {n_b} outputs")
    rows = (math.prod(a) // max(k_b, 1),) if flat else a[:-1]
    batch = np.broadcast_shapes(rows[:-1], b[:-2]) if len(b) > 2 or len(rows) > 1 else ()
    want = (*batch, *rows[-1:], n_b) if not flat else (rows[0], n_b)
    _check(math.prod(want) == math.prod(out_shape), f"matrix multiply {a} x {b} gives {want}, not {out_shape}")
    same = tuple(want) == tuple(out_shape)
    clamp = _clamp(node)
    # the C product where it pays (see BMM_MAX_MACS); it clamps itself when no bias comes between
    small = _bmm is not None and math.prod(out_shape) * k_b <= BMM_MAX_MACS
    bounds = clamp if clamp is not None and not has_bias else ()

    def operands(xs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        rhs = np.swapaxes(xs[1], -1, -2) if transpose_b else xs[1]
        return (xs[0].reshape(-1, k_b) if flat else xs[0]), rhs
    if scaled:
        return _scaled_matmul(operands, want, same, small, clamp, out_shape)

    def into(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
        lhs, rhs = operands(xs)
        dst = out if same else out.reshape(want)
        done = small and _bmm(lhs, rhs, dst, *bounds)
        if done and not has_bias:
            return  # clamped too
        if not done:
            np.matmul(lhs, rhs, out=dst)
        if has_bias:
            np.add(dst, xs[2], out=dst)
        if clamp is not None:
            np.clip(dst, clamp[0], clamp[1], out=dst)

    def bind(xs: Sequence[np.ndarray], out: np.ndarray) -> Callable[[], Any]:
        lhs, rhs = operands(xs)
        dst = out if same else out.reshape(want)
        if has_bias or not small or not (is_view_of(lhs, xs[0]) and is_view_of(dst, out)):
            return partial(into, xs, out)
        product = partial(_bmm, lhs, rhs, dst, *bounds)
        thunk = lambda: product() or into(xs, out)  # noqa: E731 - the numpy path for what the C product refuses
        thunk.plan = partial(_bmm_plan, lhs, rhs, dst, *bounds)  # type: ignore[attr-defined] - see _replay
        return thunk
    op = _op(into=into, out_shape=out_shape)
    op.uses_blas, op.bind = not small, bind
    return op


def _scaled_matmul(operands: Callable[[Sequence[np.ndarray]], tuple[np.ndarray, np.ndarray]],
                   want: tuple[int, ...], same: bool, small: bool, clamp: tuple[float, float] | None,
                   out_shape: tuple[int, ...]) -> HostOp:
    lo, hi = clamp if clamp is not None else (-math.inf, math.inf)
    held: list[np.ndarray] = []  # the scaled operand of the numpy path, allocated once

    def into(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
        lhs, rhs = operands(xs)
        scale = xs[2]
        dst = out if same else out.reshape(want)
        if small and scale.dtype == np.float32 and _bmm(lhs, rhs, dst, lo, hi, float(scale.reshape(-1)[0])):
            return
        if not held or held[0].shape != rhs.shape:  # the multiply as it ran before, then numpy's product
            held[:] = [np.empty(rhs.shape, np.float32)]
        b = held[0]
        if not _transposed_into(rhs, scale, b):
            np.multiply(rhs, scale.reshape(()), out=b)
        np.matmul(lhs, b, out=dst)
        if clamp is not None:
            np.clip(dst, lo, hi, out=dst)

    def bind(xs: Sequence[np.ndarray], out: np.ndarray) -> Callable[[], Any]:
        lhs, rhs = operands(xs)
        dst = out if same else out.reshape(want)
        scale = xs[2].reshape(-1)
        if not small or xs[2].dtype != np.float32 or \
                not (is_view_of(lhs, xs[0]) and is_view_of(dst, out) and is_view_of(scale, xs[2])):
            return partial(into, xs, out)

        def run() -> None:  # the scale read on every call
            if not _bmm(lhs, rhs, dst, lo, hi, float(scale[0])):
                into(xs, out)
        run.plan = partial(_bmm_plan, lhs, rhs, dst, lo, hi, scale)  # type: ignore[attr-defined] - see _replay
        return run
    op = _op(into=into, out_shape=out_shape)
    op.uses_blas, op.bind = not small, bind
    return op


_BINARY = {"XNNMultiply": np.multiply, "XNNAdd": np.add, "XNNSubtract": np.subtract, "XNNDiv": np.divide}


def _binary(node: XNode, in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]) -> HostOp:
    ufunc = _BINARY[node.kind]
    _check(np.broadcast_shapes(in_shapes[0], in_shapes[1]) == tuple(out_shape),
           f"{node.kind}: {in_shapes[0]} and {in_shapes[1]} do not broadcast to {out_shape}")
    clamp = _clamp(node)

    scalar = 1 if node.kind == "XNNMultiply" and math.prod(in_shapes[1]) == 1 else \
        0 if node.kind == "XNNMultiply" and math.prod(in_shapes[0]) == 1 else None

    def into(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
        if scalar is None or not _transposed_into(xs[1 - scalar], xs[scalar], out):
            ufunc(xs[0], xs[1], out=out)
        if clamp is not None:
            np.clip(out, clamp[0], clamp[1], out=out)
    return _op(into=into, out_shape=out_shape)


def _transposed_into(a: np.ndarray, scale: np.ndarray | None, out: np.ndarray) -> bool:
    """``out[...] = a (* scale)`` on the C kernel when ``a`` is the last-two-axes transpose of a C-contiguous
    float32 array of ``TRANSPOSE_KERNEL_MIN`` (4096) elements or more (a transposed key cache times the attention
    scale): numpy's strided copy takes ~2x the kernel's time there (64k floats), below that the call's fixed cost
    eats the gain. One IEEE single multiply per element either way, so the bits are numpy's. ``False``: nothing
    done (any other layout, dtype or size; ``a`` and ``out`` overlap; no kernel)."""
    if a.size < TRANSPOSE_KERNEL_MIN or a.ndim < 2 or a.flags.c_contiguous or a.dtype != np.float32 or \
            out.dtype != np.float32 or a.size != out.size or not out.flags.c_contiguous:  # the cheapest refusals first
        return False
    transpose = getattr(_kernels, "transpose_scale", None)
    if transpose is None:
        return False
    t = a.swapaxes(-1, -2)
    if not t.flags.c_contiguous or scale is not None and scale.dtype != np.float32:
        return False
    rows, cols = t.shape[-2], t.shape[-1]
    s = None if scale is None else float(scale.reshape(-1)[0])
    if s is not None and s != s:
        return False  # a NaN scale: which NaN comes out depends on the operand order, leave it to numpy
    return transpose(t, out, a.size // (rows * cols), rows, cols, s)  # False: they overlap


class HostSegment:
    """Consecutive host nodes run as one step on numpy views.

    Reshapes, transposes and slices cost nothing; a value is written to memory only when it leaves the segment
    (``materialize``: the executor's buffer for it is in ``env``). An operator whose result reaches such a value
    through reshapes only writes straight into that buffer (a matrix multiply computes into the output).
    """

    def __init__(self, nodes: Sequence[XNode], ops: Sequence[HostOp], materialize: set[int],
                 dims: Callable[[int], tuple[int, ...]],
                 io: Sequence[tuple[list[int], list[int]]] | None = None) -> None:
        """``io``: each node's ``(inputs(), outputs())`` when the caller has them (the planner keeps them)."""
        if io is None:
            io = [(n.inputs(), n.outputs()) for n in nodes]
        produced = {o: j for j, (_, outs) in enumerate(io) for o in outs}
        readers: dict[int, list[int]] = {}
        for j, (ins, _) in enumerate(io):
            for v in set(ins):
                readers.setdefault(v, []).append(j)
        ops = list(ops)
        # a multiply by a one-element value whose result only reaches a matrix product's second operand (through
        # reshapes): the product scales that operand itself (K^T * scale, read in place from the key cache)
        aliased, scales = fused_scales(nodes, ops, materialize, readers, dims, io) if _bmm is not None else ({}, {})
        for b, scale in scales.items():
            ops[b] = _matmul(nodes[b], [dims(v) for v in io[b][0]], dims(io[b][1][0]), scaled=True)
        # target[u] = (materialized root value, u's shape): u is computed straight into the root's buffer
        target: dict[int, tuple[int, tuple[int, ...]]] = {}
        skip: set[int] = set()
        for j in reversed(range(len(nodes))):
            n, op = nodes[j], ops[j]
            if not (op.view and n.kind == "XNNStaticReshape"):
                continue
            o = io[j][1][0]
            root = o if o in materialize else target.get(o, (None,))[0]
            u = io[j][0][0]
            if root is None or u in materialize or u not in produced or readers.get(u) != [j]:
                continue
            target[u] = (root, dims(u))
            skip.add(j)
        # a reshape of a reshape's result (read by nothing else) reshapes the first one's input: one view, not two
        source: dict[int, int] = {}  # node -> the value it reshapes instead of its input
        dropped: set[int] = set()
        for j, n in enumerate(nodes):
            u = io[j][0][0] if io[j][0] else None
            i = produced.get(u, -1)
            if j in skip or i < 0 or i in skip or not (_is_view_reshape(n, ops[j]) and
                                                     _is_view_reshape(nodes[i], ops[i])):
                continue
            if u in materialize or u in target or readers.get(u) != [j]:
                continue
            source[j] = source.get(i, io[i][0][0])
            dropped.add(i)
        self.program: list[Callable[[dict[int, np.ndarray]], None]] = []
        # the program as data for ``_replay.bind_program``: (kind, op, inputs, output, buffer / (root, shape))
        self.specs: list[tuple[str, HostOp | None, list[int], int, Any]] = []
        outside: set[int] = set()  # values the program reads that come from outside the segment
        written: set[int] = set()  # the executor's buffers it writes
        for j, (n, op) in enumerate(zip(nodes, ops, strict=True)):
            if j in skip or j in dropped:
                continue
            ins, o = list(io[j][0])[:op.reads], io[j][1][0]
            if j in source:
                ins = [source[j]]
            if j in aliased:  # the multiply's operand stands for its result (the product applies the scale)
                ins = [aliased[j]]
                self.program.append(_alias(ins[0], o))
                self.specs.append(("alias", None, ins, o, None))
                outside.update(v for v in ins if v not in produced)
                continue
            if j in scales:
                ins.append(scales[j])
            outside.update(v for v in ins if v not in produced)
            if o in target:
                self.program.append(_into_target(op, ins, o, *target[o]))
                self.specs.append(("target", op, ins, o, target[o]))
                written.add(target[o][0])
            elif o in materialize:
                self.program.append(_into(op, ins, o))
                self.specs.append(("into", op, ins, o, None))
                written.add(o)
            elif op.scratch is not None and op.scratch[0] == tuple(dims(o)):
                # an intermediate of this segment only (never an output: those are materialized), so one array
                # reused across calls holds it; each op writes only its own
                buf = np.empty(*op.scratch)
                self.program.append(_into_scratch(op, ins, o, buf))
                self.specs.append(("scratch", op, ins, o, buf))
            else:
                self.program.append(_compute(op, ins, o))
                self.specs.append(("compute", op, ins, o, None))
        self.size = len(nodes)
        self.io = (sorted(outside), sorted(written))
        self.reshape_only = all(n.kind in ("XNNStaticReshape", "XNNCopy") and op.view for n, op in zip(nodes, ops))
        self._io_all = (*self.io[0], *self.io[1])
        # a segment that only moves data: its copies in one C call (None: the numpy program above)
        self.copies = plan_copies(nodes, self.program, *self.io, dims)
        # matrix multiplies run on one OpenBLAS thread (see _blas); None: nothing to limit
        self.blas = blas_threads() if any(op.uses_blas for op in ops) else None

    def run(self, env: dict[int, np.ndarray]) -> None:
        if self.copies is not None and self.copies.run([env[v] for v in self._io_all]):
            return
        self.replay(self.program, env)

    def replay(self, steps: Sequence[Callable[..., Any]], *env: dict[int, np.ndarray]) -> None:
        """Each of ``steps`` called with ``env`` (the program, or nothing: a bound replay), numpy's OpenBLAS on
        one thread meanwhile when the segment uses it."""
        blas = self.blas
        n = blas[0]() if blas is not None else 1
        if n == 1:
            for step in steps:
                step(*env)
            return
        blas[1](1)
        try:
            for step in steps:
                step(*env)
        finally:
            blas[1](n)


def _is_view_reshape(n: XNode, op: HostOp) -> bool:
    return n.kind == "XNNStaticReshape" and op.view and op.reads is None


def _alias(src: int, o: int) -> Callable[[dict[int, np.ndarray]], None]:
    def step(env: dict[int, np.ndarray]) -> None:
        env[o] = env[src]
    return step


def _compute(op: HostOp, ins: list[int], o: int) -> Callable[[dict[int, np.ndarray]], None]:
    fn = op.compute

    def step(env: dict[int, np.ndarray]) -> None:
        env[o] = fn([env[i] for i in ins])
    return step


def _into(op: HostOp, ins: list[int], o: int) -> Callable[[dict[int, np.ndarray]], None]:
    fn = op.into

    def step(env: dict[int, np.ndarray]) -> None:
        fn([env[i] for i in ins], env[o])
    return step


def _into_scratch(op: HostOp, ins: list[int], o: int, buf: np.ndarray) -> Callable[[dict[int, np.ndarray]], None]:
    fn = op.into

    def step(env: dict[int, np.ndarray]) -> None:
        fn([env[i] for i in ins], buf)
        env[o] = buf
    return step


def _into_target(op: HostOp, ins: list[int], o: int, root: int,
                 shape: tuple[int, ...]) -> Callable[[dict[int, np.ndarray]], None]:
    fn = op.into

    def step(env: dict[int, np.ndarray]) -> None:
        dst = env[root].reshape(shape)
        fn([env[i] for i in ins], dst)
        env[o] = dst
    return step
