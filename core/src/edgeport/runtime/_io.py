"""Method inputs: a binder per input checks the value given to ``execute`` and puts it into its slot: copied
into planned memory, or bound as it is when the input is not memory-planned or when only delegates read it
(:func:`borrowable_inputs`; executors never write their inputs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgeport.errors import RuntimeExecutionError
from edgeport.program import schema as S
from edgeport.runtime._instructions import InstructionAnalysis
from edgeport.runtime._memory import MemoryLayout
from edgeport.runtime._values import MethodValues, TensorSpec
from edgeport.runtime.kernel_utils import resize

__all__ = ["Binder", "borrowable_inputs", "input_binders", "to_numpy"]

#: ``bind(vals, x)``: check input ``x`` and store it into the value slots ``vals``
Binder = Callable[[list, Any], None]

_ndarray = np.ndarray

_SCALAR_TYPES: dict[type, type] = {S.Int: int, S.Double: float, S.Bool: bool, S.String: str}


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


def borrowable_inputs(mv: MethodValues, plan: S.ExecutionPlan, analysis: InstructionAnalysis,
                      delegate_inputs: set[int], delegate_outputs: set[int]) -> set[int]:
    """Statically planned tensor inputs that ``execute`` may bind as the caller's array instead of copying it
    into planned memory: read by delegate calls only (which never write their inputs), never a method output,
    never written, moved, listed, used as a condition, or carrying state."""
    touched: set[int] = set(plan.outputs) | delegate_outputs | analysis.state_tensors
    for info in analysis.kernel_calls():
        for idx in (*info.params, *info.rets):
            touched.add(idx)
            touched.update(mv.tensor_items(idx))
    for chain in plan.chains:
        for instr in chain.instructions:
            a = instr.instr_args
            if type(a) is S.MoveCall:
                touched.update((a.move_from, a.move_to))
            elif type(a) is S.JumpFalseCall:
                touched.add(a.cond_value_index)
    for i in range(len(mv.values)):
        if mv.kinds[i] in (S.TensorList, S.OptionalTensorList):
            touched.update(mv.items(i))
    found = set()
    for idx in plan.inputs:
        sp = mv.specs.get(idx)
        if (sp is not None and sp.mem_id and not sp.dynamic and sp.constant is None and idx in delegate_inputs
                and idx not in touched and list(plan.inputs).count(idx) == 1):
            found.add(idx)
    return found


def input_binders(mv: MethodValues, inputs: list[int], layout: MemoryLayout,
                  borrowed: set[int] = frozenset()) -> list[Binder]:
    """One binder per method input; raises ``ProgramError`` for a value that cannot be an input. Inputs in
    ``borrowed`` bind the caller's array (after the dtype and shape checks) instead of copying it."""
    binders: list[Binder] = []
    for k, idx in enumerate(inputs):
        kind = mv.kinds[idx]
        if kind is S.Tensor:
            sp = mv.specs[idx]
            if sp.constant is not None:
                raise mv.err(f"inputs[{k}]: value {idx} is a constant tensor")
            binders.append(_tensor_binder(f"{mv.where} input {k}", idx, sp, layout, idx in borrowed))
        elif kind in _SCALAR_TYPES:
            binders.append(_scalar_binder(f"{mv.where} input {k}", idx, _SCALAR_TYPES[kind]))
        elif kind is S.Null:
            binders.append(lambda vals, x: None)
        else:
            raise mv.err(f"inputs[{k}]: value {idx} is a {kind.__name__}, which cannot be a method input")
    return binders


def _tensor_binder(where: str, idx: int, sp: TensorSpec, layout: MemoryLayout, borrow: bool) -> Binder:
    dtype, sizes = sp.dtype, sp.sizes

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
    if borrow:
        def bind_borrowed(vals, x):
            a = x if type(x) is _ndarray else to_numpy(x)
            if a.dtype is not dtype and a.dtype != dtype:
                check(a)
            if a.shape != sizes:
                raise RuntimeExecutionError(f"{where}: expected shape {list(sizes)}, got {list(a.shape)}")
            vals[idx] = a

        return bind_borrowed
    if not sp.dynamic:
        def bind_static(vals, x):
            a = x if type(x) is _ndarray else to_numpy(x)
            if a.dtype is not dtype and a.dtype != dtype:
                check(a)
            if a.shape != sizes:
                raise RuntimeExecutionError(f"{where}: expected shape {list(sizes)}, got {list(a.shape)}")
            np.copyto(vals[idx], a)

        return bind_static
    cap = layout.capacity[idx]

    fits: set[tuple[int, ...]] = set()  # shapes checked against the upper bound before (a few per program)

    def bind_dynamic(vals, x):
        a = x if type(x) is _ndarray else to_numpy(x)
        if a.dtype is not dtype and a.dtype != dtype:
            check(a)
        shape = a.shape
        if shape not in fits:
            if a.ndim != len(sizes) or any(s > b for s, b in zip(shape, sizes)):
                raise RuntimeExecutionError(
                    f"{where}: shape {list(shape)} exceeds the upper bound {list(sizes)} the program was exported with")
            if len(fits) < 64:
                fits.add(shape)
        v = resize(vals[cap], shape)
        np.copyto(v, a)
        vals[idx] = v

    return bind_dynamic


def _scalar_binder(where: str, idx: int, pytype: type) -> Binder:
    def bind(vals, x):
        if isinstance(x, np.ndarray) and x.ndim == 0:
            x = x.item()
        if pytype is float and isinstance(x, int) and not isinstance(x, bool):
            x = float(x)
        if not isinstance(x, pytype) or (pytype is int and isinstance(x, bool)):
            raise RuntimeExecutionError(f"{where}: expected {pytype.__name__}, got {type(x).__name__}")
        vals[idx] = x

    return bind
