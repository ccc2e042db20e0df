"""Compile a method's instructions into the operation lists the executor walks.

Each instruction becomes a ``(function, argument getter, post)`` triple: ``function`` is the kernel (or a
closure running a delegate, a move, a free), ``get`` an :func:`operator.itemgetter` over the value slots and
``post``, where a result must be stored (dynamic shapes, scalars, lists, delegates), ``post(vals, result)``.
A list value over slots that change during a run is rebuilt by a resolver operation just before its use.
``JumpFalseCall`` becomes ``(JUMP, condition slot, destination op index)``. A delegate call whose executor takes
``out=`` gets the planned arrays of its outputs to write into, except where they could overlap its inputs; a
dynamically planned output that nothing reads under another name takes the executor's own array
(:func:`._views.bindable_outputs`) instead of a copy of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import is_, itemgetter
from typing import Any

import numpy as np

from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport.program import schema as S
from edgeport.runtime._cse import reuse_alias, reuse_result, run_accesses
from edgeport.runtime._delegates import Delegate
from edgeport.runtime._fuse import FILL
from edgeport.runtime._instructions import InstructionAnalysis
from edgeport.runtime._kvexpand import expand_op, tracked_index_put
from edgeport.runtime._memory import MemoryLayout
from edgeport.runtime._values import MethodValues
from edgeport.runtime._views import bindable_outputs
from edgeport.runtime.kernel_utils import resize

__all__ = ["JUMP", "CompiledChain", "ChainCompiler"]

#: The function of a jump operation (the executor tests it by identity).
JUMP = object()
_nd = np.ndarray

#: (operations, whether the chain jumps, a label per operation naming its instruction)
CompiledChain = tuple[list[tuple], bool, list[str]]


def _vals_only(vals: list) -> tuple:
    return (vals,)


def _no_args(vals: list) -> tuple:
    return ()


def getter(indices: Sequence[int]) -> Callable[[list], tuple]:
    """A function returning the tuple of ``vals[i]`` for ``i`` in ``indices``."""
    if len(indices) == 0:
        return _no_args
    if len(indices) == 1:
        i = indices[0]
        return lambda vals: (vals[i],)
    return itemgetter(*indices)


class ChainCompiler:
    """Compiles the chains of one analysed method (after constant folding, whose calls it leaves out)."""

    def __init__(self, mv: MethodValues, plan: S.ExecutionPlan, analysis: InstructionAnalysis,
                 layout: MemoryLayout, delegates: list[Delegate]) -> None:
        self.mv, self.plan, self.analysis, self.layout, self.delegates = mv, plan, analysis, layout, delegates
        #: tensors some delegate call reads / writes (filled by :meth:`compile`)
        self.delegate_inputs: set[int] = set()
        self.delegate_outputs: set[int] = set()
        #: list values over slots a run rewrites: value index -> (list kind, items)
        self.dynamic_lists: dict[int, tuple[str, list[int]]] = {}
        self.output_values = set(plan.outputs)
        #: ``index_put_`` calls on caches with persistent expands (runtime._kvexpand) -> their trackers' slots
        self.tracked: dict[tuple[int, int], list[int]] = {}
        for at, pe in analysis.persistent.items():
            for w in pe.writers:
                self.tracked.setdefault(w, []).append(layout.tracker_slot[at])
        for i, ev in enumerate(mv.values):
            k = mv.kinds[i]
            if k in (S.IntList, S.TensorList, S.OptionalTensorList):
                items = list(ev.val.items)
                if any(j in analysis.rw for j in items if j >= 0):
                    self.dynamic_lists[i] = (k.__name__, items)

    def compile(self) -> list[CompiledChain]:
        self.kernel_ops = 0
        #: dynamic delegate outputs bound as the executor's own arrays
        self.bindable = bindable_outputs(self.mv, self.plan, self.analysis, self.delegates,
                                         run_accesses(self.mv, self.plan, self.analysis, self.delegates))
        return [self._compile_chain(ci, chain) for ci, chain in enumerate(self.plan.chains)]

    def _compile_chain(self, ci: int, chain: S.Chain) -> CompiledChain:
        mv, layout, read, infos = self.mv, self.layout, self.analysis.read, self.analysis.chains[ci]
        ops: list[tuple] = []
        labels: list[str] = []
        has_jump = False
        index_map: list[int] = []  # instruction index -> first op index (resolvers come first)
        for ii, instr in enumerate(chain.instructions):
            index_map.append(len(ops))
            a = instr.instr_args
            call = infos[ii]
            label = f"chains[{ci}].instructions[{ii}]"
            k = type(a)
            if call is not None:
                if call.folded or (ci, ii) in self.analysis.fused_away:
                    continue
                label += f" ({call.name})"
                params, outs = call.params, call.outs
                arg_slots = list(params)
                optional = getattr(call.entry.fn, "optional_outs", ())
                for pos in outs:
                    idx = params[pos]
                    items = mv.tensor_items(idx)
                    if pos in optional and idx not in read and items and all(t not in read for t in items):
                        arg_slots[pos] = layout.none_slot
                    elif idx in layout.capacity:
                        arg_slots[pos] = layout.capacity[idx]
                    elif idx in layout.tensorlist_capacity:
                        arg_slots[pos] = layout.tensorlist_capacity[idx]
                inline: dict[int, int] = {}  # argument position -> list value built by the argument getter
                for pos, idx in enumerate(params):
                    if idx in self.dynamic_lists and pos not in outs:
                        if pos in call.mut or idx in self.output_values:  # its slot must hold the list
                            ops.append((self._list_resolver(idx), _vals_only, None))
                            labels.append(label)
                        else:
                            inline[pos] = idx
                post = self._kernel_post(call.name, params, call.rets, call.stores, call.mut, outs)
                pe = self.analysis.persistent.get((ci, ii))
                if pe is not None:
                    ops.append((expand_op(pe, call.entry.fn),
                                getter([*arg_slots, layout.tracker_slot[(ci, ii)]]), post))
                    labels.append(label)
                    self.kernel_ops += 1
                    continue
                fn = call.entry.fn
                if (ci, ii) in self.tracked:
                    arg_slots += self.tracked[(ci, ii)]
                    fn = tracked_index_put
                fused = self.analysis.fused.get((ci, ii))
                if fused is not None and arg_slots[outs[0]] != layout.none_slot:
                    fn, values = fused
                    slots = [layout.none_slot if v == FILL else v for v in values] + [arg_slots[outs[0]]]
                    ops.append((fn, getter(slots), post))
                    labels.append(label)
                    self.kernel_ops += 1
                    continue
                source = self.analysis.reused.get((ci, ii))
                if source is not None and (ci, ii) in self.analysis.aliased:
                    # the earlier identical call's result itself is this call's value (runtime._cse.alias_reuses)
                    out_idx = params[outs[0]]

                    def bind(vals, res, out_idx=out_idx):
                        vals[out_idx] = res

                    ops.append((reuse_alias, getter([source]), bind))
                    labels.append(label)
                    continue
                if source is not None and arg_slots[outs[0]] != layout.none_slot:
                    # an earlier identical call's result is in ``source`` (runtime._cse): copy it
                    ops.append((reuse_result, getter([source, arg_slots[outs[0]]]), post))
                    labels.append(label)
                    continue
                get = self._getter_with_lists(arg_slots, inline) if inline else getter(arg_slots)
                ops.append((fn, get, post))
                labels.append(label)
                self.kernel_ops += 1
            elif k is S.DelegateCall:
                if (ci, ii) in self.analysis.folded_delegates or (ci, ii) in self.analysis.viewed_delegates:
                    continue
                delegate = self.delegates[a.delegate_index]
                label += f" (delegate {a.delegate_index}: {delegate.backend_id})"
                for idx in a.args:
                    if idx in self.dynamic_lists:
                        ops.append((self._list_resolver(idx), _vals_only, None))
                        labels.append(label)
                ops.append((self._delegate_op(ci, ii, a, delegate), _vals_only, None))
                labels.append(label)
            elif k is S.MoveCall:
                src, dst = a.move_from, a.move_to

                def move(vals, src=src, dst=dst):
                    vals[dst] = vals[src]

                ops.append((move, _vals_only, None))
                labels.append(label + " (move)")
            elif k is S.JumpFalseCall:
                has_jump = True
                ops.append((JUMP, a.cond_value_index, a.destination_instruction))
                labels.append(label + " (jump_false)")
            elif k is S.FreeCall:
                idx = a.value_index
                if mv.specs.get(idx) is not None and mv.specs[idx].mem_id == 0 and idx in self.analysis.rw:
                    def free(vals, idx=idx):
                        vals[idx] = None

                    ops.append((free, _vals_only, None))
                    labels.append(label + " (free)")
            else:  # pragma: no cover - verify_program rejects unknown instructions
                raise mv.err(f"{label}: unknown instruction {k.__name__}")
        index_map.append(len(ops))
        if has_jump:
            for n, op in enumerate(ops):
                if op[0] is JUMP:
                    dest = op[2]
                    if not 0 <= dest < len(index_map):
                        raise mv.err(f"chains[{ci}]: jump destination {dest} out of range")
                    ops[n] = (JUMP, op[1], index_map[dest])
        return ops, has_jump, labels

    def _getter_with_lists(self, slots: list[int], inline: dict[int, int]) -> Callable[[list], tuple]:
        """The argument getter of a kernel call that takes lists over slots a run rewrites: each such list is
        built from its items' slots as the arguments are read (what a resolver operation would store)."""
        parts = []
        for pos, slot in enumerate(slots):
            if pos not in inline:
                parts.append(f"vals[{int(slot)}]")
                continue
            kind, items = self.dynamic_lists[inline[pos]]
            if kind == "IntList":
                parts.append("(" + "".join(f"vals[{int(i)}], " for i in items) + ")")
            else:
                parts.append("[" + ", ".join("None" if i < 0 else f"vals[{int(i)}]" for i in items) + "]")
        # generated from integers only: one tuple display, no loop per call
        return eval("lambda vals: (" + "".join(p + ", " for p in parts) + ")", {"__builtins__": {}})  # noqa: S307

    def _list_resolver(self, idx: int) -> Callable[[list], None]:
        kind, items = self.dynamic_lists[idx]
        if kind == "IntList":
            def resolve(vals, idx=idx, items=tuple(items)):
                vals[idx] = tuple(vals[i] for i in items)
        else:
            def resolve(vals, idx=idx, items=tuple(items)):
                vals[idx] = [None if i < 0 else vals[i] for i in items]
        return resolve

    def _kernel_post(self, name: str, params: list[int], rets: list[int], stores: list[int], mut: list[int],
                     outs: list[int]) -> Callable[[list, Any], None] | None:
        mv = self.mv
        kinds = mv.kinds
        actions: list[tuple[str, Any]] = []
        for r in stores:
            if kinds[r] is S.TensorList:
                actions.append(("list", (r, tuple(mv.items(r)))))
            else:
                actions.append(("one", r))
        # an out argument stored under a different index than the returned one still gets the result
        if len(rets) == 1 and kinds[rets[0]] is S.Tensor and outs:
            out_idx = params[outs[-1]] if len(outs) == 1 else None
            if out_idx is not None and out_idx != rets[0] and out_idx in self.analysis.rw:
                actions.append(("one", out_idx))
        for pos in mut:
            idx = params[pos]
            if kinds[idx] is S.TensorList:
                actions.append(("list", (idx, tuple(mv.items(idx)))))
            else:
                actions.append(("one", idx))
        if not actions:
            return None
        if len(actions) == 1 and actions[0][0] == "one":
            r = actions[0][1]

            def post_one(vals, res, r=r):
                if res is None:
                    raise RuntimeExecutionError(f"kernel {name} returned None")
                vals[r] = res

            return post_one

        def post(vals, res, actions=tuple(actions)):
            if res is None:
                raise RuntimeExecutionError(f"kernel {name} returned None")
            for kind, what in actions:
                if kind == "one":
                    vals[what] = res
                else:
                    lst_idx, items = what
                    parts = list(res)
                    if len(parts) != len(items):
                        raise RuntimeExecutionError(
                            f"kernel {name} returned {len(parts)} tensors for a list of {len(items)}")
                    for i, x in zip(items, parts):
                        vals[i] = x
                    vals[lst_idx] = parts

        return post

    # ------------------------------------------------------------------------------------------ delegate calls
    def _delegate_op(self, ci: int, ii: int, a: S.DelegateCall, delegate: Delegate) -> Callable[[list], None]:
        """``op(vals)``: call the delegate on its input slots and store its outputs in their slots."""
        args = list(a.args)
        n_out = self._delegate_num_outputs(ci, ii, a, delegate)
        in_idx, out_idx = args[: len(args) - n_out], args[len(args) - n_out:]
        self.delegate_inputs.update(t for i in in_idx for t in [i, *self.mv.tensor_items(i)])
        self.delegate_outputs.update(t for i in out_idx for t in [i, *self.mv.tensor_items(i)])
        targets = []
        for o in out_idx:
            sp = self.mv.specs.get(o)
            if sp is None:
                targets.append(("value", o, None))
            elif sp.mem_id == 0:
                targets.append(("unplanned", o, sp))
            elif sp.dynamic:
                targets.append(("bind" if o in self.bindable else "dynamic", o, self.layout.capacity[o]))
            else:
                targets.append(("static", o, sp))
        where = f"delegate {a.delegate_index} ({delegate.backend_id})"
        executor, handle, lock = delegate.executor, delegate.handle, delegate.lock
        get_in = getter(in_idx)
        n_expected = len(out_idx)

        def store(vals, outs):
            """Check a delegate's results and put them into their slots."""
            if outs is None or len(outs) != n_expected:
                got = "None" if outs is None else str(len(outs))
                raise RuntimeExecutionError(f"{where} returned {got} outputs, the program expects {n_expected}")
            for (tk, o, extra), res in zip(targets, outs):
                if tk == "bind" and res.__class__ is _nd and res.flags.owndata and res.dtype == vals[extra].dtype \
                        and res.size <= vals[extra].size:
                    vals[o] = res  # the executor's own array (runtime._views.bindable_outputs)
                elif tk == "static":
                    dst = vals[o]
                    if res is dst:
                        continue
                    res = np.asarray(res)
                    if res.shape != dst.shape:
                        raise RuntimeExecutionError(
                            f"{where}: output shape {list(res.shape)} differs from the planned {list(dst.shape)}")
                    np.copyto(dst, res, casting="unsafe")
                elif tk == "dynamic" or tk == "bind":
                    res = np.asarray(res)
                    dst = resize(vals[extra], res.shape)
                    if res is not dst and not (res.dtype == dst.dtype and res.strides == dst.strides
                                               and res.__array_interface__["data"][0]
                                               == dst.__array_interface__["data"][0]):
                        np.copyto(dst, res, casting="unsafe")  # else computed in place already
                    vals[o] = dst
                elif tk == "unplanned":
                    vals[o] = np.asarray(res)
                else:
                    vals[o] = res

        if delegate.kind != "fallback" and delegate.takes_out:
            direct = self._direct_call(executor, handle, lock, in_idx, out_idx, store)
            if direct is not None:
                direct.out_slots = tuple(out_idx)  # type: ignore[attr-defined]  (ETDump's intermediate outputs)
                return direct

        if delegate.kind == "fallback":
            runner = executor

            def call(vals):
                return runner.run(list(get_in(vals)))
        elif delegate.takes_out:
            call = self._call_with_out(executor, handle, lock, in_idx, out_idx)
        elif lock is None:
            def call(vals):
                return executor.execute(handle, list(get_in(vals)))
        else:
            def call(vals):
                with lock:
                    return executor.execute(handle, list(get_in(vals)))

        def run_delegate(vals):
            store(vals, call(vals))

        run_delegate.out_slots = tuple(out_idx)  # type: ignore[attr-defined]  (ETDump's intermediate outputs)
        return run_delegate

    def _direct_call(self, executor: Any, handle: Any, lock: Any, in_idx: list[int], out_idx: list[int],
                     store: Callable[[list, Any], None]) -> Callable[[list], None] | None:
        """The common case of destination passing, with the least work per call: every output is written into
        its own planned array (statically planned, no input of unknown memory). ``op(vals)`` passes them as
        ``out``; when the executor returns that same list holding those same arrays nothing is left to do,
        anything else goes through ``store`` (checked and copied in). ``None`` when this case does not apply."""
        slots, unknown = self._out_slots(in_idx, out_idx)
        if unknown or not out_idx or slots != out_idx:
            return None
        get_in, get_out = getter(in_idx), getter(out_idx)
        fast_of = getattr(executor, "direct_execute", None)
        fast = fast_of(handle) if callable(fast_of) else None  # optional hook (RuntimeExecutor's docstring)

        def run_direct(vals):
            dsts = get_out(vals)
            outs = list(dsts)
            if fast is not None and _ran(fast, lock, list(get_in(vals)), outs):
                return
            if lock is None:
                res = executor.execute(handle, list(get_in(vals)), out=outs)
            else:
                with lock:
                    res = executor.execute(handle, list(get_in(vals)), out=outs)
            if res is not outs or not all(map(is_, outs, dsts)):
                store(vals, res)

        return run_direct

    def _call_with_out(self, executor: Any, handle: Any, lock: Any, in_idx: list[int],
                       out_idx: list[int]) -> Callable[[list], Any]:
        """``call(vals)`` running ``executor.execute(handle, inputs, out=outs)``: ``outs[k]`` is output ``k``'s
        planned array when the executor may write it directly, else ``None`` (see :meth:`_out_slots`)."""
        get_in = getter(in_idx)
        slots, unknown = self._out_slots(in_idx, out_idx)
        get_out = getter(slots)
        checked = [k for k, s in enumerate(slots) if s != self.layout.none_slot]
        get_unknown = getter(unknown)

        def outs_of(vals):
            outs = list(get_out(vals))
            if unknown:  # inputs of unknown memory (views made by kernels): never pass an output they overlap
                xs = [x for x in get_unknown(vals) if isinstance(x, np.ndarray)]
                for k in checked:
                    if any(np.may_share_memory(outs[k], x) for x in xs):
                        outs[k] = None
            return outs

        if lock is None:
            def call(vals):
                return executor.execute(handle, list(get_in(vals)), out=outs_of(vals))
        else:
            def call(vals):
                outs = outs_of(vals)
                with lock:
                    return executor.execute(handle, list(get_in(vals)), out=outs)
        return call

    def _out_slots(self, in_idx: list[int], out_idx: list[int]) -> tuple[list[int], list[int]]:
        """For each delegate output, the slot holding the array to pass as its ``out=`` entry: its own slot for a
        statically planned, C-contiguous tensor whose slot no instruction rebinds and whose planned bytes overlap
        no input and no other output of the call; else the always-``None`` slot. Also the input slots whose
        memory is unknown until the run (unplanned tensors made by kernels, possibly views of planned memory)."""
        mv, none_slot = self.mv, self.layout.none_slot
        inputs = set(self.plan.inputs)
        ranges: list[tuple[int, int, int]] = []  # (mem_id, start, end) of planned inputs
        unknown: list[int] = []
        for i in in_idx:
            for t in mv.tensor_items(i):
                sp = mv.specs[t]
                if sp.constant is not None:
                    continue
                if sp.mem_id:
                    ranges.append((sp.mem_id, sp.offset, sp.offset + sp.nbytes))
                elif t not in inputs and t not in unknown:
                    unknown.append(t)
        out_ranges = [(k, (sp.mem_id, sp.offset, sp.offset + sp.nbytes)) for k, o in enumerate(out_idx)
                      if (sp := mv.specs.get(o)) is not None and sp.mem_id]

        def overlaps(r: tuple[int, int, int], s: tuple[int, int, int]) -> bool:
            return r[0] == s[0] and r[1] < s[2] and s[1] < r[2]

        slots = []
        for k, o in enumerate(out_idx):
            sp = mv.specs.get(o)
            ok = (sp is not None and sp.mem_id != 0 and not sp.dynamic and sp.constant is None
                  and sp.contiguous_order and o not in self.analysis.rw)
            if ok and sp.nbytes:
                mine = (sp.mem_id, sp.offset, sp.offset + sp.nbytes)
                ok = not any(overlaps(mine, r) for r in ranges) and not any(
                    overlaps(mine, r) for j, r in out_ranges if j != k)
            slots.append(o if ok else none_slot)
        return slots, unknown

    def _delegate_num_outputs(self, ci: int, ii: int, a: S.DelegateCall, delegate: Delegate) -> int:
        where = self.mv.where
        if delegate.kind == "fallback":
            return len(delegate.executor.plan.output_indices)
        declared = getattr(delegate.executor, "num_outputs", None)
        if callable(declared):
            try:
                n = int(declared(delegate.handle))
            except Exception as exc:  # noqa: BLE001
                raise ProgramError(f"{where}: delegate {a.delegate_index} num_outputs failed: {exc}") from exc
            if not 0 <= n <= len(a.args):
                raise ProgramError(f"{where}: delegate {a.delegate_index} declares {n} outputs but the call "
                                   f"has {len(a.args)} arguments")
            return n
        # The emitters append the delegate's outputs, fresh values, after its inputs: the outputs are the
        # trailing arguments that no earlier instruction, method input or constant defines.
        defined = self._defined_before(ci, ii)
        n = 0
        for idx in reversed(a.args):
            if idx in defined or self.mv.kinds[idx] is not S.Tensor:
                break
            n += 1
        if n == 0:
            raise ProgramError(f"{where}: chains[{ci}].instructions[{ii}]: cannot tell the outputs of delegate "
                               f"{a.delegate_index} ({delegate.backend_id}) from its inputs")
        return n

    def _defined_before(self, ci: int, ii: int) -> set[int]:
        mv, plan = self.mv, self.plan
        defined = set(plan.inputs)
        for i, sp in mv.specs.items():
            if sp.constant is not None or sp.initial is not None:  # constants, and state with its initial value
                defined.add(i)
        for chain in plan.chains[: ci + 1]:
            instrs = chain.instructions if chain is not plan.chains[ci] else chain.instructions[:ii]
            for instr in instrs:
                a = instr.instr_args
                if type(a) in (S.KernelCall, S.DelegateCall):
                    for idx in a.args:
                        defined.add(idx)
                        defined.update(mv.tensor_items(idx))
                elif type(a) is S.MoveCall:
                    defined.add(a.move_to)
        return defined


def _ran(fast: Callable[[list, list], bool], lock: Any, ins: list, outs: list) -> bool:
    """An executor's ``direct_execute`` run on one call, under the delegate's lock when it has one."""
    if lock is None:
        return fast(ins, outs)
    with lock:
        return fast(ins, outs)
