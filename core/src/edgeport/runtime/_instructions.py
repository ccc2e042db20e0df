"""Load-time analysis of a method's instructions.

Resolves each operator to its kernel (and the number of arguments the kernel takes), checks every kernel call
against it, finds each call's out arguments, and works out which value slots a run rewrites (``rw``: their
object changes, so lists over them are rebuilt at run time), which slots something reads, and which planned
tensors carry state from one run to the next.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from edgeport.errors import UnsupportedOperatorError
from edgeport.program import schema as S
from edgeport.runtime._values import MethodValues

__all__ = ["InstructionAnalysis", "KernelCallInfo", "analyze_instructions", "op_name"]


def op_name(op: S.Operator) -> str:
    return f"{op.name}.{op.overload}" if op.overload else op.name


def kernel_arity(fn: Callable[..., Any], op: str) -> int:
    """How many positional arguments a kernel takes (its ``num_args`` attribute, else its signature)."""
    n = getattr(fn, "num_args", None)
    if isinstance(n, int):
        return n
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise UnsupportedOperatorError(
            f"kernel for {op} cannot be introspected; set its num_args attribute") from None
    count = 0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            count += 1
        elif p.kind == p.VAR_POSITIONAL:
            raise UnsupportedOperatorError(f"kernel for {op} takes *args; set its num_args attribute")
    return count


@dataclass(eq=False)
class KernelCallInfo:
    """One kernel call: its kernel, its arguments, and what must be stored after the call."""

    name: str
    entry: Any  # the registry's KernelEntry (``fn``, ``library``)
    params: list[int]  # value indices of the kernel's arguments
    rets: list[int]  # value index of the returned value (at most one)
    outs: list[int]  # positions of the out arguments among ``params``
    stores: list[int]  # returned values to store into their slots
    mut: list[int]  # positions of arguments whose slots take the result (mutated in place or rebuilt)
    folded: bool = False  # computed once at load (constant folding); not run


@dataclass
class InstructionAnalysis:
    #: per operator: (name, kernel entry, arity)
    resolved_ops: list[tuple[str, Any, int]]
    #: per chain, per instruction: the kernel call's info, ``None`` for other instructions
    chains: list[list[KernelCallInfo | None]]
    rw: set[int]
    read: set[int]
    state_tensors: set[int]
    #: (chain, instruction) of delegate calls computed once at load (constant folding); not run
    folded_delegates: set[tuple[int, int]] = field(default_factory=set)
    #: (chain, instruction) of kernel calls whose result an earlier identical call left in a slot -> that slot
    reused: dict[tuple[int, int], int] = field(default_factory=dict)
    #: (chain, instruction) of a ``where`` standing for a fused group (runtime._fuse) -> (op, argument values)
    fused: dict[tuple[int, int], tuple[Any, list[int]]] = field(default_factory=dict)
    #: reused calls whose out slot is bound to the earlier result instead of a copy of it (runtime._cse)
    aliased: set[tuple[int, int]] = field(default_factory=set)
    #: (chain, instruction) of the other calls of fused groups (not run)
    fused_away: set[tuple[int, int]] = field(default_factory=set)
    #: (chain, instruction) of delegate calls that only reshape, run as views (runtime._views) -> (input, output)
    viewed_delegates: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    #: (chain, instruction) of ``expand_copy`` calls whose result persists across runs (runtime._kvexpand)
    persistent: dict[tuple[int, int], Any] = field(default_factory=dict)

    def kernel_calls(self) -> Iterator[KernelCallInfo]:
        for infos in self.chains:
            for info in infos:
                if info is not None:
                    yield info


def analyze_instructions(mv: MethodValues, plan: S.ExecutionPlan, kernels: Any) -> InstructionAnalysis:
    """Resolve and check every instruction of ``plan``; raises ``UnsupportedOperatorError`` listing every op
    without a kernel."""
    kinds, specs = mv.kinds, mv.specs
    resolved_ops: list[tuple[str, Any, int]] = []
    for op in plan.operators:
        name = op_name(op)
        entry = kernels.get(name)
        if entry is None and not op.overload:
            entry = kernels.get(f"{op.name}.default")
        resolved_ops.append((name, entry, -1 if entry is None else kernel_arity(entry.fn, name)))

    rw: set[int] = set()  # slots whose object changes during a run
    for i in plan.inputs:
        spec = specs.get(i)
        if spec is None or spec.dynamic or spec.mem_id == 0:
            rw.add(i)

    def needs_store(idx: int) -> bool:
        if kinds[idx] is S.Tensor:
            sp = specs[idx]
            return sp.dynamic or sp.mem_id == 0
        return True

    chains: list[list[KernelCallInfo | None]] = []
    missing: dict[str, int] = {}
    for ci, chain in enumerate(plan.chains):
        infos: list[KernelCallInfo | None] = []
        for ii, instr in enumerate(chain.instructions):
            a = instr.instr_args
            k = type(a)
            infos.append(None)
            if k is S.DelegateCall:
                for idx in a.args:
                    sp = specs.get(idx)
                    if sp is not None and (sp.dynamic or sp.mem_id == 0) and sp.constant is None:
                        rw.add(idx)
                continue
            if k is S.MoveCall:
                rw.add(a.move_to)
                continue
            if k is not S.KernelCall:
                continue
            name, entry, arity = resolved_ops[a.op_index]
            if entry is None:
                missing.setdefault(name, ii)
                continue
            at = f"chains[{ci}].instructions[{ii}]"
            args = list(a.args)
            if len(args) < arity:
                raise mv.err(f"{at} ({name}): {len(args)} arguments, but its kernel takes {arity}")
            if len(args) > arity + 1:
                raise mv.err(f"{at} ({name}): {len(args)} arguments, but its kernel takes {arity} "
                             "and the op returns at most one value")
            params, rets = args[:arity], args[arity:]
            outs = _out_positions(mv, params, rets)
            for pos in outs:
                for t_idx in mv.tensor_items(params[pos]):
                    if specs[t_idx].constant is not None:
                        raise mv.err(f"{at} ({name}): argument {pos} writes into constant values[{t_idx}]")
            stores = []
            for r in rets:
                if kinds[r] is S.TensorList:
                    items = [x for x in mv.items(r) if needs_store(x) or x not in params]
                    if items:
                        rw.update(mv.items(r))
                        rw.add(r)
                        stores.append(r)
                elif kinds[r] is S.Tensor:
                    if needs_store(r) or r not in params:
                        rw.add(r)
                        stores.append(r)
                elif kinds[r] is not S.Null:
                    rw.add(r)
                    stores.append(r)
            mut = []
            for pos in getattr(entry.fn, "mutates", ()):
                mut.append(pos)
                rw.update(mv.tensor_items(params[pos]))
            if not rets:
                for pos in outs:
                    idx = params[pos]
                    if kinds[idx] is S.TensorList and any(needs_store(x) for x in mv.items(idx)):
                        rw.update(mv.items(idx))
                        mut.append(pos)
            infos[-1] = KernelCallInfo(name, entry, params, rets, outs, stores, mut)
        chains.append(infos)
    if missing:
        listing = ", ".join(f"{n} (instruction {i})" for n, i in sorted(missing.items()))
        raise UnsupportedOperatorError(
            f"{mv.where}: no kernel registered for {listing}; install a kernel library plugin that "
            "provides it or lower that part of the model to a backend")
    return InstructionAnalysis(resolved_ops, chains, rw, _read_values(mv, plan, chains),
                               _state_tensors(mv, plan, chains))


def _out_positions(mv: MethodValues, params: list[int], rets: list[int]) -> list[int]:
    """Positions of the out arguments among ``params`` (ATen puts them last)."""
    kinds = mv.kinds
    targets: set[int] = set()
    for r in rets:
        targets.add(r)
        if kinds[r] is S.TensorList:
            targets.update(mv.items(r))
    outs = [p for p, idx in enumerate(params) if idx in targets and kinds[idx] in (S.Tensor, S.TensorList)]
    if not outs and params and kinds[params[-1]] in (S.Tensor, S.TensorList) and (
            not rets or kinds[rets[0]] in (S.Tensor, S.TensorList)):
        outs.append(len(params) - 1)  # ATen out variants take their out argument(s) last
    return outs


def _state_tensors(mv: MethodValues, plan: S.ExecutionPlan, chains: list[list[KernelCallInfo | None]]) -> set[int]:
    """Planned tensors read before an instruction writes them (mutable buffers whose value carries from one
    run to the next, e.g. written back with ``aten::copy_``)."""
    calls = [info for infos in chains for info in infos if info is not None]
    all_written: set[int] = set()
    for c in calls:
        for pos in c.outs:
            all_written.update(mv.tensor_items(c.params[pos]))
    inputs = set(plan.inputs)
    written: set[int] = set()
    state: set[int] = set()
    for c in calls:
        for pos, idx in enumerate(c.params):
            if pos in c.outs:
                continue
            for t in mv.tensor_items(idx):
                if t in all_written and t not in written and t not in inputs and mv.specs[t].mem_id:
                    state.add(t)
        for pos in c.outs:
            written.update(mv.tensor_items(c.params[pos]))
    return state


def _read_values(mv: MethodValues, plan: S.ExecutionPlan, chains: list[list[KernelCallInfo | None]]) -> set[int]:
    """Values some instruction reads (or the method returns); an out argument outside it is never used."""
    read: set[int] = set()

    def mark(idx: int) -> None:
        read.add(idx)
        if mv.kinds[idx] in (S.TensorList, S.OptionalTensorList, S.IntList):
            read.update(j for j in mv.items(idx) if j >= 0)

    for idx in plan.outputs:
        mark(idx)
    for ci, chain in enumerate(plan.chains):
        for ii, instr in enumerate(chain.instructions):
            a = instr.instr_args
            k = type(a)
            info = chains[ci][ii]
            if info is not None:
                for pos, idx in enumerate(info.params):
                    if pos not in info.outs or pos in info.mut:
                        mark(idx)
            elif k is S.DelegateCall:
                for idx in a.args:
                    mark(idx)
            elif k is S.MoveCall:
                mark(a.move_from)
            elif k is S.JumpFalseCall:
                mark(a.cond_value_index)
    return read
