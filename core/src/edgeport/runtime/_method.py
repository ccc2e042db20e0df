"""Turn one verified ``ExecutionPlan`` into a fast list of operations, and run it.

Everything is resolved once, when the method loads: values become Python objects (scalars, tuples, constant
tensors as zero-copy read-only views of the program's constant segment), every operator becomes its kernel,
every delegate an initialised executor handle, and each instruction a ``(function, argument getter, post)``
triple. Running a method then only walks that list:

    for fn, get, post in ops:
        r = fn(*get(vals))          # get is an operator.itemgetter over the value slots
        if post is not None:
            post(vals, r)           # only where a result must be stored (dynamic shapes, scalars, delegates)

Planned memory: each execution context owns one zero-initialised ``uint8`` arena per ``memory_id``; every
planned tensor value is a numpy view into its arena at its planned offset, shaped with its planned (for dynamic
shapes: upper-bound) sizes and laid out in its ``dim_order``. Kernels write into those views. A tensor whose
actual shape is smaller than planned (dynamic shapes) is a view of the same memory with the actual shape; the
upper-bound view stays in an extra "capacity" slot that kernels receive as their out argument.

Thread safety: a context (arenas + value slots) is used by one run at a time; :class:`MethodRunner` keeps a pool
of them, so concurrent ``execute`` calls each run in their own planned memory. A method with state (a planned
buffer read before it is written, e.g. mutated buffers written back with ``aten::copy_``) has a single context
and its runs take turns under a lock, so the state carries from run to run as in ExecuTorch. Delegate handles
are shared and called under a per-delegate lock unless the executor declares ``thread_safe = True``.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from math import prod
from operator import itemgetter
from typing import Any

import numpy as np

from edgeport.errors import (
    BackendNotFoundError,
    EdgeportError,
    ProgramError,
    RuntimeExecutionError,
    UnsupportedOperatorError,
)
from edgeport.program import schema as S
from edgeport.runtime.kernel_utils import resize

__all__ = ["MethodPlan", "MethodRunner", "TensorInfo", "FALLBACK_COMPILE_SPEC", "MAX_STEPS"]

#: Compile-spec key a delegate carries to name a method of the same program that computes the same partition
#: with portable kernels (inputs = the delegate's inputs, outputs = its outputs). Used with ``allow_fallback``.
FALLBACK_COMPILE_SPEC = "edgeport.portable_fallback"

#: Upper bound on instructions executed in one run of a method with jumps (guards against endless loops).
MAX_STEPS = 50_000_000

_JUMP = object()


def _vals_only(vals: list) -> tuple:
    return (vals,)


def _no_args(vals: list) -> tuple:
    return ()


def _getter(indices: Sequence[int]) -> Callable[[list], tuple]:
    if len(indices) == 0:
        return _no_args
    if len(indices) == 1:
        i = indices[0]
        return lambda vals: (vals[i],)
    return itemgetter(*indices)


@dataclass(frozen=True)
class TensorInfo:
    """Dtype and shape of a method input or output (``shape`` is the upper bound when ``dynamic``)."""

    dtype: np.dtype
    shape: tuple[int, ...]
    dynamic: bool = False
    memory_planned: bool = True
    dim_order: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize

    # executorch.runtime.TensorInfo-style accessors
    def sizes(self) -> tuple[int, ...]:
        return self.shape

    def is_memory_planned(self) -> bool:
        return self.memory_planned


@dataclass
class _TensorSpec:
    index: int
    dtype: np.dtype
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    dynamic: bool
    mem_id: int  # 0: not planned
    offset: int
    nbytes: int
    constant: np.ndarray | None = None
    initial: memoryview | None = None  # initial data of a planned (mutable) tensor

    @property
    def contiguous_order(self) -> bool:
        return self.dim_order == tuple(range(len(self.sizes)))


def _logical_view(flat_or_buf: Any, spec: _TensorSpec, offset: int = 0) -> np.ndarray:
    phys = tuple(spec.sizes[d] for d in spec.dim_order)
    arr = np.ndarray(phys, dtype=spec.dtype, buffer=flat_or_buf, offset=offset)
    if spec.contiguous_order:
        return arr
    inverse = [0] * len(spec.dim_order)
    for pos, d in enumerate(spec.dim_order):
        inverse[d] = pos
    return arr.transpose(inverse)


def _empty_view(spec: _TensorSpec) -> np.ndarray:
    phys = tuple(spec.sizes[d] for d in spec.dim_order)
    arr = np.zeros(phys, dtype=spec.dtype)
    if spec.contiguous_order:
        return arr
    inverse = [0] * len(spec.dim_order)
    for pos, d in enumerate(spec.dim_order):
        inverse[d] = pos
    return arr.transpose(inverse)


def _kernel_arity(fn: Callable[..., Any], op: str) -> int:
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


def _accepts_named_data(init: Callable[..., Any]) -> bool:
    """Whether an executor's ``init`` takes ``named_data=`` (a ``key -> memoryview`` lookup into the program's
    named data, where ExecuTorch-style blobs keep their weights)."""
    try:
        params = inspect.signature(init).parameters
    except (TypeError, ValueError):
        return False
    return "named_data" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def op_name(op: S.Operator) -> str:
    return f"{op.name}.{op.overload}" if op.overload else op.name


@dataclass
class DelegateInfo:
    index: int
    backend_id: str
    status: str  # "backend" or "fallback"
    reason: str = ""
    fallback_method: str | None = None


@dataclass
class MethodProfile:
    """What a loaded method runs on: the kernel library of each op, each delegate's executor, any fallback.

    A portable fallback taken for an unavailable backend is listed in ``fallbacks`` (and a warning is issued);
    it is never silent. ``runs`` counts completed executions; ``last_run_seconds`` is the last one's wall time.
    """

    method: str
    kernel_libraries: dict[str, str] = field(default_factory=dict)
    overridden_kernels: dict[str, str] = field(default_factory=dict)
    delegates: list[DelegateInfo] = field(default_factory=list)
    num_instructions: int = 0
    folded_instructions: int = 0
    runs: int = 0
    last_run_seconds: float = 0.0
    #: with ``method.time_ops = True``: seconds and calls per op (kernel name or ``delegate N: backend``)
    op_seconds: dict[str, float] = field(default_factory=dict)
    op_calls: dict[str, int] = field(default_factory=dict)

    @property
    def fallbacks(self) -> list[DelegateInfo]:
        return [d for d in self.delegates if d.status == "fallback"]

    def __getitem__(self, key: str) -> Any:  # dict-style access for quick inspection
        return getattr(self, key)


class MethodPlan:
    """The load-time analysis of one method: value templates, op list, input binders, delegate handles.

    ``owner`` is the runtime ``Program`` (for delegate data and fallback methods); ``kernels`` a
    :class:`~edgeport.registry.KernelRegistry`.
    """

    def __init__(self, owner: Any, plan_index: int, kernels: Any, *, allow_fallback: bool = False,
                 fold_constants: bool = True, _fallback_depth: int = 0) -> None:
        self.owner = owner
        self.fold_constants = fold_constants
        self.plan_index = plan_index
        lp = owner._loaded
        self.plan: S.ExecutionPlan = lp.program.execution_plan[plan_index]
        self.name = self.plan.name
        self.where = f"method {self.name!r}"
        self.kernels = kernels
        self.allow_fallback = allow_fallback
        self._fallback_depth = _fallback_depth
        self.profile = MethodProfile(self.name)
        self._handles: list[tuple[Any, Any]] = []  # (executor, handle) to destroy
        self._sub_runners: list[MethodRunner] = []
        try:
            self._analyze(lp)
        except BaseException:
            self.destroy()
            raise

    # ------------------------------------------------------------------------------------------ analysis
    def _err(self, msg: str) -> ProgramError:
        return ProgramError(f"{self.where}: {msg}")

    def _analyze(self, lp: Any) -> None:
        plan = self.plan
        values = plan.values
        nv = len(values)
        self.num_values = nv
        arenas = list(plan.non_const_buffer_sizes)  # entry 0 is reserved (never allocated)
        self.arena_sizes = arenas
        kinds = [type(v.val) for v in values]
        self.kinds = kinds

        # -- tensors ----------------------------------------------------------------------------------
        specs: dict[int, _TensorSpec] = {}
        for i, ev in enumerate(values):
            t = ev.val
            if kinds[i] is not S.Tensor:
                continue
            at = f"values[{i}]"
            try:
                dtype = S.numpy_dtype(t.scalar_type)
            except ValueError as exc:
                raise self._err(f"{at}: {exc}") from None
            sizes = tuple(int(s) for s in t.sizes)
            dim_order = tuple(int(d) for d in t.dim_order) if len(t.dim_order) else tuple(range(len(sizes)))
            if sorted(dim_order) != list(range(len(sizes))):
                raise self._err(f"{at}: dim_order {list(dim_order)} does not match sizes {list(sizes)}")
            nbytes = prod(sizes) * dtype.itemsize
            dynamic = int(t.shape_dynamism) != 0
            spec = _TensorSpec(i, dtype, sizes, dim_order, dynamic, 0, 0, nbytes)
            if t.allocation_info is not None:
                info = t.allocation_info
                mem_id = info.memory_id
                offset = info.memory_offset_low | (info.memory_offset_high << 32)
                if not 1 <= mem_id < len(arenas):
                    raise self._err(f"{at}: memory_id {mem_id} out of range (non_const_buffer_sizes {arenas})")
                if offset + nbytes > arenas[mem_id]:
                    raise self._err(f"{at}: planned memory [{offset}, {offset + nbytes}) runs past arena "
                                    f"{mem_id} ({arenas[mem_id]} bytes)")
                if offset % dtype.itemsize:
                    raise self._err(f"{at}: planned offset {offset} is not aligned to its {dtype} elements "
                                    f"({dtype.itemsize} bytes)")
                spec.mem_id, spec.offset = mem_id, offset
                if t.data_buffer_idx > 0:
                    spec.initial = lp.tensor_data(t, where=f"{self.where} {at}")
            elif t.data_buffer_idx > 0:
                info = t.extra_tensor_info
                if info is not None and int(info.location) == int(S.TensorDataLocation.EXTERNAL):
                    raise self._err(f"{at}: constant data stored outside the program (external .ptd data) is "
                                    "not supported by edgeport's runtime")
                data = lp.tensor_data(t, where=f"{self.where} {at}")
                spec.constant = self._constant_view(data, spec, at)
            specs[i] = spec
        self.specs = specs

        # -- instruction pre-pass: which value slots are (re)written at run time ------------------------
        inputs = list(plan.inputs)
        outputs = list(plan.outputs)
        self.input_indices, self.output_indices = inputs, outputs
        operators = plan.operators
        resolved_ops: list[tuple[str, Any, int]] = []  # per operator: (name, KernelEntry, arity)
        for op in operators:
            name = op_name(op)
            entry = self.kernels.get(name)
            if entry is None and not op.overload:
                entry = self.kernels.get(f"{op.name}.default")
            resolved_ops.append((name, entry, -1 if entry is None else _kernel_arity(entry.fn, name)))
        self.resolved_ops = resolved_ops

        rw: set[int] = set()  # slots whose object changes during a run
        for i in inputs:
            spec = specs.get(i)
            if spec is None or spec.dynamic or spec.mem_id == 0:
                rw.add(i)

        def needs_store(idx: int) -> bool:
            k = kinds[idx]
            if k is S.Tensor:
                sp = specs[idx]
                return sp.dynamic or sp.mem_id == 0
            return True

        chains_info = []
        missing: dict[str, int] = {}
        for ci, chain in enumerate(plan.chains):
            infos = []
            for ii, instr in enumerate(chain.instructions):
                a = instr.instr_args
                at = f"chains[{ci}].instructions[{ii}]"
                k = type(a)
                if k is S.KernelCall:
                    name, entry, arity = resolved_ops[a.op_index]
                    if entry is None:
                        missing.setdefault(name, ii)
                        infos.append(None)
                        continue
                    args = list(a.args)
                    if len(args) < arity:
                        raise self._err(f"{at} ({name}): {len(args)} arguments, but its kernel takes {arity}")
                    if len(args) > arity + 1:
                        raise self._err(f"{at} ({name}): {len(args)} arguments, but its kernel takes {arity} "
                                        "and the op returns at most one value")
                    params, rets = args[:arity], args[arity:]
                    outs = self._out_positions(params, rets, entry.fn)
                    for pos in outs:
                        idx = params[pos]
                        for t_idx in self._tensor_items(idx):
                            sp = specs[t_idx]
                            if sp.constant is not None:
                                raise self._err(f"{at} ({name}): argument {pos} writes into constant "
                                                f"values[{t_idx}]")
                    stores = []
                    for r in rets:
                        if kinds[r] is S.TensorList:
                            items = [x for x in values[r].val.items if needs_store(x) or x not in params]
                            if items:
                                rw.update(values[r].val.items)
                                rw.add(r)
                                stores.append(r)
                        elif kinds[r] is S.Tensor:
                            if needs_store(r) or r not in params:
                                rw.add(r)
                                stores.append(r)
                        elif kinds[r] is S.Null:
                            pass
                        else:
                            rw.add(r)
                            stores.append(r)
                    mut = []
                    for pos in getattr(entry.fn, "mutates", ()):
                        mut.append(pos)
                        rw.update(self._tensor_items(params[pos]))
                    if not rets:
                        for pos in outs:
                            idx = params[pos]
                            if kinds[idx] is S.TensorList and any(needs_store(x) for x in values[idx].val.items):
                                rw.update(values[idx].val.items)
                                mut.append(pos)
                    infos.append(("kernel", name, entry, params, rets, outs, stores, mut))
                elif k is S.DelegateCall:
                    for idx in a.args:
                        sp = specs.get(idx)
                        if sp is not None and (sp.dynamic or sp.mem_id == 0) and sp.constant is None:
                            rw.add(idx)
                    infos.append(("delegate",))
                elif k is S.MoveCall:
                    rw.add(a.move_to)
                    infos.append(("move",))
                else:
                    infos.append((k.__name__,))
            chains_info.append(infos)
        if missing:
            listing = ", ".join(f"{n} (instruction {i})" for n, i in sorted(missing.items()))
            raise UnsupportedOperatorError(
                f"{self.where}: no kernel registered for {listing}; install a kernel library plugin that "
                "provides it or lower that part of the model to a backend")
        # delegate outputs are written at run time when they are dynamic or unplanned; classify later
        self.rw = rw
        self.read = self._read_values(chains_info)
        self.state_tensors = self._state_tensors(chains_info)
        self.stateful = bool(self.state_tensors)

        # -- value templates ----------------------------------------------------------------------------
        tpl: list[Any] = [None] * nv
        for i, ev in enumerate(values):
            k = kinds[i]
            v = ev.val
            if k is S.Int:
                tpl[i] = int(v.int_val)
            elif k is S.Double:
                tpl[i] = float(v.double_val)
            elif k is S.Bool:
                tpl[i] = bool(v.bool_val)
            elif k is S.String:
                tpl[i] = v.string_val
            elif k is S.DoubleList:
                tpl[i] = tuple(float(x) for x in v.items)
            elif k is S.BoolList:
                tpl[i] = tuple(bool(x) for x in v.items)
            elif k is S.Tensor and specs[i].constant is not None:
                tpl[i] = specs[i].constant
        for i, ev in enumerate(values):
            if kinds[i] is S.IntList:
                tpl[i] = tuple(tpl[j] for j in ev.val.items)
        self.static_template = tpl  # tensors other than constants are filled per context
        if self.fold_constants:
            self._fold_constants(chains_info, rw)
        self.dynamic_lists: dict[int, tuple[str, list[int]]] = {}
        for i, ev in enumerate(values):
            k = kinds[i]
            if k in (S.IntList, S.TensorList, S.OptionalTensorList):
                items = list(ev.val.items)
                if any(j in rw for j in items if j >= 0):
                    self.dynamic_lists[i] = (k.__name__, items)

        # capacity slots: one per planned dynamic tensor, holding its upper-bound view
        self.capacity: dict[int, int] = {}
        slot = nv
        for i, sp in specs.items():
            if sp.dynamic and sp.mem_id:
                self.capacity[i] = slot
                slot += 1
        self.tensorlist_capacity: dict[int, int] = {}
        for i, ev in enumerate(values):
            if kinds[i] is S.TensorList and any(j in self.capacity for j in ev.val.items):
                self.tensorlist_capacity[i] = slot
                slot += 1
        self.none_slot = slot  # always None: given for optional out arguments nobody reads
        slot += 1
        self.num_slots = slot

        # -- delegates ----------------------------------------------------------------------------------
        self.delegate_execs = [self._init_delegate(lp, di, d) for di, d in enumerate(plan.delegates)]

        # -- op lists -----------------------------------------------------------------------------------
        self.chains: list[tuple[list[tuple], bool, list[str]]] = []
        count = 0
        for ci, chain in enumerate(plan.chains):
            ops, labels, has_jump = self._build_chain(ci, chain, chains_info[ci])
            self.chains.append((ops, has_jump, labels))
            count += len(chain.instructions)
        self.profile.num_instructions = count
        for name, entry, _ in resolved_ops:
            if entry is not None:
                self.profile.kernel_libraries[name] = entry.library
        for e in getattr(self.kernels, "overridden", []):
            if e.op in self.profile.kernel_libraries:
                self.profile.overridden_kernels[e.op] = e.library

        self._build_io()

    # -- constant folding ----------------------------------------------------------------------------
    FOLD_MAX_BYTES = 64 << 20  # per folded output
    FOLD_TOTAL_BYTES = 1 << 30

    def _fold_constants(self, chains_info: list, rw: set[int]) -> None:
        """Run, once at load, the kernel calls whose inputs are all constants (typically ``permute_copy`` and
        ``expand_copy`` of weights); their outputs become constants and the calls leave the instruction list.

        A call is folded only when it is pure (no ``pure = False`` on the kernel), writes static planned tensors
        that no other instruction writes and that no never-written planned tensor (an alias ExecuTorch created by
        eliding a view) overlaps, and its outputs are not method outputs.
        """
        plan, kinds, specs, tpl = self.plan, self.kinds, self.specs, self.static_template
        values = plan.values
        if any(type(i.instr_args) is S.JumpFalseCall for c in plan.chains for i in c.instructions):
            return
        write_count: dict[int, int] = {}
        for infos in chains_info:
            for info in infos:
                if info is None or info[0] != "kernel":
                    continue
                _, _, _, params, rets, outs, _, _ = info
                for pos in outs:
                    for t in self._tensor_items(params[pos]):
                        write_count[t] = write_count.get(t, 0) + 1
        for chain in plan.chains:
            for instr in chain.instructions:
                if type(instr.instr_args) is S.DelegateCall:
                    for idx in instr.instr_args.args:
                        write_count[idx] = write_count.get(idx, 0) + 2  # never fold into delegate args
        protected = set(self.input_indices) | set(self.output_indices) | self.state_tensors
        for o in self.output_indices:
            protected.update(self._tensor_items(o))
        aliases = [sp for i, sp in specs.items()
                   if sp.mem_id and i not in write_count and i not in self.input_indices and sp.nbytes]
        # For each alias (a planned tensor no instruction writes: a view ExecuTorch elided), the tensor whose
        # data it reads: the last tensor written over its memory before its first use.
        alias_source: dict[int, set[int]] = {}
        if aliases:
            order: list[tuple[list[int], list[int]]] = []  # per instruction: (read tensors, written tensors)
            for infos in chains_info:
                for info in infos:
                    if info is None or info[0] != "kernel":
                        order.append(([], []))
                        continue
                    _, _, _, params, _, outs, _, _ = info
                    written = [t for pos in outs for t in self._tensor_items(params[pos])]
                    read = [t for pos, idx in enumerate(params) if pos not in outs for t in self._tensor_items(idx)]
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
        read_through_alias = set().union(*alias_source.values()) if alias_source else set()
        total = 0
        folded = 0
        for infos in chains_info:
            for n, info in enumerate(infos):
                if info is None or info[0] != "kernel":
                    continue
                _, name, entry, params, rets, outs, stores, mut = info
                if stores or mut or not outs or getattr(entry.fn, "pure", True) is False:
                    continue
                out_tensors = [t for pos in outs for t in self._tensor_items(params[pos])]
                ok = bool(out_tensors)
                for t in out_tensors:
                    sp = specs[t]
                    if (sp.dynamic or not sp.mem_id or t in protected or write_count.get(t, 0) != 1
                            or sp.nbytes > self.FOLD_MAX_BYTES):
                        ok = False
                        break
                    if t in read_through_alias and not self._aliases_foldable(t, alias_source):
                        ok = False
                        break
                if not ok:
                    continue
                args: list[Any] = []
                for pos, idx in enumerate(params):
                    k = kinds[idx]
                    if pos in outs:
                        if k is S.TensorList:
                            args.append([_empty_view(specs[j]) for j in values[idx].val.items])
                        else:
                            args.append(_empty_view(specs[idx]))
                        continue
                    if idx in rw:
                        ok = False
                        break
                    if k is S.Tensor:
                        if specs[idx].constant is None:
                            ok = False
                            break
                        args.append(specs[idx].constant)
                    elif k in (S.TensorList, S.OptionalTensorList):
                        items = list(values[idx].val.items)
                        if any(j >= 0 and (j in rw or kinds[j] is S.Tensor and specs[j].constant is None)
                               for j in items):
                            ok = False
                            break
                        args.append([None if j < 0 else (specs[j].constant if kinds[j] is S.Tensor else None)
                                     for j in items])
                    elif k is S.IntList and any(j in rw for j in values[idx].val.items):
                        ok = False
                        break
                    else:
                        args.append(tpl[idx])
                if not ok:
                    continue
                size = sum(specs[t].nbytes for t in out_tensors)
                if total + size > self.FOLD_TOTAL_BYTES:
                    continue
                try:
                    with np.errstate(all="ignore"):
                        entry.fn(*args)
                except Exception:  # noqa: BLE001 - leave it to run (and report) at run time
                    continue
                for pos in outs:
                    arrs = args[pos] if isinstance(args[pos], list) else [args[pos]]
                    for t, arr in zip(self._tensor_items(params[pos]), arrs):
                        arr.flags.writeable = False
                        specs[t].constant = arr
                        tpl[t] = arr
                        for a, src in alias_source.items():
                            if src == {t}:  # an elided view of the folded tensor: a view of the constant
                                view = self._alias_view(specs[t], specs[a])
                                specs[a].constant = view
                                tpl[a] = view
                total += size
                folded += 1
                infos[n] = ("folded", name)
        self.profile.folded_instructions = folded

    def _aliases_foldable(self, t: int, alias_source: dict[int, set[int]]) -> bool:
        st = self.specs[t]
        for a, src in alias_source.items():
            if t not in src:
                continue
            sa = self.specs[a]
            if src != {t} or sa.offset < st.offset or sa.offset + sa.nbytes > st.offset + st.nbytes:
                return False
        return True

    @staticmethod
    def _alias_view(st: _TensorSpec, sa: _TensorSpec) -> np.ndarray:
        arr = st.constant
        phys = arr.transpose(list(st.dim_order)) if not st.contiguous_order else arr  # memory order
        raw = np.ascontiguousarray(phys).reshape(-1).view(np.uint8)
        start = sa.offset - st.offset
        view = _logical_view(raw[start:start + sa.nbytes], sa)
        view.flags.writeable = False
        return view

    def _state_tensors(self, chains_info: list) -> set[int]:
        """Planned tensors read before an instruction writes them (mutable buffers whose value carries from one
        run to the next, e.g. written back with ``aten::copy_``)."""
        kernel_infos = [info for infos in chains_info for info in infos if info is not None and info[0] == "kernel"]
        all_written: set[int] = set()
        for _, _, _, params, _, outs, _, _ in kernel_infos:
            for pos in outs:
                all_written.update(self._tensor_items(params[pos]))
        inputs = set(self.input_indices)
        written: set[int] = set()
        state: set[int] = set()
        for _, _, _, params, _, outs, _, _ in kernel_infos:
            for pos, idx in enumerate(params):
                if pos in outs:
                    continue
                for t in self._tensor_items(idx):
                    if t in all_written and t not in written and t not in inputs and self.specs[t].mem_id:
                        state.add(t)
            for pos in outs:
                written.update(self._tensor_items(params[pos]))
        return state

    def _read_values(self, chains_info: list) -> set[int]:
        """Values some instruction reads (or the method returns); an out argument outside it is never used."""
        values, kinds = self.plan.values, self.kinds
        read: set[int] = set()

        def mark(idx: int) -> None:
            read.add(idx)
            if kinds[idx] in (S.TensorList, S.OptionalTensorList, S.IntList):
                read.update(j for j in values[idx].val.items if j >= 0)

        for idx in self.output_indices:
            mark(idx)
        for ci, chain in enumerate(self.plan.chains):
            for ii, instr in enumerate(chain.instructions):
                a = instr.instr_args
                k = type(a)
                info = chains_info[ci][ii]
                if k is S.KernelCall and info is not None and info[0] == "kernel":
                    _, _, _, params, _, outs, _, mut = info
                    for pos, idx in enumerate(params):
                        if pos not in outs or pos in mut:
                            mark(idx)
                elif k is S.DelegateCall:
                    for idx in a.args:
                        mark(idx)
                elif k is S.MoveCall:
                    mark(a.move_from)
                elif k is S.JumpFalseCall:
                    mark(a.cond_value_index)
        return read

    def _constant_view(self, data: memoryview, spec: _TensorSpec, at: str) -> np.ndarray:
        if len(data) < spec.nbytes:
            raise self._err(f"{at}: constant needs {spec.nbytes} bytes, its buffer has {len(data)}")
        if spec.nbytes == 0:
            return _empty_view(spec)
        arr = np.frombuffer(data, dtype=np.uint8, count=spec.nbytes)
        if arr.ctypes.data % spec.dtype.itemsize:
            arr = arr.copy()  # misaligned in memory: keep a private aligned copy
        view = _logical_view(arr, spec)
        if view.flags.writeable:
            view.flags.writeable = False
        return view

    def _tensor_items(self, idx: int) -> list[int]:
        k = self.kinds[idx]
        if k is S.Tensor:
            return [idx]
        if k in (S.TensorList, S.OptionalTensorList):
            return [j for j in self.plan.values[idx].val.items if j >= 0 and self.kinds[j] is S.Tensor]
        return []

    def _out_positions(self, params: list[int], rets: list[int], fn: Any) -> list[int]:
        """Positions of the out arguments among ``params`` (ATen puts them last)."""
        targets: set[int] = set()
        for r in rets:
            targets.add(r)
            if self.kinds[r] is S.TensorList:
                targets.update(self.plan.values[r].val.items)
        outs = [p for p, idx in enumerate(params) if idx in targets and self.kinds[idx] in (S.Tensor, S.TensorList)]
        if not outs and params and self.kinds[params[-1]] in (S.Tensor, S.TensorList) and (
                not rets or self.kinds[rets[0]] in (S.Tensor, S.TensorList)):
            outs.append(len(params) - 1)  # ATen out variants take their out argument(s) last
        return outs

    # ------------------------------------------------------------------------------------------ delegates
    def _init_delegate(self, lp: Any, di: int, d: S.BackendDelegate) -> tuple:
        from edgeport.registry import backend_not_found_message, get_backend

        at = f"{self.where} delegates[{di}] (backend {d.id!r})"
        reason = ""
        spec = None
        try:
            spec = get_backend(d.id)
        except BackendNotFoundError:
            reason = backend_not_found_message(d.id)
        executor = None
        if spec is not None:
            try:
                ok, why = spec.is_available()
            except Exception as exc:  # noqa: BLE001 - a broken availability probe means unavailable
                ok, why = False, f"is_available raised {type(exc).__name__}: {exc}"
            if ok and spec.executor is None:
                ok, why = False, "the backend registers no runtime executor"
            if ok:
                executor = spec.executor()
                try:
                    ok, why = executor.is_available()
                except AttributeError:
                    ok, why = True, ""
            if not ok:
                reason = f"backend {d.id!r} is installed but unavailable: {why}"
                executor = None
        if executor is None:
            fallback = self._fallback_name(d)
            if self.allow_fallback and fallback is not None:
                return self._init_fallback(di, d, fallback, reason)
            hint = ""
            if fallback is not None:
                hint = f"; the program carries a portable fallback ({fallback!r}): load_method(..., allow_fallback=True)"
            elif self.allow_fallback:
                hint = "; the program carries no portable fallback for this delegate"
            raise BackendNotFoundError(f"{at}: {reason}{hint}")
        processed = lp.delegate_data(self.plan_index, di)
        kwargs = {"named_data": lp.named_data} if _accepts_named_data(executor.init) else {}
        try:
            handle = executor.init(memoryview(processed), list(d.compile_specs), **kwargs)
        except EdgeportError:
            raise
        except Exception as exc:  # noqa: BLE001 - report a bad blob as a program error
            raise ProgramError(f"{at}: executor init failed: {type(exc).__name__}: {exc}") from exc
        self._handles.append((executor, handle))
        self.profile.delegates.append(DelegateInfo(di, d.id, "backend"))
        lock = None if getattr(executor, "thread_safe", False) else threading.Lock()
        return ("backend", d.id, executor, handle, lock)

    @staticmethod
    def _fallback_name(d: S.BackendDelegate) -> str | None:
        for cs in d.compile_specs:
            if cs.key == FALLBACK_COMPILE_SPEC:
                try:
                    return bytes(cs.value).decode()
                except UnicodeDecodeError:
                    return None
        return None

    def _init_fallback(self, di: int, d: S.BackendDelegate, method: str, reason: str) -> tuple:
        import warnings

        names = [p.name for p in self.owner._loaded.program.execution_plan]
        if method not in names or method == self.name:
            raise ProgramError(f"{self.where} delegates[{di}]: portable fallback method {method!r} is not in the "
                               f"program (methods: {names})")
        if self._fallback_depth > 4:
            raise ProgramError(f"{self.where}: portable fallbacks nest too deeply")
        sub = MethodPlan(self.owner, names.index(method), self.kernels, allow_fallback=True,
                         _fallback_depth=self._fallback_depth + 1)
        runner = MethodRunner(sub)
        self._sub_runners.append(runner)
        self.profile.delegates.append(DelegateInfo(di, d.id, "fallback", reason, method))
        warnings.warn(f"{self.where}: delegate {di} ({d.id}) runs on its portable fallback {method!r}: {reason}",
                      RuntimeWarning, stacklevel=4)
        return ("fallback", d.id, runner, None, None)

    # ------------------------------------------------------------------------------------------ op lists
    def _build_chain(self, ci: int, chain: S.Chain, infos: list) -> tuple[list[tuple], list[str], bool]:
        ops: list[tuple] = []
        labels: list[str] = []
        has_jump = False
        index_map: list[int] = []  # instruction index -> first op index (resolvers come first)
        values = self.plan.values
        for ii, instr in enumerate(chain.instructions):
            index_map.append(len(ops))
            a = instr.instr_args
            info = infos[ii]
            label = f"chains[{ci}].instructions[{ii}]"
            k = type(a)
            if k is S.KernelCall and info[0] == "folded":
                continue
            if k is S.KernelCall:
                _, name, entry, params, rets, outs, stores, mut = info
                label += f" ({name})"
                arg_slots = list(params)
                optional = getattr(entry.fn, "optional_outs", ())
                for pos in outs:
                    idx = params[pos]
                    items = self._tensor_items(idx)
                    if pos in optional and idx not in self.read and items and all(t not in self.read for t in items):
                        arg_slots[pos] = self.none_slot
                    elif idx in self.capacity:
                        arg_slots[pos] = self.capacity[idx]
                    elif idx in self.tensorlist_capacity:
                        arg_slots[pos] = self.tensorlist_capacity[idx]
                for pos, idx in enumerate(params):
                    if idx in self.dynamic_lists and pos not in outs:
                        ops.append((self._list_resolver(idx), _vals_only, None))
                        labels.append(label)
                post = self._kernel_post(name, params, rets, stores, mut, outs)
                ops.append((entry.fn, _getter(arg_slots), post))
                labels.append(label)
            elif k is S.DelegateCall:
                d_exec = self.delegate_execs[a.delegate_index]
                label += f" (delegate {a.delegate_index}: {d_exec[1]})"
                for idx in a.args:
                    if idx in self.dynamic_lists:
                        ops.append((self._list_resolver(idx), _vals_only, None))
                        labels.append(label)
                ops.append((self._delegate_op(ci, ii, a, d_exec), _vals_only, None))
                labels.append(label)
            elif k is S.MoveCall:
                src, dst = a.move_from, a.move_to

                def move(vals, src=src, dst=dst):
                    vals[dst] = vals[src]

                ops.append((move, _vals_only, None))
                labels.append(label + " (move)")
            elif k is S.JumpFalseCall:
                has_jump = True
                ops.append((_JUMP, a.cond_value_index, a.destination_instruction))
                labels.append(label + " (jump_false)")
            elif k is S.FreeCall:
                idx = a.value_index
                if self.specs.get(idx) is not None and self.specs[idx].mem_id == 0 and idx in self.rw:
                    def free(vals, idx=idx):
                        vals[idx] = None

                    ops.append((free, _vals_only, None))
                    labels.append(label + " (free)")
            else:  # pragma: no cover - verify_program rejects unknown instructions
                raise self._err(f"{label}: unknown instruction {k.__name__}")
        index_map.append(len(ops))
        if has_jump:
            for n, op in enumerate(ops):
                if op[0] is _JUMP:
                    dest = op[2]
                    if not 0 <= dest < len(index_map):
                        raise self._err(f"chains[{ci}]: jump destination {dest} out of range")
                    ops[n] = (_JUMP, op[1], index_map[dest])
        del values
        return ops, labels, has_jump

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
        kinds = self.kinds
        values = self.plan.values
        actions: list[tuple[str, Any]] = []
        for r in stores:
            if kinds[r] is S.TensorList:
                actions.append(("list", (r, tuple(values[r].val.items))))
            else:
                actions.append(("one", r))
        # an out argument stored under a different index than the returned one still gets the result
        if len(rets) == 1 and kinds[rets[0]] is S.Tensor and outs:
            out_idx = params[outs[-1]] if len(outs) == 1 else None
            if out_idx is not None and out_idx != rets[0] and out_idx in self.rw:
                actions.append(("one", out_idx))
        for pos in mut:
            idx = params[pos]
            if kinds[idx] is S.TensorList:
                actions.append(("list", (idx, tuple(values[idx].val.items))))
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

    def _delegate_op(self, ci: int, ii: int, a: S.DelegateCall, d_exec: tuple) -> Callable[[list], None]:
        kind, backend_id, executor, handle, lock = d_exec
        args = list(a.args)
        n_out = self._delegate_num_outputs(ci, ii, a, d_exec)
        in_idx, out_idx = args[: len(args) - n_out], args[len(args) - n_out:]
        specs = self.specs
        targets = []
        for o in out_idx:
            sp = specs.get(o)
            if sp is None:
                targets.append(("value", o, None))
            elif sp.mem_id == 0:
                targets.append(("unplanned", o, sp))
            elif sp.dynamic:
                targets.append(("dynamic", o, self.capacity[o]))
            else:
                targets.append(("static", o, sp))
        where = f"delegate {a.delegate_index} ({backend_id})"

        if kind == "fallback":
            runner: MethodRunner = executor

            def call(inputs):
                return runner.run(inputs)
        elif lock is None:
            def call(inputs):
                return executor.execute(handle, inputs)
        else:
            def call(inputs):
                with lock:
                    return executor.execute(handle, inputs)

        get_in = _getter(in_idx)
        n_expected = len(out_idx)

        def run_delegate(vals):
            outs = call(list(get_in(vals)))
            if outs is None or len(outs) != n_expected:
                got = "None" if outs is None else str(len(outs))
                raise RuntimeExecutionError(f"{where} returned {got} outputs, the program expects {n_expected}")
            for (tk, o, extra), res in zip(targets, outs):
                if tk == "static":
                    dst = vals[o]
                    res = np.asarray(res)
                    if res is dst:
                        continue
                    if res.shape != dst.shape:
                        raise RuntimeExecutionError(
                            f"{where}: output shape {list(res.shape)} differs from the planned {list(dst.shape)}")
                    np.copyto(dst, res, casting="unsafe")
                elif tk == "dynamic":
                    res = np.asarray(res)
                    dst = resize(vals[extra], res.shape)
                    if res is not dst:
                        np.copyto(dst, res, casting="unsafe")
                    vals[o] = dst
                elif tk == "unplanned":
                    vals[o] = np.asarray(res)
                else:
                    vals[o] = res

        # register writes so that lists over these outputs resolve at run time (already analysed)
        return run_delegate

    def _delegate_num_outputs(self, ci: int, ii: int, a: S.DelegateCall, d_exec: tuple) -> int:
        kind, backend_id, executor, handle, _ = d_exec
        if kind == "fallback":
            return len(executor.plan.output_indices)
        declared = getattr(executor, "num_outputs", None)
        if callable(declared):
            try:
                n = int(declared(handle))
            except Exception as exc:  # noqa: BLE001
                raise ProgramError(f"{self.where}: delegate {a.delegate_index} num_outputs failed: {exc}") from exc
            if not 0 <= n <= len(a.args):
                raise ProgramError(f"{self.where}: delegate {a.delegate_index} declares {n} outputs but the call "
                                   f"has {len(a.args)} arguments")
            return n
        # The emitters append the delegate's outputs, fresh values, after its inputs: the outputs are the
        # trailing arguments that no earlier instruction, method input or constant defines.
        defined = self._defined_before(ci, ii)
        n = 0
        for idx in reversed(a.args):
            if idx in defined or self.kinds[idx] is not S.Tensor:
                break
            n += 1
        if n == 0:
            raise ProgramError(f"{self.where}: chains[{ci}].instructions[{ii}]: cannot tell the outputs of delegate "
                               f"{a.delegate_index} ({backend_id}) from its inputs")
        return n

    def _defined_before(self, ci: int, ii: int) -> set[int]:
        defined = set(self.input_indices)
        for i, sp in self.specs.items():
            if sp.constant is not None:
                defined.add(i)
        for chain in self.plan.chains[: ci + 1]:
            instrs = chain.instructions if chain is not self.plan.chains[ci] else chain.instructions[:ii]
            for instr in instrs:
                a = instr.instr_args
                if type(a) in (S.KernelCall, S.DelegateCall):
                    for idx in a.args:
                        defined.add(idx)
                        defined.update(self._tensor_items(idx))
                elif type(a) is S.MoveCall:
                    defined.add(a.move_to)
        return defined

    # ------------------------------------------------------------------------------------------ inputs/outputs
    def _build_io(self) -> None:
        kinds, specs = self.kinds, self.specs
        self.input_infos: list[TensorInfo | type] = []
        binders = []
        for k, idx in enumerate(self.input_indices):
            kind = kinds[idx]
            if kind is S.Tensor:
                sp = specs[idx]
                if sp.constant is not None:
                    raise self._err(f"inputs[{k}]: value {idx} is a constant tensor")
                self.input_infos.append(TensorInfo(sp.dtype, sp.sizes, sp.dynamic, sp.mem_id != 0, sp.dim_order))
                binders.append(self._tensor_binder(k, idx, sp))
            elif kind in (S.Int, S.Double, S.Bool, S.String):
                pytype = {S.Int: int, S.Double: float, S.Bool: bool, S.String: str}[kind]
                self.input_infos.append(pytype)
                binders.append(self._scalar_binder(k, idx, pytype))
            elif kind is S.Null:
                self.input_infos.append(type(None))
                binders.append(lambda vals, x: None)
            else:
                raise self._err(f"inputs[{k}]: value {idx} is a {kind.__name__}, which cannot be a method input")
        self.binders = binders
        self.output_infos: list[TensorInfo | type] = []
        for idx in self.output_indices:
            kind = kinds[idx]
            if kind is S.Tensor:
                sp = specs[idx]
                self.output_infos.append(TensorInfo(sp.dtype, sp.sizes, sp.dynamic, sp.mem_id != 0, sp.dim_order))
            else:
                self.output_infos.append({S.Int: int, S.Double: float, S.Bool: bool, S.String: str}.get(kind, object))

    def _tensor_binder(self, k: int, idx: int, sp: _TensorSpec) -> Callable[[list, Any], None]:
        dtype, sizes = sp.dtype, sp.sizes
        where = f"{self.where} input {k}"

        def check(a: np.ndarray) -> None:
            if a.dtype != dtype:
                raise RuntimeExecutionError(f"{where}: expected dtype {dtype}, got {a.dtype}")

        if sp.mem_id == 0:
            def bind_unplanned(vals, x):
                a = to_numpy(x)
                check(a)
                if not sp.dynamic and a.shape != sizes:
                    raise RuntimeExecutionError(f"{where}: expected shape {list(sizes)}, got {list(a.shape)}")
                vals[idx] = a

            return bind_unplanned
        if not sp.dynamic:
            def bind_static(vals, x):
                a = to_numpy(x)
                check(a)
                if a.shape != sizes:
                    raise RuntimeExecutionError(f"{where}: expected shape {list(sizes)}, got {list(a.shape)}")
                np.copyto(vals[idx], a)

            return bind_static
        cap = self.capacity[idx]

        def bind_dynamic(vals, x):
            a = to_numpy(x)
            check(a)
            if a.ndim != len(sizes) or any(s > b for s, b in zip(a.shape, sizes)):
                raise RuntimeExecutionError(
                    f"{where}: shape {list(a.shape)} exceeds the upper bound {list(sizes)} the program was exported with")
            v = resize(vals[cap], a.shape)
            np.copyto(v, a)
            vals[idx] = v

        return bind_dynamic

    def _scalar_binder(self, k: int, idx: int, pytype: type) -> Callable[[list, Any], None]:
        where = f"{self.where} input {k}"

        def bind(vals, x):
            if isinstance(x, np.ndarray) and x.ndim == 0:
                x = x.item()
            if pytype is float and isinstance(x, int) and not isinstance(x, bool):
                x = float(x)
            if not isinstance(x, pytype) or (pytype is int and isinstance(x, bool)):
                raise RuntimeExecutionError(f"{where}: expected {pytype.__name__}, got {type(x).__name__}")
            vals[idx] = x

        return bind

    # ------------------------------------------------------------------------------------------ contexts
    def new_context(self) -> _Context:
        try:
            return self._new_context()
        except (MemoryError, ValueError, OverflowError) as exc:
            raise RuntimeExecutionError(f"{self.where}: cannot allocate the method's memory: {exc}") from exc

    def _arena_extent(self) -> list[int]:
        """Bytes each arena needs: up to the end of its highest planned tensor (never more than declared)."""
        need = [0] * len(self.arena_sizes)
        for sp in self.specs.values():
            if sp.mem_id:
                need[sp.mem_id] = max(need[sp.mem_id], sp.offset + sp.nbytes)
        return [min(n, size) for n, size in zip(need, self.arena_sizes)]

    def _new_context(self) -> _Context:
        arenas = [np.zeros(0, np.uint8)] + [np.zeros(size, dtype=np.uint8) for size in self._arena_extent()[1:]]
        vals: list[Any] = list(self.static_template) + [None] * (self.num_slots - self.num_values)
        for i, sp in self.specs.items():
            if sp.constant is not None:
                continue
            if sp.mem_id:
                view = _logical_view(arenas[sp.mem_id], sp, sp.offset) if sp.nbytes else _empty_view(sp)
                if sp.initial is not None:
                    np.copyto(view, _logical_view(np.frombuffer(sp.initial, np.uint8), sp))
            else:
                view = _empty_view(sp)  # unplanned: private memory, replaced when an input binds it
            vals[i] = view
            if i in self.capacity:
                vals[self.capacity[i]] = view
        for i, ev in enumerate(self.plan.values):
            k = self.kinds[i]
            if k is S.TensorList:
                vals[i] = [vals[j] for j in ev.val.items]
                if i in self.tensorlist_capacity:
                    vals[self.tensorlist_capacity[i]] = [vals[self.capacity.get(j, j)] for j in ev.val.items]
            elif k is S.OptionalTensorList:
                vals[i] = [None if j < 0 else vals[j] for j in ev.val.items]
        return _Context(arenas, vals)

    def destroy(self) -> None:
        handles, self._handles = self._handles, []
        for executor, handle in handles:
            try:
                executor.destroy(handle)
            except Exception:  # noqa: BLE001,S110 - destroy must not raise during cleanup
                pass
        subs, self._sub_runners = self._sub_runners, []
        for r in subs:
            r.plan.destroy()


class _Context:
    __slots__ = ("arenas", "vals")

    def __init__(self, arenas: list[np.ndarray], vals: list[Any]) -> None:
        self.arenas = arenas
        self.vals = vals


def to_numpy(x: Any) -> np.ndarray:
    """A numpy view of ``x``: numpy arrays as they are, torch tensors without a copy (torch is never imported)."""
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__
    if mod.startswith("torch"):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.numpy()
    return np.asarray(x)


class MethodRunner:
    """Runs a :class:`MethodPlan`; a pool of execution contexts makes concurrent runs safe."""

    def __init__(self, plan: MethodPlan, max_idle_contexts: int = 8) -> None:
        self.plan = plan
        self._pool: list[_Context] = []
        self._lock = threading.Lock()
        self._max_idle = 1 if plan.stateful else max_idle_contexts
        self._state_lock = threading.Lock()
        try:  # allocate the first context now, so that unsatisfiable memory fails at load, not mid-run
            self._pool.append(plan.new_context())
        except RuntimeExecutionError as exc:
            raise ProgramError(str(exc)) from exc
        self._run_chains = [(ops, has_jump, labels) for ops, has_jump, labels in plan.chains]
        self.time_ops = False

    def _acquire(self) -> _Context:
        with self._lock:
            if self._pool:
                return self._pool.pop()
        return self.plan.new_context()

    def _release(self, ctx: _Context) -> None:
        with self._lock:
            if len(self._pool) < self._max_idle:
                self._pool.append(ctx)

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        if self.plan.stateful:
            # one set of planned memory holds the method's state: runs take turns
            with self._state_lock:
                return self._run(inputs)
        return self._run(inputs)

    def _run(self, inputs: Sequence[Any]) -> list[Any]:
        plan = self.plan
        if len(inputs) != len(plan.binders):
            raise RuntimeExecutionError(
                f"{plan.where}: expected {len(plan.binders)} inputs, got {len(inputs)}")
        t0 = time.perf_counter()
        ctx = self._acquire()
        try:
            vals = ctx.vals
            for bind, x in zip(plan.binders, inputs):
                bind(vals, x)
            with np.errstate(all="ignore"):
                for ops, has_jump, labels in self._run_chains:
                    if self.time_ops and not has_jump:
                        self._run_timed(ops, labels, vals)
                        continue
                    if has_jump:
                        self._run_with_jumps(ops, labels, vals)
                        continue
                    i = -1
                    try:
                        for i, (fn, get, post) in enumerate(ops):  # noqa: B007 - i names the failing op
                            r = fn(*get(vals))
                            if post is not None:
                                post(vals, r)
                    except Exception as exc:
                        raise self._wrap(exc, labels, i) from exc
            # copies: the context (and its arenas) goes back to the pool for the next run
            outs = [np.array(vals[i]) if isinstance(vals[i], np.ndarray) else vals[i] for i in plan.output_indices]
        finally:
            self._release(ctx)
        prof = plan.profile
        prof.runs += 1
        prof.last_run_seconds = time.perf_counter() - t0
        return outs

    def _run_timed(self, ops: list[tuple], labels: list[str], vals: list) -> None:
        prof = self.plan.profile
        secs, calls = prof.op_seconds, prof.op_calls
        clock = time.perf_counter
        i = -1
        try:
            for i, (fn, get, post) in enumerate(ops):  # noqa: B007
                t = clock()
                r = fn(*get(vals))
                if post is not None:
                    post(vals, r)
                dt = clock() - t
                label = labels[i]
                key = label[label.find("(") + 1:-1] if "(" in label else label
                secs[key] = secs.get(key, 0.0) + dt
                calls[key] = calls.get(key, 0) + 1
        except Exception as exc:
            raise self._wrap(exc, labels, i) from exc

    def _run_with_jumps(self, ops: list[tuple], labels: list[str], vals: list) -> None:
        pc = 0
        n = len(ops)
        steps = 0
        try:
            while pc < n:
                fn, get, post = ops[pc]
                steps += 1
                if steps > MAX_STEPS:
                    raise RuntimeExecutionError(f"ran {MAX_STEPS} instructions without finishing (endless loop?)")
                if fn is _JUMP:
                    cond = vals[get]
                    if isinstance(cond, np.ndarray):
                        cond = bool(cond.reshape(-1)[0]) if cond.size else False
                    pc = pc + 1 if cond else post
                    continue
                r = fn(*get(vals))
                if post is not None:
                    post(vals, r)
                pc += 1
        except Exception as exc:
            raise self._wrap(exc, labels, pc) from exc

    def _wrap(self, exc: Exception, labels: list[str], i: int) -> RuntimeExecutionError:
        where = labels[i] if 0 <= i < len(labels) else "?"
        if isinstance(exc, RuntimeExecutionError):
            msg = str(exc)
        else:
            msg = f"{type(exc).__name__}: {exc}"
        return RuntimeExecutionError(f"{self.plan.where} {where}: {msg}")
