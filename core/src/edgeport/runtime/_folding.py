"""Constant folding at load: kernel calls whose inputs are all constants run once, and their outputs become
constants (typically ``permute_copy`` and ``expand_copy`` of weights). So do calls of delegates whose executor
declares itself ``pure`` (no state, the same outputs for the same inputs) and says how many outputs the delegate
has: e.g. a transformer's rotary-embedding tables and attention masks, computed from constant positions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edgeport.program import schema as S
from edgeport.runtime._instructions import InstructionAnalysis, KernelCallInfo
from edgeport.runtime._values import MethodValues, TensorSpec, empty_view, logical_view

__all__ = ["FOLD_MAX_BYTES", "FOLD_TOTAL_BYTES", "fold_constants"]

FOLD_MAX_BYTES = 64 << 20  # per folded output
FOLD_TOTAL_BYTES = 1 << 30


def fold_constants(mv: MethodValues, plan: S.ExecutionPlan, analysis: InstructionAnalysis,
                   template: list[Any], delegates: Sequence[Any] = ()) -> int:
    """Fold what can be folded; returns how many calls were folded.

    A folded kernel call is marked ``folded`` (it leaves the instruction list), a folded delegate call is added to
    ``analysis.folded_delegates``; the outputs become the ``constant`` of their specs and their slots in
    ``template``. A call is folded only when it is pure (no ``pure = False`` on the kernel; ``pure = True`` on a
    delegate's executor, which must also report ``num_outputs``), writes static planned tensors that no other
    instruction writes and that no never-written planned tensor (an alias ExecuTorch created by eliding a view)
    overlaps, and its outputs are not method outputs. ``delegates``: the method's initialised delegates.
    """
    specs = mv.specs
    if any(type(i.instr_args) is S.JumpFalseCall for c in plan.chains for i in c.instructions):
        return 0
    write_count: dict[int, int] = {}
    for call in analysis.kernel_calls():
        for pos in call.outs:
            for t in mv.tensor_items(call.params[pos]):
                write_count[t] = write_count.get(t, 0) + 1
    pure = _pure_delegate_outputs(plan, delegates)
    for ci, chain in enumerate(plan.chains):
        for ii, instr in enumerate(chain.instructions):
            if type(instr.instr_args) is S.DelegateCall:
                args = instr.instr_args.args
                n_out = pure.get((ci, ii))
                if n_out is None:
                    for idx in args:
                        write_count[idx] = write_count.get(idx, 0) + 2  # never fold into unknown delegate args
                    continue
                for k, idx in enumerate(args):  # its outputs are written once; its inputs only read (listed,
                    # so that they are never taken for aliases of elided views)
                    for t in mv.tensor_items(idx) or [idx]:
                        write_count[t] = write_count.get(t, 0) + (k >= len(args) - n_out)
    protected = set(plan.inputs) | set(plan.outputs) | analysis.state_tensors
    for o in plan.outputs:
        protected.update(mv.tensor_items(o))
    alias_source = _alias_sources(mv, plan, analysis, write_count)
    read_through_alias = set().union(*alias_source.values()) if alias_source else set()
    total = 0
    folded = 0

    def foldable(t: int) -> bool:
        return _foldable_output(specs[t], t, protected, write_count, read_through_alias, alias_source, specs)

    for ci, chain in enumerate(plan.chains):
        for ii, instr in enumerate(chain.instructions):
            call = analysis.chains[ci][ii]
            if call is None:
                if (ci, ii) in pure:
                    size = _fold_delegate(mv, instr.instr_args, pure[(ci, ii)], delegates, analysis.rw, template,
                                          foldable, FOLD_TOTAL_BYTES - total)
                    if size is not None:
                        analysis.folded_delegates.add((ci, ii))
                        total += size
                        folded += 1
                continue
            size = _fold_kernel(mv, call, analysis.rw, template, foldable, alias_source, FOLD_TOTAL_BYTES - total)
            if size is not None:
                total += size
                folded += 1
    return folded


def _pure_delegate_outputs(plan: S.ExecutionPlan, delegates: Sequence[Any]) -> dict[tuple[int, int], int]:
    """``(chain, instruction) -> number of outputs`` of the calls of delegates whose executor is ``pure``."""
    counts: dict[int, int] = {}
    for di, d in enumerate(delegates):
        declared = getattr(d.executor, "num_outputs", None)
        if d.kind != "backend" or getattr(d.executor, "pure", False) is not True or not callable(declared):
            continue
        try:
            counts[di] = int(declared(d.handle))
        except Exception:  # noqa: BLE001 - the compiler reports it when it builds the call
            continue
    found = {}
    for ci, chain in enumerate(plan.chains):
        for ii, instr in enumerate(chain.instructions):
            a = instr.instr_args
            if type(a) is S.DelegateCall and a.delegate_index in counts and 0 < counts[a.delegate_index] <= len(a.args):
                found[(ci, ii)] = counts[a.delegate_index]
    return found


def _fold_delegate(mv: MethodValues, a: S.DelegateCall, n_out: int, delegates: Sequence[Any], rw: set[int],
                   template: list[Any], foldable: Any, room: int) -> int | None:
    """Run a pure delegate whose inputs are all constants; its outputs become constants. Bytes folded, or None."""
    kinds, specs = mv.kinds, mv.specs
    args = list(a.args)
    ins, outs = args[:len(args) - n_out], args[len(args) - n_out:]
    values: list[Any] = []
    for idx in ins:
        if idx in rw or kinds[idx] in (S.TensorList, S.OptionalTensorList, S.IntList):
            return None
        if kinds[idx] is S.Tensor:
            if specs[idx].constant is None:
                return None
            values.append(specs[idx].constant)
        else:
            values.append(template[idx])
    if not all(kinds[o] is S.Tensor and foldable(o) for o in outs):
        return None
    size = sum(specs[o].nbytes for o in outs)
    if size > room:
        return None
    d = delegates[a.delegate_index]
    try:
        with np.errstate(all="ignore"):
            results = d.executor.execute(d.handle, values)
    except Exception:  # noqa: BLE001 - leave it to run (and report) at run time
        return None
    if not isinstance(results, (list, tuple)) or len(results) != len(outs):
        return None
    arrays = []
    for o, r in zip(outs, results):
        sp = specs[o]
        if type(r) is not np.ndarray or r.shape != tuple(sp.sizes) or r.dtype != sp.dtype:
            return None
        arr = empty_view(sp)
        np.copyto(arr, r)
        arr.flags.writeable = False
        arrays.append(arr)
    for o, arr in zip(outs, arrays):
        specs[o].constant = arr
        template[o] = arr
    return size


def _fold_kernel(mv: MethodValues, call: KernelCallInfo, rw: set[int], template: list[Any], foldable: Any,
                 alias_source: dict[int, set[int]], room: int) -> int | None:
    """Run a pure kernel call whose inputs are all constants; its outputs become constants. Bytes, or None."""
    specs = mv.specs
    if call.stores or call.mut or not call.outs or getattr(call.entry.fn, "pure", True) is False:
        return None
    out_tensors = [t for pos in call.outs for t in mv.tensor_items(call.params[pos])]
    if not out_tensors or not all(foldable(t) for t in out_tensors):
        return None
    args = _constant_args(mv, call, rw, template)
    if args is None:
        return None
    size = sum(specs[t].nbytes for t in out_tensors)
    if size > room:
        return None
    try:
        with np.errstate(all="ignore"):
            call.entry.fn(*args)
    except Exception:  # noqa: BLE001 - leave it to run (and report) at run time
        return None
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
    call.folded = True
    return size


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
