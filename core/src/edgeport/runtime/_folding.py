"""Constant folding at load: kernel calls whose inputs are all constants run once, and their outputs become
constants (typically ``permute_copy`` and ``expand_copy`` of weights)."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeport.program import schema as S
from edgeport.runtime._instructions import InstructionAnalysis, KernelCallInfo
from edgeport.runtime._values import MethodValues, TensorSpec, empty_view, logical_view

__all__ = ["FOLD_MAX_BYTES", "FOLD_TOTAL_BYTES", "fold_constants"]

FOLD_MAX_BYTES = 64 << 20  # per folded output
FOLD_TOTAL_BYTES = 1 << 30


def fold_constants(mv: MethodValues, plan: S.ExecutionPlan, analysis: InstructionAnalysis,
                   template: list[Any]) -> int:
    """Fold what can be folded; returns how many calls were folded.

    A folded call is marked ``folded`` (it leaves the instruction list); its outputs become the ``constant`` of
    their specs and their slots in ``template``. A call is folded only when it is pure (no ``pure = False`` on
    the kernel), writes static planned tensors that no other instruction writes and that no never-written
    planned tensor (an alias ExecuTorch created by eliding a view) overlaps, and its outputs are not method
    outputs.
    """
    specs = mv.specs
    if any(type(i.instr_args) is S.JumpFalseCall for c in plan.chains for i in c.instructions):
        return 0
    write_count: dict[int, int] = {}
    for call in analysis.kernel_calls():
        for pos in call.outs:
            for t in mv.tensor_items(call.params[pos]):
                write_count[t] = write_count.get(t, 0) + 1
    for chain in plan.chains:
        for instr in chain.instructions:
            if type(instr.instr_args) is S.DelegateCall:
                for idx in instr.instr_args.args:
                    write_count[idx] = write_count.get(idx, 0) + 2  # never fold into delegate args
    protected = set(plan.inputs) | set(plan.outputs) | analysis.state_tensors
    for o in plan.outputs:
        protected.update(mv.tensor_items(o))
    alias_source = _alias_sources(mv, plan, analysis, write_count)
    read_through_alias = set().union(*alias_source.values()) if alias_source else set()
    total = 0
    folded = 0
    for call in analysis.kernel_calls():
        if call.stores or call.mut or not call.outs or getattr(call.entry.fn, "pure", True) is False:
            continue
        out_tensors = [t for pos in call.outs for t in mv.tensor_items(call.params[pos])]
        if not out_tensors:
            continue
        if not all(_foldable_output(specs[t], t, protected, write_count, read_through_alias, alias_source, specs)
                   for t in out_tensors):
            continue
        args = _constant_args(mv, call, analysis.rw, template)
        if args is None:
            continue
        size = sum(specs[t].nbytes for t in out_tensors)
        if total + size > FOLD_TOTAL_BYTES:
            continue
        try:
            with np.errstate(all="ignore"):
                call.entry.fn(*args)
        except Exception:  # noqa: BLE001 - leave it to run (and report) at run time
            continue
        for pos in call.outs:
            arrs = args[pos] if isinstance(args[pos], list) else [args[pos]]
            for t, arr in zip(mv.tensor_items(call.params[pos]), arrs):
                arr.flags.writeable = False
                specs[t].constant = arr
                template[t] = arr
                for a, src in alias_source.items():
                    if src == {t}:  # an elided view of the folded tensor: a view of the constant
                        view = _alias_view(specs[t], specs[a])
                        specs[a].constant = view
                        template[a] = view
        total += size
        folded += 1
        call.folded = True
    return folded


def _foldable_output(sp: TensorSpec, t: int, protected: set[int], write_count: dict[int, int],
                     read_through_alias: set[int], alias_source: dict[int, set[int]],
                     specs: dict[int, TensorSpec]) -> bool:
    if (sp.dynamic or not sp.mem_id or t in protected or write_count.get(t, 0) != 1
            or sp.nbytes > FOLD_MAX_BYTES):
        return False
    return t not in read_through_alias or _aliases_foldable(t, alias_source, specs)


def _constant_args(mv: MethodValues, call: KernelCallInfo, rw: set[int], template: list[Any]) -> list[Any] | None:
    """The arguments of ``call`` when all its inputs are constants (fresh arrays for its outputs), else None."""
    kinds, specs = mv.kinds, mv.specs
    args: list[Any] = []
    for pos, idx in enumerate(call.params):
        k = kinds[idx]
        if pos in call.outs:
            if k is S.TensorList:
                args.append([empty_view(specs[j]) for j in mv.items(idx)])
            else:
                args.append(empty_view(specs[idx]))
            continue
        if idx in rw:
            return None
        if k is S.Tensor:
            if specs[idx].constant is None:
                return None
            args.append(specs[idx].constant)
        elif k in (S.TensorList, S.OptionalTensorList):
            items = list(mv.items(idx))
            if any(j >= 0 and (j in rw or kinds[j] is S.Tensor and specs[j].constant is None) for j in items):
                return None
            args.append([None if j < 0 else (specs[j].constant if kinds[j] is S.Tensor else None) for j in items])
        elif k is S.IntList and any(j in rw for j in mv.items(idx)):
            return None
        else:
            args.append(template[idx])
    return args


def _alias_sources(mv: MethodValues, plan: S.ExecutionPlan, analysis: InstructionAnalysis,
                   write_count: dict[int, int]) -> dict[int, set[int]]:
    """For each alias (a planned tensor no instruction writes: a view ExecuTorch elided), the tensors whose data
    it reads: those last written over its memory before its first use."""
    specs = mv.specs
    aliases = [sp for i, sp in specs.items()
               if sp.mem_id and i not in write_count and i not in plan.inputs and sp.nbytes]
    alias_source: dict[int, set[int]] = {}
    if not aliases:
        return alias_source
    order: list[tuple[list[int], list[int]]] = []  # per instruction: (read tensors, written tensors)
    for infos in analysis.chains:
        for call in infos:
            if call is None:
                order.append(([], []))
                continue
            written = [t for pos in call.outs for t in mv.tensor_items(call.params[pos])]
            read = [t for pos, idx in enumerate(call.params) if pos not in call.outs for t in mv.tensor_items(idx)]
            order.append((read, written))
    alias_ids = {sp.index for sp in aliases}
    for pos, (read, _) in enumerate(order):
        for a in read:
            if a not in alias_ids or a in alias_source:
                continue
            sa = specs[a]
            lo, hi = sa.offset, sa.offset + sa.nbytes
            src: set[int] = set()
            for back in range(pos - 1, -1, -1):
                hits = [t for t in order[back][1] if specs[t].mem_id == sa.mem_id
                        and specs[t].offset < hi and lo < specs[t].offset + specs[t].nbytes]
                if hits:
                    src.update(hits)
                    break
            alias_source[a] = src
    return alias_source


def _aliases_foldable(t: int, alias_source: dict[int, set[int]], specs: dict[int, TensorSpec]) -> bool:
    st = specs[t]
    for a, src in alias_source.items():
        if t not in src:
            continue
        sa = specs[a]
        if src != {t} or sa.offset < st.offset or sa.offset + sa.nbytes > st.offset + st.nbytes:
            return False
    return True


def _alias_view(st: TensorSpec, sa: TensorSpec) -> np.ndarray:
    arr = st.constant
    phys = arr.transpose(list(st.dim_order)) if not st.contiguous_order else arr  # memory order
    raw = np.ascontiguousarray(phys).reshape(-1).view(np.uint8)
    start = sa.offset - st.offset
    view = logical_view(raw[start:start + sa.nbytes], sa)
    view.flags.writeable = False
    return view
