"""Semantic checks of a :class:`Program` beyond what ``load_pte`` checks: indices and tensor metadata.

``load_pte`` guarantees the file is structurally sound and that segment, constant and delegate-data indices
resolve. :func:`verify_program` checks what a runtime relies on before executing anything: every value index
in plans, chains, instructions and lists; operator and delegate indices; jump targets; and tensors (known scalar
type, non-negative sizes, ``dim_order`` a permutation of ``range(rank)``, planned memory inside its arena).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from edgeport.errors import ProgramError
from edgeport.program import schema
from edgeport.program.schema import (
    Bool,
    DelegateCall,
    FreeCall,
    Int,
    IntList,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    Null,
    OptionalTensorList,
    Program,
    ScalarType,
    Tensor,
    TensorList,
    TensorShapeDynamism,
)

__all__ = ["program_problems", "verify_program"]

_SCALAR_TYPES = frozenset(int(s) for s in ScalarType)
_DYNAMISMS = frozenset(int(s) for s in TensorShapeDynamism)


def verify_program(program: Program) -> None:
    """Raise ``ProgramError`` describing the first problem found (and how many there are), if any."""
    problems = []
    for problem in program_problems(program):
        problems.append(problem)
        if len(problems) > 20:
            break
    if problems:
        more = f" (and {len(problems) - 1}{'+' if len(problems) > 20 else ''} more)" if len(problems) > 1 else ""
        raise ProgramError(problems[0] + more)


def program_problems(program: Program) -> Iterator[str]:
    """Yield one message per problem, each starting with its location."""
    for pi, plan in enumerate(program.execution_plan):
        yield from _plan_problems(plan, f"execution_plan[{pi}]")


def _plan_problems(plan: schema.ExecutionPlan, where: str) -> Iterator[str]:
    values = plan.values
    n = len(values)
    arenas = plan.non_const_buffer_sizes
    for i, size in enumerate(arenas):
        if size < 0:
            yield f"{where}.non_const_buffer_sizes[{i}]: negative size {size}"

    def index(idx: int, at: str, *kinds: type) -> Iterator[str]:
        if not 0 <= idx < n:
            yield f"{at}: value index {idx} out of range ({n} values)"
        elif kinds and type(values[idx].val) not in kinds:
            names = "/".join(k.__name__ for k in kinds)
            yield f"{at}: value {idx} is {type(values[idx].val).__name__}, expected {names}"

    for k, idx in enumerate(plan.inputs):
        yield from index(idx, f"{where}.inputs[{k}]")
    for k, idx in enumerate(plan.outputs):
        yield from index(idx, f"{where}.outputs[{k}]")

    for vi, value in enumerate(values):
        at = f"{where}.values[{vi}]"
        v = value.val
        kind = type(v)
        if kind is Tensor:
            yield from _tensor_problems(v, at, arenas)
        elif kind is IntList:
            for k, item in enumerate(v.items):
                yield from index(item, f"{at}.items[{k}]", Int)
        elif kind is TensorList:
            for k, item in enumerate(v.items):
                yield from index(item, f"{at}.items[{k}]", Tensor)
        elif kind is OptionalTensorList:
            for k, item in enumerate(v.items):
                if item != -1:
                    yield from index(item, f"{at}.items[{k}]", Tensor, Null)

    for ci, chain in enumerate(plan.chains):
        cw = f"{where}.chains[{ci}]"
        for k, idx in enumerate(chain.inputs):
            yield from index(idx, f"{cw}.inputs[{k}]")
        for k, idx in enumerate(chain.outputs):
            yield from index(idx, f"{cw}.outputs[{k}]")
        count = len(chain.instructions)
        for ii, instr in enumerate(chain.instructions):
            at = f"{cw}.instructions[{ii}]"
            a = instr.instr_args
            kind = type(a)
            if kind is KernelCall:
                if not 0 <= a.op_index < len(plan.operators):
                    yield f"{at}: op_index {a.op_index} out of range ({len(plan.operators)} operators)"
                for k, idx in enumerate(a.args):
                    yield from index(idx, f"{at}.args[{k}]")
            elif kind is DelegateCall:
                if not 0 <= a.delegate_index < len(plan.delegates):
                    yield f"{at}: delegate_index {a.delegate_index} out of range ({len(plan.delegates)} delegates)"
                for k, idx in enumerate(a.args):
                    yield from index(idx, f"{at}.args[{k}]")
            elif kind is MoveCall:
                yield from index(a.move_from, f"{at}.move_from")
                yield from index(a.move_to, f"{at}.move_to")
            elif kind is JumpFalseCall:
                yield from index(a.cond_value_index, f"{at}.cond_value_index", Bool, Tensor)
                if not 0 <= a.destination_instruction <= count:
                    yield f"{at}: destination_instruction {a.destination_instruction} out of range (0..{count})"
            elif kind is FreeCall:
                yield from index(a.value_index, f"{at}.value_index", Tensor)
            else:
                yield f"{at}: unknown instruction {kind.__name__}"

    for oi, op in enumerate(plan.operators):
        if not op.name:
            yield f"{where}.operators[{oi}]: empty operator name"
    for di, d in enumerate(plan.delegates):
        if not d.id:
            yield f"{where}.delegates[{di}]: empty backend id"


def _tensor_problems(t: Tensor, at: str, arenas: list[int]) -> Iterator[str]:
    known_type = int(t.scalar_type) in _SCALAR_TYPES
    if not known_type:
        yield f"{at}: unknown scalar_type {int(t.scalar_type)}"
    if int(t.shape_dynamism) not in _DYNAMISMS:
        yield f"{at}: unknown shape_dynamism {int(t.shape_dynamism)}"
    rank = len(t.sizes)
    negative = [s for s in t.sizes if s < 0]
    if negative:
        yield f"{at}: negative sizes {t.sizes}"
    if sorted(t.dim_order) != list(range(rank)):
        yield f"{at}: dim_order {t.dim_order} is not a permutation of range({rank}) (sizes {t.sizes})"
    info = t.allocation_info
    if info is None:
        return
    if not 1 <= info.memory_id < len(arenas):
        yield (f"{at}: allocation_info.memory_id {info.memory_id} out of range "
               f"(1..{len(arenas) - 1} for non_const_buffer_sizes {arenas})")
        return
    if known_type and not negative and t.shape_dynamism != TensorShapeDynamism.DYNAMIC_UNBOUND:
        nbytes = math.prod(t.sizes) * schema.element_size(t.scalar_type)
        end = info.memory_offset + nbytes
        if end > arenas[info.memory_id]:
            yield (f"{at}: planned memory [{info.memory_offset}, {end}) runs past arena {info.memory_id} "
                   f"({arenas[info.memory_id]} bytes)")
