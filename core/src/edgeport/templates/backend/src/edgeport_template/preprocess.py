"""TemplateBackend's ``preprocess``: an edge-dialect partition -> a versioned blob (see ``schema/README.md``).

edgeport calls it once per delegated partition with the partition as an ``ExportedProgram`` and the compile specs
of its ``DelegationSpec``. It must accept exactly what the partitioner tagged; anything else raises
:class:`edgeport.LoweringError` naming the node.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from edgeport import CompileSpec, LoweringError, PreprocessResult
from edgeport.aot.capability_partitioner import dtype_name, op_name
from edgeport_template import schema
from edgeport_template.capabilities import BACKEND_ID
from edgeport_template.options import TemplateCompileOptions


def _encode(value: Any, where: str) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"ref": value.name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_encode(v, where) for v in value]
    raise LoweringError(f"{where}: cannot encode argument {value!r} ({type(value).__name__})")


def _schema_args(node: torch.fx.Node) -> list[Any]:
    """The node's arguments in schema order, keyword-only arguments and defaults filled in."""
    out: list[Any] = []
    for i, arg in enumerate(node.target._schema.arguments):  # type: ignore[union-attr]
        if i < len(node.args) and not arg.kwarg_only:
            out.append(node.args[i])
        elif arg.name in node.kwargs:
            out.append(node.kwargs[arg.name])
        elif arg.has_default_value():
            out.append(arg.default_value)
        else:
            raise LoweringError(f"node {node.name!r}: missing argument {arg.name!r} of {op_name(node.target)}")
    return out


def _shape(val: torch.Tensor) -> list[int | None]:
    return [int(d) if isinstance(d, int) else None for d in val.shape]


def preprocess(edge_program: ExportedProgram, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
    """Serialize one partition for :class:`edgeport_template.runtime.TemplateExecutor`."""
    from edgeport_template import __version__
    from edgeport_template.partitioner import TemplatePartitioner

    try:
        options = TemplateCompileOptions.from_compile_specs(list(compile_specs))
    except (ValueError, TypeError) as exc:
        raise LoweringError(f"{BACKEND_ID}: bad compile specs: {exc}") from exc
    sig = edge_program.graph_signature
    for spec in sig.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            raise LoweringError(f"{BACKEND_ID} cannot lower a partition that mutates state ({spec.kind.name})")
    input_specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    checker = TemplatePartitioner(options)  # the partitioner's own support check: both sides agree
    gm = edge_program.graph_module

    program: dict[str, list[Any]] = {"inputs": [], "constants": [], "nodes": [], "outputs": []}
    data = bytearray()
    debug_handles: dict[int | str, tuple[int, ...]] = {}

    def add_constant(name: str, tensor: Any) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
            raise LoweringError(f"constant {name!r} has no data ({type(tensor).__name__})")
        dtype = dtype_name(tensor.dtype)
        if dtype not in schema.DTYPES:
            raise LoweringError(f"constant {name!r}: dtype {dtype} cannot be stored ({sorted(schema.DTYPES)})")
        raw = tensor.detach().cpu().contiguous().numpy().astype(schema.DTYPES[dtype], copy=False).tobytes()
        offset = schema.align(len(data))
        data.extend(bytes(offset - len(data)))
        data.extend(raw)
        program["constants"].append(
            {"name": name, "dtype": dtype, "shape": list(tensor.shape), "offset": offset, "nbytes": len(raw)}
        )

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            spec = input_specs.get(node.name)
            kind = spec.kind if spec is not None else InputKind.USER_INPUT
            if kind == InputKind.USER_INPUT:
                val = node.meta.get("val")
                if not isinstance(val, torch.Tensor) or dtype_name(val.dtype) not in schema.DTYPES:
                    raise LoweringError(f"input {node.name!r} is not a tensor {BACKEND_ID} can take")
                program["inputs"].append({"name": node.name, "dtype": dtype_name(val.dtype), "shape": _shape(val)})
            elif node.users:
                if kind in (InputKind.PARAMETER, InputKind.BUFFER) and spec.target in edge_program.state_dict:
                    add_constant(node.name, edge_program.state_dict[spec.target])
                elif spec.target in edge_program.constants:
                    add_constant(node.name, edge_program.constants[spec.target])
                else:
                    raise LoweringError(f"input {node.name!r} ({kind.name}) has no data to embed")
        elif node.op == "get_attr":
            obj: Any = gm
            for part in str(node.target).split("."):
                obj = getattr(obj, part, None)
            add_constant(node.name, obj)
        elif node.op == "call_function":
            if node.target is operator.getitem:
                raise LoweringError(f"node {node.name!r}: multi-output ops are not supported by {BACKEND_ID}")
            why = checker.check_node(node)
            if why is not None:
                raise LoweringError(f"node {node.name!r} cannot be lowered to {BACKEND_ID}: {why}")
            where = f"node {node.name!r}"
            program["nodes"].append(
                {"op": op_name(node.target), "args": [_encode(a, where) for a in _schema_args(node)],
                 "output": node.name}
            )
            if isinstance(node.meta.get("debug_handle"), int):
                debug_handles[node.name] = (node.meta["debug_handle"],)
        elif node.op == "output":
            results = node.args[0]
            for value in (results,) if isinstance(results, torch.fx.Node) else results:
                if not isinstance(value, torch.fx.Node):
                    raise LoweringError(f"output {value!r} is not a tensor; {BACKEND_ID} returns tensors only")
                program["outputs"].append(value.name)
        else:
            raise LoweringError(f"node {node.name!r}: {node.op} nodes are not supported by {BACKEND_ID}")

    blob = schema.pack(program, bytes(data), plugin_version=__version__, target=options.target, backend_id=BACKEND_ID)
    return PreprocessResult(processed_bytes=blob, debug_handle_map=debug_handles or None)
