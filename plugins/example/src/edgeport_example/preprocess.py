"""ExampleBackend's ``preprocess``: an edge sub-program -> a readable, versioned blob (see :mod:`.format`)."""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from edgeport.aot.capability_partitioner import dtype_name, op_name
from edgeport.backend import CompileSpec, PreprocessResult
from edgeport.errors import LoweringError
from edgeport_example import format as fmt
from edgeport_example._version import __version__
from edgeport_example.capabilities import BACKEND_ID
from edgeport_example.options import ExampleCompileOptions


def _checker():  # the partitioner's support check, reused so preprocess and partitioner agree
    from edgeport_example.partitioner import ExamplePartitioner

    return ExamplePartitioner()


def _encode(value: Any, where: str) -> Any:
    """An argument as JSON: ``{"value": name}`` for a graph value, else a JSON literal."""
    if isinstance(value, torch.fx.Node):
        return {"value": value.name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_encode(v, where) for v in value]
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    raise LoweringError(f"{where}: cannot encode argument {value!r} of type {type(value).__name__}")


def _full_args(node: torch.fx.Node) -> list[Any]:
    """The node's arguments in schema order, with keyword-only arguments and defaults filled in."""
    schema = node.target._schema  # type: ignore[union-attr]
    out: list[Any] = []
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            out.append(node.args[i])
        elif arg.name in node.kwargs:
            out.append(node.kwargs[arg.name])
        elif arg.has_default_value():
            out.append(arg.default_value)
        else:
            raise LoweringError(
                f"node {node.name!r}: missing argument {arg.name!r} of {op_name(node.target)}"
            )
    return out


def _shape(val: Any) -> list[int | None]:
    return [int(d) if isinstance(d, int) else None for d in val.shape]


def _tensor_bytes(name: str, tensor: Any) -> tuple[str, list[int], bytes]:
    if not isinstance(tensor, torch.Tensor):
        raise LoweringError(f"constant {name!r} is a {type(tensor).__name__}, not a tensor")
    if isinstance(tensor, torch._subclasses.fake_tensor.FakeTensor) or tensor.device.type == "meta":
        raise LoweringError(f"constant {name!r} has no data (fake or meta tensor); lower the real program")
    dtype = dtype_name(tensor.dtype)
    if dtype not in fmt.DTYPES:
        raise LoweringError(
            f"constant {name!r}: dtype {dtype} cannot be stored (supported: {sorted(fmt.DTYPES)})"
        )
    array = tensor.detach().cpu().contiguous().numpy()
    return dtype, list(tensor.shape), array.astype(fmt.DTYPES[dtype], copy=False).tobytes()


def _dump(document: dict[str, Any]) -> str:
    """JSON with one top-level key per line and one list item (input, constant, node) per line."""
    lines = []
    for key, value in document.items():
        if isinstance(value, list) and value:
            items = ",\n".join("    " + json.dumps(v) for v in value)
            lines.append(f"  {json.dumps(key)}: [\n{items}\n  ]")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def preprocess(edge_program: ExportedProgram, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
    """Serialize ``edge_program`` (an edge-dialect sub-program) for :class:`~edgeport_example.runtime.ExampleExecutor`.

    Placeholders are the delegate's user inputs, or parameters/buffers/constants whose data is embedded. Every
    ``call_function`` node must pass ExampleBackend's capability check; otherwise :class:`LoweringError` names
    the node. Unknown compile specs raise :class:`LoweringError` too.
    """
    try:
        options = ExampleCompileOptions.from_compile_specs(list(compile_specs))
    except ValueError as exc:
        raise LoweringError(f"{BACKEND_ID}: {exc}") from exc

    sig = edge_program.graph_signature
    for out_spec in sig.output_specs:
        if out_spec.kind != OutputKind.USER_OUTPUT:
            raise LoweringError(
                f"{BACKEND_ID} cannot lower a program that mutates state ({out_spec.kind.name} output "
                f"{out_spec.arg}); keep mutated buffers out of the partition"
            )
    specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    gm = edge_program.graph_module
    checker = _checker()

    inputs: list[str] = []
    input_specs: list[dict[str, Any]] = []
    constants: list[dict[str, Any]] = []
    data = bytearray()
    nodes: list[dict[str, Any]] = []
    outputs: list[str] = []
    debug_handles: dict[int | str, tuple[int, ...]] = {}

    def add_constant(name: str, tensor: Any) -> None:
        dtype, shape, raw = _tensor_bytes(name, tensor)
        offset = fmt.align(len(data))
        data.extend(bytes(offset - len(data)))
        data.extend(raw)
        constants.append({"name": name, "dtype": dtype, "shape": shape, "offset": offset, "nbytes": len(raw)})

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            spec = specs.get(node.name)
            kind = spec.kind if spec is not None else InputKind.USER_INPUT
            if kind == InputKind.USER_INPUT:
                val = node.meta.get("val")
                if not isinstance(val, torch.Tensor):
                    raise LoweringError(
                        f"input {node.name!r} is not a tensor ({type(val).__name__}); {BACKEND_ID} takes tensors only"
                    )
                inputs.append(node.name)
                input_specs.append({"dtype": dtype_name(val.dtype), "shape": _shape(val)})
                continue
            if not node.users and node.name not in {a.name for a in gm.graph.output_node().all_input_nodes}:
                continue  # unused weight: nothing to embed
            if kind in (InputKind.PARAMETER, InputKind.BUFFER):
                source = (
                    edge_program.state_dict
                    if spec.target in edge_program.state_dict
                    else edge_program.constants
                )
            elif kind == InputKind.CONSTANT_TENSOR:
                source = edge_program.constants
            else:
                raise LoweringError(
                    f"input {node.name!r} of kind {kind.name} is not supported by {BACKEND_ID}"
                )
            if spec.target not in source:
                raise LoweringError(f"input {node.name!r}: no data for {kind.name.lower()} {spec.target!r}")
            add_constant(node.name, source[spec.target])
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
            nodes.append(
                {
                    "op": op_name(node.target),
                    "args": [_encode(a, where) for a in _full_args(node)],
                    "output": node.name,
                }
            )
            handle = node.meta.get("debug_handle")
            if isinstance(handle, int):
                debug_handles[node.name] = (handle,)
        elif node.op == "output":
            results = node.args[0]
            for out in (results,) if isinstance(results, torch.fx.Node) else results:
                if not isinstance(out, torch.fx.Node):
                    raise LoweringError(
                        f"output {out!r} is not a graph value; {BACKEND_ID} returns tensors only"
                    )
                outputs.append(out.name)
        else:
            raise LoweringError(f"node {node.name!r}: {node.op} nodes are not supported by {BACKEND_ID}")

    document = {
        "backend_id": BACKEND_ID,
        "plugin_version": __version__,
        "target": fmt.TARGET,
        "compile_specs": options.to_json(),
        "inputs": inputs,
        "input_specs": input_specs,
        "constants": constants,
        "nodes": nodes,
        "outputs": outputs,
    }
    encoded = _dump(document).encode("utf-8")
    return PreprocessResult(
        processed_bytes=fmt.pack(encoded, bytes(data)), debug_handle_map=debug_handles or None
    )
