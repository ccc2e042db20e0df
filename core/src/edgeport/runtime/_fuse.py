"""Fused at load: the fully-masked-row guard of PyTorch's math attention, six kernel calls per layer in programs
exported from Hugging Face decoders::

    a = eq(x, s); b = logical_not(a); c = any(b, dim, keepdim); d = logical_not(c)
    z = full_like(v, fill); out = where(d, z, y)          # or where(d, y, z)

runs as one operation computing ``d = ~any(x != s, dim, keepdim)`` and the ``where``; ``z`` is made only when the
``where`` takes any of it. Applied only where the intermediates ``a``-``d`` and ``z`` are bool (``z``: any dtype)
planned tensors that nothing else reads (no other instruction, no delegate, not a method output, no alias over
their memory), ``x`` and ``v`` are not written between the first of the six calls and the ``where``, and ``s``, ``dim``, ``keepdim`` and
``fill`` are constants of the program, and all six are the portable library's kernels. Results are identical
to the six kernels'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgeport.program import schema as S
from edgeport.runtime._instructions import InstructionAnalysis, KernelCallInfo
from edgeport.runtime._values import MethodValues
from edgeport.runtime.kernel_utils import broadcast_shape, normalize_dim, resize
from edgeport.runtime.portable import LIBRARY

__all__ = ["FILL", "masked_row_guards"]

#: marks the ``where`` argument that is the ``full_like`` result (made by the fused op when needed)
FILL = -1

#: per dim: the index of every row's first element along it
_FIRST = [(slice(None),) * k + (0,) for k in range(64)]

_GUARD = ("aten::eq.Scalar_out", "aten::logical_not.out", "aten::any.out", "aten::logical_not.out")


#: an input of at most this many bytes is searched for the bytes of an infinite ``s`` (below)
_SEARCH_BYTES = 1 << 16


def _inf_bytes(s: Any, dtype: np.dtype) -> tuple[int, int, bytes] | None:
    """Where to look for ``s`` in ``dtype`` when ``s`` is an infinity of a float dtype (the mask fill ``-inf``):
    ``(j, itemsize, b)`` with ``b`` the byte ``j`` of its one bit pattern that compares equal to it -- its byte with
    the most set bits, the one holding the sign and the exponent's top bits (0xff for float32 -inf) -- so an input
    whose every element's byte ``j`` (``x.tobytes()[j::itemsize]``, one strided copy and one memchr) differs from
    ``b`` has no element equal to ``s``; only huge values, NaN and ``s`` itself carry that byte there."""
    if dtype.kind != "f" or not isinstance(s, (float, np.floating)) or not np.isinf(s):
        return None
    pattern = np.array(s, dtype).tobytes()
    j = max(range(len(pattern)), key=lambda i: bin(pattern[i]).count("1"))
    return j, len(pattern), pattern[j:j + 1]


def _guard_op(s: Any, dim: int, keepdim: bool, fill: Any, z_dtype: np.dtype,
              where: Callable[..., Any]) -> Callable[..., Any]:

    #: whether the last call's rows were told apart by their first elements only (a causal mask in a decode step:
    #: many matches, but position 0 visible); only picks which exact test runs first
    first_only = [False]
    patterns: dict[np.dtype, tuple[int, int, bytes] | None] = {}  # _inf_bytes(s, dtype) by the input's dtype
    shapes: dict[tuple, tuple[int, ...]] = {}  # the result's shape by the input's and the kept operand's

    def no_match(x) -> bool:
        """Whether a small input's bytes show that no element equals ``s`` (``False``: unknown)."""
        if x.nbytes > _SEARCH_BYTES:
            return False
        spot = patterns.get(x.dtype, 0)
        if spot == 0:
            spot = patterns[x.dtype] = _inf_bytes(s, x.dtype)
        return spot is not None and spot[2] not in x.tobytes()[spot[0]::spot[1]]

    def no_full_row(x, ax):
        """Whether no row along ``ax`` equals ``s`` throughout (else ``None``: unknown, run the reduction)."""
        if first_only[0]:
            first = x[_FIRST[ax]]
            if no_match(first) or not np.count_nonzero(first == s):
                return True
            first_only[0] = False
            return None
        if no_match(x):
            return True
        e = np.equal(x, s)
        if np.count_nonzero(e) < x.shape[ax]:  # fewer matches than a row has elements
            return True
        if not np.count_nonzero(e[_FIRST[ax]]):  # every row's first element differs
            first_only[0] = True
            return True
        return None

    axes: dict[int, int] = {}  # normalize_dim(dim, rank) by rank
    #: by (x's shape, x's dtype, q's shape), for inputs that took the copy path below: where to search for ``s``
    #: (``_inf_bytes``) and the result's shape (a repeated call then costs one byte search and one copy)
    plain: dict[tuple, tuple[tuple[int, int, bytes], tuple[int, ...]]] = {}

    def masked_row_guard(x, v, p, q, out):
        if p is None and x.__class__ is np.ndarray and q.__class__ is np.ndarray:
            hit = plain.get((x.shape, x.dtype, q.shape))
            if hit is not None and hit[1] == out.shape and q.dtype == out.dtype \
                    and hit[0][2] not in x.tobytes()[hit[0][0]::hit[0][1]]:
                out[...] = q  # no element equals s, so no row does: what the copy path below writes
                return out
        if x.ndim:  # all(x == s) along dim: one comparison and one reduction (the same as not any(x != s))
            ax = axes.get(x.ndim)
            if ax is None:
                ax = axes[x.ndim] = normalize_dim(dim, x.ndim)
            if p is None and q is not None and x.shape[ax] and no_full_row(x, ax):
                # no row matches throughout: d is False everywhere and where(d, fill, q) is q
                q_shape = q.shape if q.__class__ is np.ndarray else np.shape(q)
                shape = shapes.get((x.shape, q_shape))
                if shape is None:
                    dshape = x.shape[:ax] + ((1,) if keepdim else ()) + x.shape[ax + 1:]
                    shape = shapes[(x.shape, q_shape)] = broadcast_shape(dshape, q_shape)
                if shape != out.shape:
                    out = resize(out, shape)
                if q.__class__ is np.ndarray and q.dtype == out.dtype:
                    out[...] = q  # one copy (np.copyto's keyword handling costs more than the copy here)
                    spot = patterns.get(x.dtype)
                    if spot and x.nbytes <= _SEARCH_BYTES:
                        if len(plain) >= 64:  # shapes that change every call (a growing sequence): start over
                            plain.clear()
                        plain[(x.shape, x.dtype, q.shape)] = (spot, shape)
                else:
                    np.copyto(out, q, casting="unsafe")
                return out
            d = np.logical_and.reduce(np.equal(x, s), axis=ax, keepdims=keepdim)
        else:
            d = np.logical_not(np.any(np.not_equal(x, s), axis=normalize_dim(dim, x.ndim), keepdims=keepdim))
        if p is None or q is None:
            n = np.count_nonzero(d)
            if (p is None and n) or (q is None and n < d.size):
                z = np.full(v.shape, fill, dtype=z_dtype)
                p, q = (z if p is None else p), (z if q is None else q)
            else:  # the fill is never taken: the other branch everywhere, what where(d, y, y) writes
                y = q if p is None else p
                shape = broadcast_shape(d.shape, np.shape(y))
                if shape != out.shape:
                    out = resize(out, shape)
                np.copyto(out, y, casting="unsafe")
                return out
        return where(d, p, q, out)

    return masked_row_guard


def masked_row_guards(mv: MethodValues, plan: S.ExecutionPlan, analysis: InstructionAnalysis, template: list[Any],
                      ) -> tuple[dict[tuple[int, int], tuple[Callable[..., Any], list[int]]], set[tuple[int, int]]]:
    """``({(chain, where instruction): (fused op, [x, v, p, q] value indices, FILL for the full_like)}, the
    instructions the fused ops stand for)``."""
    fused: dict[tuple[int, int], tuple[Callable[..., Any], list[int]]] = {}
    skipped: set[tuple[int, int]] = set()
    if any(type(i.instr_args) is S.JumpFalseCall for c in plan.chains for i in c.instructions):
        return fused, skipped
    kinds, specs = mv.kinds, mv.specs
    reads: dict[int, int] = {}
    writers: dict[int, list[tuple[int, int]]] = {}

    def read(idx: int) -> None:
        for t in [idx, *mv.tensor_items(idx)] if kinds[idx] is not S.Tensor else [idx]:
            reads[t] = reads.get(t, 0) + 1

    for idx in plan.outputs:
        read(idx)
        reads[idx] = reads.get(idx, 0) + 1
    for ci, chain in enumerate(plan.chains):
        for ii, instr in enumerate(chain.instructions):
            a, call = instr.instr_args, analysis.chains[ci][ii]
            if call is not None:
                for pos, idx in enumerate(call.params):
                    if pos not in call.outs or pos in call.mut:
                        read(idx)
                    if pos in call.outs or pos in call.mut:
                        for t in mv.tensor_items(idx) or [idx]:
                            writers.setdefault(t, []).append((ci, ii))
                for r in call.rets:
                    writers.setdefault(r, []).append((ci, ii))
            elif type(a) is S.DelegateCall:
                for idx in a.args:
                    read(idx)
                    for t in mv.tensor_items(idx) or [idx]:
                        writers.setdefault(t, []).append((ci, ii))
            elif type(a) is S.MoveCall:
                read(a.move_from)
                writers.setdefault(a.move_to, []).append((ci, ii))
    never_written = [sp for i, sp in specs.items() if sp.mem_id and sp.nbytes and sp.constant is None
                     and i not in writers and i not in plan.inputs]

    def sole_writer(idx: int) -> tuple[int, int] | None:
        w = set(writers.get(idx, []))  # an out argument is also the returned value: one writer
        return w.pop() if len(w) == 1 else None

    def call_at(where: tuple[int, int] | None, name: str) -> KernelCallInfo | None:
        if where is None:
            return None
        call = analysis.chains[where[0]][where[1]]
        if call is None or call.folded or call.name != name or call.mut or len(call.outs) != 1 \
                or call.entry.library != LIBRARY:  # a kernel library overriding one of them: left as is
            return None
        return call

    def constant(idx: int) -> bool:
        return kinds[idx] in (S.Int, S.Double, S.Bool, S.Null) and idx not in analysis.rw

    def private(idx: int, want_bool: bool) -> bool:
        """A planned tensor only one instruction reads, no alias overlaps."""
        sp = specs.get(idx) if kinds[idx] is S.Tensor else None
        if sp is None or not sp.mem_id or sp.constant is not None or reads.get(idx, 0) != 1:
            return False
        if want_bool and sp.dtype != np.bool_:
            return False
        return not any(o.mem_id == sp.mem_id and o.offset < sp.offset + sp.nbytes and sp.offset < o.offset + o.nbytes
                       for o in never_written)

    for ci, infos in enumerate(analysis.chains):
        for iw, w in enumerate(infos):
            if w is None or w.folded or w.name != "aten::where.self_out" or len(w.params) != 4 \
                    or w.entry.library != LIBRARY:
                continue
            chain_calls = []
            value = w.params[0]
            for name in reversed(_GUARD):
                at = sole_writer(value)
                call = call_at(at, name)
                if call is None or at[0] != ci or not private(value, True):
                    break
                chain_calls.append((at, call))
                value = call.params[0]
            if len(chain_calls) != 4:
                continue
            (_, n2), (_, anyc), (_, n1), (_, eq) = chain_calls
            x, s = eq.params[0], eq.params[1]
            dim, keepdim = anyc.params[1], anyc.params[2]
            if kinds[x] is not S.Tensor or not (constant(s) and constant(dim) and constant(keepdim)):
                continue
            if type(template[dim]) is not int or len(n1.params) != 2 or len(n2.params) != 2:
                continue
            args, fill, z_dtype, f_at, v = [x, -2], None, None, None, -2
            for idx in w.params[1:3]:
                at = sole_writer(idx)
                fl = call_at(at, "aten::full_like.out")
                if f_at is None and fl is not None and at[0] == ci and kinds[fl.params[0]] is S.Tensor \
                        and constant(fl.params[1]) and private(idx, False) and template[fl.params[2]] is None:
                    args.append(FILL)
                    fill, z_dtype, f_at, v = template[fl.params[1]], specs[idx].dtype, at, fl.params[0]
                else:
                    args.append(idx)
            if f_at is None:
                continue
            args[1] = v
            span = [at for at, _ in chain_calls] + [f_at]
            lo = min(ii for _, ii in span)
            if any(lo < ii < iw and (ci, ii) not in span
                   for t in (x, v) for ii in _writes_of(t, writers, ci, specs)):
                continue  # x or v is written between the first of the six calls and the where
            fused[(ci, iw)] = (_guard_op(template[s], template[dim], bool(template[keepdim]), fill, z_dtype,
                                         w.entry.fn), args)
            skipped.update(span)
    return fused, skipped


def _writes_of(x: int, writers: dict[int, list[tuple[int, int]]], ci: int, specs: dict) -> list[int]:
    """Instruction indices (chain ``ci``) writing ``x``, planned memory overlapping it, or any tensor outside
    planned memory (which may be a view of anything)."""
    sx = specs[x]
    found = []
    for t, ws in writers.items():
        st = specs.get(t)
        hit = t == x or (st is not None and st.constant is None and (
            not st.mem_id or not sx.mem_id or (st.mem_id == sx.mem_id and st.offset < sx.offset + sx.nbytes
                                               and sx.offset < st.offset + st.nbytes)))
        if hit:
            found.extend(ii for c, ii in ws if c == ci)
    return found
