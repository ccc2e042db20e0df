"""``edgeport inspect``: what a ``.pte`` holds, for edgeport's programs and ExecuTorch's alike (torch-free).

:func:`inspect_program` returns a JSON-able dict: the file's sections and their sizes, every method's inputs,
outputs, instructions by kind and operator, delegates (with their backend's ``describe_blob`` when that backend
is installed), named data, and constants stored outside the program (``.ptd`` keys). :func:`format_inspection`
renders it as text.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from edgeport.program import schema as S
from edgeport.program.loaded import tensor_nbytes

__all__ = ["format_inspection", "inspect_program"]


def _dtype(t: S.Tensor) -> str:
    try:
        return S.ScalarType(int(t.scalar_type)).name.lower()
    except ValueError:
        return f"scalar type {int(t.scalar_type)}"


def _value(plan: S.ExecutionPlan, index: int) -> dict[str, Any]:
    val = plan.values[index].val if 0 <= index < len(plan.values) else None
    if isinstance(val, S.Tensor):
        info: dict[str, Any] = {"kind": "tensor", "dtype": _dtype(val), "shape": list(val.sizes)}
        if val.shape_dynamism != S.TensorShapeDynamism.STATIC:
            info["dynamic"] = "upper bound" if val.shape_dynamism == S.TensorShapeDynamism.DYNAMIC_BOUND else "unbound"
        return info
    return {"kind": type(val).__name__.lower() if val is not None else "none"}


def describe_delegate(backend_id: str, blob: memoryview, named_data: Any = None) -> dict[str, Any]:
    """What the backend's ``describe_blob`` says of one delegate blob (``{"error": ...}`` when it cannot)."""
    import inspect

    from edgeport.errors import BackendNotFoundError
    from edgeport.registry import get_backend

    try:
        spec = get_backend(backend_id)
    except BackendNotFoundError:
        return {"error": f"backend {backend_id!r} is not installed here: no description"}
    if spec.describe_blob is None:
        return {"error": f"backend {backend_id!r} has no describe_blob"}
    try:
        try:
            takes_named_data = "named_data" in inspect.signature(spec.describe_blob).parameters
        except (TypeError, ValueError):
            takes_named_data = False
        if takes_named_data and named_data is not None:  # e.g. estimates a backend keeps beside its blob
            return dict(spec.describe_blob(blob, named_data=named_data))
        return dict(spec.describe_blob(blob))
    except ValueError as exc:
        return {"error": f"the blob is not valid for {backend_id}: {exc}"}


def _method(lp: Any, pi: int, plan: S.ExecutionPlan, describe: bool) -> dict[str, Any]:
    kinds: Counter[str] = Counter()
    operators: Counter[str] = Counter()
    for chain in plan.chains:
        for ins in chain.instructions:
            args = ins.instr_args
            kinds[type(args).__name__] += 1
            if isinstance(args, S.KernelCall) and 0 <= args.op_index < len(plan.operators):
                op = plan.operators[args.op_index]
                operators[f"{op.name}.{op.overload}" if op.overload else op.name] += 1
    delegates = []
    for di, d in enumerate(plan.delegates):
        blob = lp.delegate_data(pi, di)
        entry: dict[str, Any] = {"index": di, "backend": d.id, "blob_bytes": len(blob),
                                 "compile_specs": sorted(cs.key for cs in d.compile_specs)}
        if describe:
            entry["description"] = describe_delegate(d.id, blob, getattr(lp, "named_data", None))
        delegates.append(entry)
    external = []
    for vi, value in enumerate(plan.values):
        t = value.val
        info = t.extra_tensor_info if isinstance(t, S.Tensor) else None
        if info is not None and int(info.location) == int(S.TensorDataLocation.EXTERNAL):
            external.append({"value": vi, "key": info.fully_qualified_name, "dtype": _dtype(t),
                             "shape": list(t.sizes), "bytes": tensor_nbytes(t, f"values[{vi}]")})
    return {
        "name": plan.name,
        "inputs": [_value(plan, i) for i in plan.inputs],
        "outputs": [_value(plan, i) for i in plan.outputs],
        "values": len(plan.values),
        "instructions": dict(sorted(kinds.items())),
        "operators": dict(operators.most_common()),
        "delegates": delegates,
        "external_constants": external,
        "planned_memory_bytes": sum(plan.non_const_buffer_sizes[1:]) if plan.non_const_buffer_sizes else 0,
    }


def inspect_program(data: Any, *, describe: bool = True) -> dict[str, Any]:
    """Everything :mod:`edgeport inspect <edgeport.cli>` shows about the program in ``data`` (path or bytes).

    ``describe``: ask each delegate's backend (when installed) to describe its blob. Raises ``ProgramError`` for a
    malformed file.
    """
    import os

    from edgeport.program import load_pte

    raw = open(data, "rb").read() if isinstance(data, (str, os.PathLike)) else bytes(data)
    lp = load_pte(raw)
    p = lp.program
    segments = [len(s) for s in lp.segments]
    delegate_segments = {d.processed.index for plan in p.execution_plan for d in plan.delegates
                         if d.processed is not None and d.processed.location == S.DataLocation.SEGMENT}
    named = [{"key": nd.key, "bytes": segments[nd.segment_index], "segment": nd.segment_index}
             for nd in p.named_data or []]
    constant_index = p.constant_segment.segment_index if p.constant_segment and p.constant_segment.offsets else None
    sections = {
        "flatbuffer": lp.program_size,
        "constant_segment": segments[constant_index] if constant_index is not None and segments else 0,
        "inline_constants": sum(len(c) for c in lp.inline_constants),
        "delegate_segments": sum(segments[i] for i in delegate_segments if i < len(segments)),
        "inline_delegate_data": sum(len(c) for c in lp.inline_delegate_data),
        "named_data": sum(segments[i] for i in {nd.segment_index for nd in p.named_data or []}),
        "mutable_data": sum(segments[s.segment_index] for s in p.mutable_data_segments or []),
    }
    sections["padding_and_other"] = len(raw) - sum(sections.values())
    return {
        "file_bytes": len(raw),
        "version": p.version,
        "extended_header": lp.header is not None,
        "segments": len(segments),
        "sections": sections,
        "constants": max(lp.num_constants - 1, 0),
        "methods": [_method(lp, pi, plan, describe) for pi, plan in enumerate(p.execution_plan)],
        "named_data": named,
        "external_keys": sorted({e["key"] for pi, plan in enumerate(p.execution_plan)
                                 for e in _method(lp, pi, plan, False)["external_constants"]}),
    }


def _shape(v: dict[str, Any]) -> str:
    if v.get("kind") != "tensor":
        return v.get("kind", "?")
    dyn = " (dynamic, upper bound)" if v.get("dynamic") else ""
    return f"{v['dtype']}{v['shape']}{dyn}"


def _for_people(value: Any, items: int = 3) -> str:
    """A long list as its count and a few entries (keys shortened), a long text cut: every value stays whole in
    ``edgeport inspect --json``."""
    if isinstance(value, (list, tuple)) and len(value) > items + 1:
        shown = ", ".join(_short(v) for v in value[:items])
        return f"{len(value)} entries: {shown}, ... (all of them with --json)"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    text = str(value)
    return text if len(text) <= 160 else text[:157] + "..."


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 20 else text[:12] + "..." + text[-4:]


def format_inspection(info: dict[str, Any]) -> str:
    """The text ``edgeport inspect`` prints."""
    lines = [f"program: {info['file_bytes']} bytes, {info['segments']} segments, {info['constants']} constants"]
    lines.append("sections: " + ", ".join(f"{k} {v}" for k, v in info["sections"].items() if v))
    for m in info["methods"]:
        lines.append(f"method {m['name']!r}: {len(m['inputs'])} inputs, {len(m['outputs'])} outputs, "
                     f"planned memory {m['planned_memory_bytes']} bytes")
        lines += [f"  input {i}: {_shape(v)}" for i, v in enumerate(m["inputs"])]
        lines += [f"  output {i}: {_shape(v)}" for i, v in enumerate(m["outputs"])]
        lines.append("  instructions: " + ", ".join(f"{k} {n}" for k, n in m["instructions"].items()))
        if m["operators"]:
            lines.append("  kernels: " + ", ".join(f"{k} {n}" for k, n in m["operators"].items()))
        for d in m["delegates"]:
            lines.append(f"  delegate {d['index']}: {d['backend']}, blob {d['blob_bytes']} bytes")
            for key, value in (d.get("description") or {}).items():
                lines.append(f"      {key}: {_for_people(value)}")
        for e in m["external_constants"]:
            lines.append(f"  external constant {e['key']!r}: {e['dtype']}{e['shape']} ({e['bytes']} bytes, in a .ptd)")
    if info["named_data"]:
        total = sum(n["bytes"] for n in info["named_data"])
        lines.append(f"named data: {len(info['named_data'])} keys, {total} bytes")
    return "\n".join(lines)
