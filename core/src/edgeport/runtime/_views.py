"""Delegate calls that only reshape, run as views at load: a delegate whose executor says (``reshape_only(handle)``)
that its one output is its one tensor input's elements in C order (e.g. XNNPACK's lone static reshape, which the
partitioner leaves around a KV cache before the ``expand_copy`` of grouped-query attention) is not called; the
output's slot holds a view of the input's planned memory instead, made once per execution context.

Applied only where that view reads what the call would have written: the input is a statically planned,
C-ordered tensor whose slot no run rebinds (not a method input, not a constant); the output is a statically planned
tensor of the same dtype and size that only this call writes, no method output, no list item, and no elided view
(a planned tensor nothing writes) overlaps its memory; every read of the output comes after the call in the same
chain, and nothing writes the input's memory (or any unplanned tensor, which may be a view of anything) from the
call up to the last of those reads. Methods with jumps are left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgeport.program import schema as S
from edgeport.runtime._instructions import InstructionAnalysis
from edgeport.runtime._values import MethodValues

__all__ = ["bindable_outputs", "delegate_outputs", "intact_until_last_read", "overlaps", "reshape_delegates",
           "writers_with_views", "written_by"]


def overlaps(a: Any, b: Any) -> bool:
    """Two planned tensors (specs with ``mem_id``, ``offset``, ``nbytes``) share bytes."""
    return a.mem_id == b.mem_id and a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes


def intact_until_last_read(at: tuple[int, int], out: int, src: int, s_src: Any,
                           reads: dict[tuple[int, int], set[int]], writes: dict[tuple[int, int], set[int]],
                           specs: dict[int, Any]) -> bool:
    """Every read of ``out`` comes after instruction ``at`` in its chain, and from there up to the last of those
    reads nothing writes ``src``, memory overlapping ``s_src`` (its spec) or an unplanned tensor (a view of
    anything): ``out`` may then be ``src``'s memory instead of a copy of it."""
    ci, ii = at
    readers = [r_at for r_at, r in reads.items() if out in r and r_at != at]
    if not readers or any(c != ci or j <= ii for c, j in readers):
        return False
    last = max(j for _, j in readers)
    for j in range(ii + 1, last + 1):
        for t in writes.get((ci, j), ()):
            st = specs.get(t)
            if t == src or st is None or not st.mem_id or overlaps(st, s_src):
                return False
    return True


def _reshape_only(delegate: Any) -> bool:
    ask = getattr(delegate.executor, "reshape_only", None)
    if getattr(delegate, "kind", "") != "backend" or not callable(ask):
        return False
    try:
        return ask(delegate.handle) is True
    except Exception:  # noqa: BLE001 - an executor that cannot tell runs the call
        return False


def delegate_outputs(delegates: Sequence[Any]) -> dict[int, int]:
    """Delegate index -> how many trailing call arguments its executor declares outputs (``num_outputs``);
    delegates whose executor cannot tell are left out (every argument then counts as written)."""
    n_out: dict[int, int] = {}
    for di, d in enumerate(delegates):
        declared = getattr(d.executor, "num_outputs", None)
        if getattr(d, "kind", "") == "backend" and callable(declared):
            try:
                n_out[di] = int(declared(d.handle))
            except Exception:  # noqa: BLE001,S112 - unknown: every argument counts as written
                continue
    return n_out


def written_by(writes: dict[tuple[int, int], set[int]], mv: MethodValues,
               plan: S.ExecutionPlan) -> tuple[dict[int, set[tuple[int, int]]], set[int], list[Any]]:
    """From what each operation writes: the writers of each tensor, the tensors held in lists, and the specs of
    planned tensors nothing writes (elided views, whose memory others may overlap)."""
    writers: dict[int, set[tuple[int, int]]] = {}
    for at, w in writes.items():
        for t in w:
            writers.setdefault(t, set()).add(at)
    kinds, specs = mv.kinds, mv.specs
    listed = {j for i, k in enumerate(kinds) if k in (S.TensorList, S.OptionalTensorList) for j in mv.tensor_items(i)}
    never_written = [sp for i, sp in specs.items() if sp.mem_id and sp.nbytes and sp.constant is None
                     and i not in writers and i not in plan.inputs]
    return writers, listed, never_written


def writers_with_views(accesses: tuple[dict, dict], mv: MethodValues, plan: S.ExecutionPlan,
                       analysis: InstructionAnalysis) -> tuple[dict, dict[int, set[tuple[int, int]]], set[int], list[Any]]:
    """:func:`written_by` once reshape delegates run as views (:attr:`InstructionAnalysis.viewed_delegates`):
    their writes are none (the output is bound to the input's memory once), and of the elided views only those
    that matter -- read by an operation that runs, and not such a view's output. Returns the operations' writes
    without the views', the writers, the listed tensors and those elided views' specs."""
    reads, writes = accesses
    viewed = analysis.viewed_delegates
    view_outs = {o for _, o in viewed.values()}
    writes = {at: w for at, w in writes.items() if at not in viewed}
    writers, listed, never_written = written_by(writes, mv, plan)
    read_any = set().union(*reads.values()) if reads else set()
    return writes, writers, listed, [sp for sp in never_written if sp.index not in view_outs and sp.index in read_any]


def reshape_delegates(mv: MethodValues, plan: S.ExecutionPlan, analysis: InstructionAnalysis,
                      delegates: Sequence[Any]) -> dict[tuple[int, int], tuple[int, int]]:
    """``(chain, instruction) -> (input value, output value)`` of the delegate calls run as views."""
    if any(type(i.instr_args) is S.JumpFalseCall for c in plan.chains for i in c.instructions):
        return {}
    reshapes = {di for di, d in enumerate(delegates) if _reshape_only(d)}
    if not reshapes:
        return {}
    kinds, specs = mv.kinds, mv.specs
    n_out = delegate_outputs(delegates)
    # per instruction: the tensors it reads and writes
    reads: dict[tuple[int, int], set[int]] = {}
    writes: dict[tuple[int, int], set[int]] = {}
    for ci, chain in enumerate(plan.chains):
        for ii, instr in enumerate(chain.instructions):
            a, call = instr.instr_args, analysis.chains[ci][ii]
            r: set[int] = set()
            w: set[int] = set()
            if call is not None:
                if call.folded:
                    continue
                for pos, idx in enumerate(call.params):
                    (w if pos in call.outs else r).update(mv.tensor_items(idx))
                    if pos in call.mut:
                        w.update(mv.tensor_items(idx))
                for idx in call.rets:
                    w.update(mv.tensor_items(idx))
            elif type(a) is S.DelegateCall:
                if (ci, ii) in analysis.folded_delegates:
                    continue
                n = n_out.get(a.delegate_index)
                args = list(a.args)
                for k, idx in enumerate(args):
                    r.update(mv.tensor_items(idx))
                    if n is None or k >= len(args) - n:  # unknown split: every argument may be written
                        w.update(mv.tensor_items(idx))
            elif type(a) is S.MoveCall:
                r.update(mv.tensor_items(a.move_from))
                w.update(mv.tensor_items(a.move_to))
            reads[(ci, ii)], writes[(ci, ii)] = r, w
    writers, listed, never_written = written_by(writes, mv, plan)
    inputs, outputs = set(plan.inputs), set(plan.outputs)

    def static_planned(i: int) -> bool:
        sp = specs.get(i) if kinds[i] is S.Tensor else None
        return (sp is not None and sp.mem_id != 0 and not sp.dynamic and sp.constant is None and sp.contiguous_order
                and sp.nbytes > 0 and i not in analysis.rw and i not in inputs)

    found: dict[tuple[int, int], tuple[int, int]] = {}
    for ci, chain in enumerate(plan.chains):
        for ii, instr in enumerate(chain.instructions):
            a = instr.instr_args
            if type(a) is not S.DelegateCall or a.delegate_index not in reshapes or (ci, ii) not in reads:
                continue
            args = list(a.args)
            if n_out.get(a.delegate_index) != 1:
                continue
            out = args[-1]
            tensors = [i for i in args[:-1] if kinds[i] is S.Tensor]
            if len(tensors) != 1 or kinds[out] is not S.Tensor:
                continue
            src = tensors[0]
            if not (static_planned(src) and static_planned(out)) or out in outputs or out in listed:
                continue
            s_in, s_out = specs[src], specs[out]
            if s_in.dtype != s_out.dtype or s_in.nbytes != s_out.nbytes or writers.get(out) != {(ci, ii)}:
                continue
            if any(overlaps(s_out, o) for o in never_written):
                continue  # an elided view reads the output's memory
            if intact_until_last_read((ci, ii), out, src, s_in, reads, writes, specs):
                found[(ci, ii)] = (src, out)
    return found


def bindable_outputs(mv: MethodValues, plan: S.ExecutionPlan, analysis: InstructionAnalysis,
                     delegates: Sequence[Any], accesses: tuple[dict, dict] | None) -> set[int]:
    """Dynamically planned delegate outputs whose slot may hold the array the executor returns (when it owns its
    memory and fits the planned bound) instead of a copy of it in planned memory: the output of a delegate called
    once in the method, written by that call alone, read only after it in the same chain, no list item, method
    input or state, and no elided view (a planned tensor nothing writes that something reads) overlaps its planned
    memory. Nothing then reads that memory under another name, and a kernel writing the value would rebind its
    slot. ``accesses`` is :func:`edgeport.runtime._cse.run_accesses`'s answer (``None``: a method with jumps)."""
    if accesses is None:
        return set()
    reads = accesses[0]
    kinds, specs = mv.kinds, mv.specs
    viewed = analysis.viewed_delegates
    writes, writers, listed, never_written = writers_with_views(accesses, mv, plan, analysis)
    n_out = delegate_outputs(delegates)
    calls: dict[int, int] = {}
    for chain in plan.chains:
        for instr in chain.instructions:
            if type(instr.instr_args) is S.DelegateCall:
                di = instr.instr_args.delegate_index
                calls[di] = calls.get(di, 0) + 1
    protected = listed | set(plan.inputs) | analysis.state_tensors
    found: set[int] = set()
    for (ci, ii), w in writes.items():
        a = plan.chains[ci].instructions[ii].instr_args
        if type(a) is not S.DelegateCall or calls[a.delegate_index] != 1 or a.delegate_index not in n_out \
                or (ci, ii) in viewed:
            continue
        args = list(a.args)
        for o in args[len(args) - n_out[a.delegate_index]:]:
            sp = specs.get(o) if kinds[o] is S.Tensor else None
            if sp is None or not sp.dynamic or not sp.mem_id or sp.constant is not None or o in protected \
                    or writers.get(o) != {(ci, ii)} or any(overlaps(sp, x) for x in never_written):
                continue
            if all(c == ci and j > ii for (c, j), r in reads.items() if o in r and (c, j) != (ci, ii)):
                found.add(o)
    return found
