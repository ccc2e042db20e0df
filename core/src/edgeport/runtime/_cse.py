"""Common kernel calls at load: a pure kernel call whose inputs hold the same contents as those of an earlier
call of the same kernel (e.g. the attention mask or positions a Hugging Face decoder recomputes in every layer
from the cache position) is not run again: its out argument gets a copy of the earlier result, or, where that
result stays intact until the value's last read (:func:`alias_reuses`), its slot holds the earlier result itself.

Contents are tracked by value numbering over the method's instructions, in order: every value starts with an
identity of its own (a constant, a method input, a literal scalar by its value); a kernel call's result gets the
identity ``(kernel, identities of its inputs, output dtype and layout)``; any write -- a kernel's out or mutated
argument, a delegate's output, a move -- gives every tensor whose planned memory it overlaps, and every tensor
outside planned memory, a fresh identity. A call is reused only when its earlier twin's result still holds that
identity when the call runs, i.e. nothing wrote over it in between. Methods with jumps are left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count
from typing import Any

import numpy as np

from edgeport.program import schema as S
from edgeport.runtime._instructions import InstructionAnalysis, KernelCallInfo
from edgeport.runtime._values import MethodValues
from edgeport.runtime._views import delegate_outputs, intact_until_last_read, overlaps, written_by
from edgeport.runtime.kernel_utils import resize

__all__ = ["alias_reuses", "common_calls", "reuse_alias", "reuse_result", "run_accesses"]


def reuse_result(src: Any, out: np.ndarray) -> np.ndarray:
    """The kernel of a reused call: ``out`` (resized to ``src``'s shape for dynamic shapes) holding ``src``."""
    if src.shape != out.shape:
        out = resize(out, src.shape)
    np.copyto(out, src)
    return out


def _literal(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_literal(x) for x in v)
    return (type(v).__name__, repr(v))  # repr keeps -0.0 apart from 0.0 and nan equal to itself


def common_calls(mv: MethodValues, plan: S.ExecutionPlan, analysis: InstructionAnalysis, template: list[Any],
                 delegates: Sequence[Any] = ()) -> dict[tuple[int, int], int]:
    """``(chain, instruction) -> slot`` of the kernel calls whose result is already in ``slot`` when they run."""
    if any(type(i.instr_args) is S.JumpFalseCall for c in plan.chains for i in c.instructions):
        return {}
    kinds, specs = mv.kinds, mv.specs
    fresh = count()
    ident: dict[int, Any] = {}
    for i, k in enumerate(kinds):
        sp = specs.get(i) if k is S.Tensor else None
        if sp is not None and sp.constant is not None:  # small ones (scalars of masks) by their contents
            c = sp.constant
            ident[i] = ("const", str(c.dtype), c.shape, c.tobytes()) if c.nbytes <= 256 else ("const", i)
        elif k in (S.Int, S.Double, S.Bool, S.String, S.Null) and i not in analysis.rw:
            ident[i] = _literal(template[i])
        elif k is S.IntList and i not in analysis.rw and not any(j in analysis.rw for j in mv.items(i)):
            ident[i] = _literal(template[i])
        else:
            ident[i] = ("v", i, next(fresh))
    planned = {i: (sp.mem_id, sp.offset, sp.offset + sp.nbytes) for i, sp in specs.items()
               if sp.mem_id and sp.constant is None and sp.nbytes}
    by_mem: dict[int, list[tuple[int, int, int]]] = {}
    for i, (m, lo, hi) in planned.items():
        by_mem.setdefault(m, []).append((lo, hi, i))
    loose = [i for i, sp in specs.items() if not sp.mem_id and sp.constant is None]

    dyn_lists = {i for i, k in enumerate(kinds) if k is S.IntList
                 and (i in analysis.rw or any(j in analysis.rw for j in mv.items(i)))}

    def value_id(idx: int) -> Any:
        k = kinds[idx]
        if k in (S.TensorList, S.OptionalTensorList) or idx in dyn_lists:
            return ("list", tuple(None if j < 0 else value_id(j) for j in mv.items(idx)))
        return ident[idx]

    def written(idx: int) -> None:
        """``idx`` (a value, or each tensor of a list) was written: it and whatever shares its memory change."""
        for t in mv.tensor_items(idx) or [idx]:
            ident[t] = ("v", t, next(fresh))
            region = planned.get(t)
            if region is not None:
                m, lo, hi = region
                for a, b, other in by_mem[m]:
                    if a < hi and lo < b:
                        ident[other] = ("v", other, next(fresh))
            if region is not None or (kinds[t] is S.Tensor and specs[t].mem_id == 0):
                for other in loose:  # tensors outside planned memory may be views of anything
                    ident[other] = ("v", other, next(fresh))

    n_out = delegate_outputs(delegates)

    seen: dict[Any, tuple[int, Any]] = {}  # call key -> (slot of its result, that result's identity)
    reused: dict[tuple[int, int], int] = {}
    for ci, chain in enumerate(plan.chains):
        for ii, instr in enumerate(chain.instructions):
            a = instr.instr_args
            call = analysis.chains[ci][ii]
            if call is not None:
                if call.folded or (ci, ii) in analysis.fused_away:  # not run; their results are read by no one
                    continue
                key = None if (ci, ii) in analysis.fused else _call_key(mv, call, value_id)
                result = _result_slot(mv, call) if key is not None else None
                if key is not None and result is not None:
                    hit = seen.get(key)
                    if hit is not None and value_id(hit[0]) == hit[1]:
                        reused[(ci, ii)] = hit[0]
                        out = call.params[call.outs[0]]
                        written(out)
                        for r in call.rets:
                            written(r)
                        ident[out] = hit[1]
                        ident[result] = hit[1]
                        continue
                for pos in call.outs + call.mut:
                    written(call.params[pos])
                for r in call.rets:
                    written(r)
                if key is not None and result is not None:
                    content = ("call", len(seen), next(fresh))
                    ident[call.params[call.outs[0]]] = content
                    ident[result] = content
                    seen[key] = (result, content)
            elif type(a) is S.DelegateCall:
                args = list(a.args)
                k = n_out.get(a.delegate_index)
                for idx in args if k is None or not 0 < k <= len(args) else args[len(args) - k:]:
                    written(idx)
            elif type(a) is S.MoveCall:
                src = value_id(a.move_from)
                written(a.move_to)
                ident[a.move_to] = src
            elif type(a) is S.FreeCall:
                ident[a.value_index] = ("v", a.value_index, next(fresh))
    return reused


def _result_slot(mv: MethodValues, call: KernelCallInfo) -> int | None:
    """The slot holding a call's result after it ran: its stored return value, else its out argument."""
    out = call.params[call.outs[0]]
    if call.rets and call.rets[0] in call.stores:
        return call.rets[0]
    return out if not call.rets or call.rets[0] == out else None


def _call_key(mv: MethodValues, call: KernelCallInfo, value_id: Any) -> tuple | None:
    """What a call's result depends on, or None for calls never reused: impure kernels, in-place ones (mutated
    arguments, ATen's trailing ``_``), several outputs, outputs that are not one tensor."""
    if call.mut or len(call.outs) != 1 or getattr(call.entry.fn, "pure", True) is False:
        return None
    if call.name.split("::")[-1].split(".")[0].endswith("_"):  # in place (``copy_``): reads its out argument
        return None
    out = call.params[call.outs[0]]
    if mv.kinds[out] is not S.Tensor or len(call.rets) > 1:
        return None
    if call.rets and mv.kinds[call.rets[0]] is not S.Tensor:
        return None
    sp = mv.specs[out]
    layout = (str(sp.dtype), sp.dim_order, None if sp.dynamic else sp.sizes)
    shape_only = getattr(call.entry.fn, "shape_only", ())
    ins = tuple(None if pos == call.outs[0]
                else ("shape", str(mv.specs[idx].dtype), mv.specs[idx].sizes) if pos in shape_only
                and mv.kinds[idx] is S.Tensor and not mv.specs[idx].dynamic
                else value_id(idx) for pos, idx in enumerate(call.params))
    return (call.entry.fn, ins, layout)


def reuse_alias(src: Any) -> Any:
    """The kernel of a reused call whose out slot is bound to the earlier result itself (see :func:`alias_reuses`)."""
    return src


def alias_reuses(mv: MethodValues, plan: S.ExecutionPlan, analysis: InstructionAnalysis,
                 delegates: Sequence[Any] = ()) -> set[tuple[int, int]]:
    """The reused calls (``analysis.reused``) whose out slot can hold the earlier result itself instead of a copy:
    the out tensor is planned, only this call writes it, it is no method output, list item or state, no elided view
    overlaps its memory, every read of it comes later in the same chain, and from the call up to the last of those
    reads nothing writes the earlier result's planned memory (nor any tensor outside planned memory)."""
    if not analysis.reused:
        return set()
    kinds, specs = mv.kinds, mv.specs
    access = run_accesses(mv, plan, analysis, delegates)
    if access is None:  # pragma: no cover - common_calls skips methods with jumps
        return set()
    reads, writes = access
    writers, listed, never_written = written_by(writes, mv, plan)
    viewed_outs = {o for _, o in analysis.viewed_delegates.values()}
    viewed_ins = {i for i, _ in analysis.viewed_delegates.values()}  # viewed once per context: never rebound
    protected = set(plan.outputs) | listed | analysis.state_tensors | viewed_outs | viewed_ins | set(plan.inputs)

    found: set[tuple[int, int]] = set()
    for (ci, ii), src in analysis.reused.items():
        call = analysis.chains[ci][ii]
        out = call.params[call.outs[0]]
        s_out, s_src = specs.get(out), specs.get(src)
        if kinds[out] is not S.Tensor or out in protected or call.rets not in ([], [out]) or s_out is None \
                or not s_out.mem_id or s_src is None or not s_src.mem_id or s_src.constant is not None:
            continue
        if writers.get(out) != {(ci, ii)} or any(overlaps(s_out, o) for o in never_written):
            continue
        if intact_until_last_read((ci, ii), out, src, s_src, reads, writes, specs):
            found.add((ci, ii))
    return found


def run_accesses(mv: MethodValues, plan: S.ExecutionPlan, analysis: InstructionAnalysis, delegates: Sequence[Any] = (),
                 ) -> tuple[dict[tuple[int, int], set[int]], dict[tuple[int, int], set[int]]] | None:
    """Per operation that runs (after folding, fusing and reuse): the tensors it reads and writes (a delegate
    whose executor does not declare its outputs writes every argument); ``None`` for a method with jumps."""
    n_out = delegate_outputs(delegates)
    reads: dict[tuple[int, int], set[int]] = {}
    writes: dict[tuple[int, int], set[int]] = {}
    for ci, chain in enumerate(plan.chains):
        for ii, instr in enumerate(chain.instructions):
            a, call, at = instr.instr_args, analysis.chains[ci][ii], (ci, ii)
            r: set[int] = set()
            w: set[int] = set()
            if call is not None:
                if call.folded or at in analysis.fused_away:
                    continue
                if at in analysis.fused:
                    r.update(t for v in analysis.fused[at][1] if v >= 0 for t in mv.tensor_items(v))
                elif at in analysis.reused:
                    r.add(analysis.reused[at])
                else:
                    for pos, idx in enumerate(call.params):
                        if pos not in call.outs or pos in call.mut:
                            r.update(mv.tensor_items(idx))
                for pos in (*call.outs, *call.mut):
                    w.update(mv.tensor_items(call.params[pos]))
                for idx in call.rets:
                    w.update(mv.tensor_items(idx))
            elif type(a) is S.DelegateCall:
                if at in analysis.folded_delegates:
                    continue
                args, k = list(a.args), n_out.get(a.delegate_index)
                if at in analysis.viewed_delegates:
                    r.add(analysis.viewed_delegates[at][0])
                for j, idx in enumerate(args):
                    r.update(mv.tensor_items(idx))
                    if k is None or j >= len(args) - k:
                        w.update(mv.tensor_items(idx))
            elif type(a) is S.MoveCall:
                r.update(mv.tensor_items(a.move_from))
                w.update(mv.tensor_items(a.move_to))
            elif type(a) is S.JumpFalseCall:
                return None
            reads[at], writes[at] = r, w
    return reads, writes
