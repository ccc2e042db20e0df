"""Human-readable views of a program: a condensed or field-by-field dump, and the delegation summary."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from edgeport.program import schema as S


def _fmt(obj: Any, indent: int) -> str:
    pad = "  " * indent
    if dataclasses.is_dataclass(obj):
        fields = [f"{pad}  {f.name}={_fmt(getattr(obj, f.name), indent + 1).lstrip()}" for f in dataclasses.fields(obj)]
        return f"{pad}{type(obj).__name__}(\n" + ",\n".join(fields) + f"\n{pad})"
    if isinstance(obj, list) and obj and dataclasses.is_dataclass(obj[0]):
        return f"{pad}[\n" + ",\n".join(_fmt(x, indent + 1) for x in obj) + f"\n{pad}]"
    if isinstance(obj, (bytes, bytearray)):
        return f"{pad}<{len(obj)} bytes>"
    return f"{pad}{obj!r}"


def _value(v: S.EValue) -> str:
    val = v.val
    if isinstance(val, S.Tensor):
        where = (f"const[{val.data_buffer_idx}]" if val.data_buffer_idx else
                 f"mem{val.allocation_info.memory_id}+{val.allocation_info.memory_offset_low}"
                 if val.allocation_info else "unplanned")
        return f"Tensor<{S.scalar_type_name(val.scalar_type)}{list(val.sizes)} @{where}>"
    if isinstance(val, (S.Int, S.Bool, S.Double, S.String)):
        return repr(getattr(val, dataclasses.fields(val)[0].name))
    if val is None or isinstance(val, S.Null):
        return "None"
    return f"{type(val).__name__}{list(val.items)}"


def format_program(program: S.Program, verbose: bool = False) -> str:
    if verbose:
        return _fmt(program, 0)
    lines = [f"Program (version {program.version}, {len(program.execution_plan)} methods)"]
    for plan in program.execution_plan:
        lines.append(f"method {plan.name}: inputs {plan.inputs} outputs {plan.outputs} "
                     f"arena {plan.non_const_buffer_sizes}")
        for i, v in enumerate(plan.values):
            lines.append(f"  %{i} = {_value(v)}")
        for chain in plan.chains:
            for k, ins in enumerate(chain.instructions):
                a = ins.instr_args
                if isinstance(a, S.KernelCall):
                    op = plan.operators[a.op_index]
                    lines.append(f"  [{k}] {op.name}{'.' + op.overload if op.overload else ''}({', '.join(f'%{x}' for x in a.args)})")
                elif isinstance(a, S.DelegateCall):
                    d = plan.delegates[a.delegate_index]
                    lines.append(f"  [{k}] delegate {d.id}({', '.join(f'%{x}' for x in a.args)})")
                else:
                    lines.append(f"  [{k}] {a}")
    return "\n".join(lines)


def delegation_summary(program: S.Program, memory_reports: Sequence[Any] = (),
                       delegate_summaries: Mapping[tuple[int, int], str] | None = None) -> str:
    lines = []
    reports = {r.method: r for r in memory_reports}
    for pi, plan in enumerate(program.execution_plan):
        delegated: Counter[str] = Counter()
        kernels: Counter[str] = Counter()
        for chain in plan.chains:
            for ins in chain.instructions:
                a = ins.instr_args
                if isinstance(a, S.DelegateCall):
                    delegated[plan.delegates[a.delegate_index].id] += 1
                elif isinstance(a, S.KernelCall):
                    op = plan.operators[a.op_index]
                    kernels[op.name + ("." + op.overload if op.overload else "")] += 1
        total = sum(delegated.values()) + sum(kernels.values())
        lines.append(f"method {plan.name!r}: {total} instructions, {sum(delegated.values())} delegate calls, "
                     f"{sum(kernels.values())} portable kernel calls")
        for backend, n in sorted(delegated.items()):
            lines.append(f"  delegated to {backend}: {n} call(s)")
            for di, d in enumerate(plan.delegates):
                text = (delegate_summaries or {}).get((pi, di))
                if d.id == backend and text:
                    lines.append(f"    delegate {di}: {text}")
        for op, n in sorted(kernels.items()):
            lines.append(f"  portable {op}: {n}")
        if plan.name in reports:
            lines.append(f"  memory: {reports[plan.name]}")
    return "\n".join(lines)
