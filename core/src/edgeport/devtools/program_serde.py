"""Exported programs as the four byte strings an ETRecord stores (torch.export's serialized form).

ExecuTorch stores each program of an ETRecord as torch.export's ``SerializedArtifact`` (the program as JSON, then
``torch.save`` bytes of the state dict, the constants and the example inputs), with each node's
``debug_handle`` added to its JSON metadata as a string. torch has no public API for that artifact (``torch.export
.save`` writes a different container), so this module uses ``torch._export.serde.serialize`` — the serializer
ExecuTorch's own one extends — and adds the handles to the JSON afterwards; a change in torch's private module
shows up as a clear error here, not as a wrong file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edgeport.errors import EdgeportError

DEBUG_HANDLE = "debug_handle"  # the same key as edgeport.aot.debug_handles.DEBUG_HANDLE (that module imports torch)

#: ExecuTorch 1.5.1 reads programs with its own copy of torch.export's serializer, schema 5.4; torch 2.13 writes
#: schema 8.x, whose additions all have defaults. An ETRecord therefore stores the 5.4 form: the fields added
#: since are left out (where they sit in the schema is spelled out below), and a value only 8.x can express is
#: refused with its name rather than written for a reader that would fail on it.
EXECUTORCH_SCHEMA_VERSION = {"major": 5, "minor": 4}
_NEWER_PROGRAM_FIELDS = ("guards_code", "torch_version")
_NEWER_GRAPH_MODULE_FIELDS = ("metadata", "treespec_namedtuple_fields")
_NEWER_GRAPH_FIELDS = ("sym_float_values",)
_NEWER_NODE_FIELDS = ("is_hop_single_tensor_return",)
_NEWER_NAMED_ARGUMENT_FIELDS = ("kind",)
_NEWER_SIGNATURE_FIELDS = ("forward_arg_names",)
_NEWER_ARGUMENT_KINDS = frozenset({"as_complex", "as_float_lists", "as_int_lists", "as_nested_tensors",
                                   "as_optional_tensor", "as_string_to_argument", "as_sym_float", "as_sym_floats"})


class ProgramSerdeError(EdgeportError):
    """A program could not be written to, or read from, its serialized form."""


@dataclass(frozen=True)
class SerializedProgram:
    exported_program: bytes
    state_dict: bytes
    constants: bytes
    example_inputs: bytes


def _serde() -> Any:
    try:
        from torch._export.serde import serialize as serde
    except ImportError as exc:  # pragma: no cover - depends on torch's private layout
        raise ProgramSerdeError(f"this torch has no torch._export.serde.serialize ({exc}); ETRecords need torch "
                                "2.13 (the version edgeport pins)") from exc
    return serde


def _graph_json_nodes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc["graph_module"]["graph"]["nodes"]


def _output_names(node: dict[str, Any]) -> list[str]:
    names = []
    for out in node.get("outputs", []):
        for value in out.values():
            if isinstance(value, dict) and isinstance(value.get("name"), str):
                names.append(value["name"])
            elif isinstance(value, list):
                names += [v["name"] for v in value if isinstance(v, dict) and isinstance(v.get("name"), str)]
    return names


def _drop(d: dict[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        d.pop(name, None)


def _refuse_newer(value: Any, where: str) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in _NEWER_ARGUMENT_KINDS:
                raise ProgramSerdeError(f"{where}: the program uses a {key!r} argument, which ExecuTorch 1.5.1's "
                                        "ETRecord format (torch.export schema 5.4) cannot hold")
            _refuse_newer(item, where)
    elif isinstance(value, list):
        for item in value:
            _refuse_newer(item, where)


def _graph_to_executorch_schema(graph: dict[str, Any], where: str) -> None:
    _drop(graph, _NEWER_GRAPH_FIELDS)
    for node in graph.get("nodes", []):
        _drop(node, _NEWER_NODE_FIELDS)
        where_node = f"{where}, node {node.get('target')!r}"
        for argument in node.get("inputs", []):
            _drop(argument, _NEWER_NAMED_ARGUMENT_FIELDS)
            _refuse_newer(argument.get("arg"), where_node)
            sub = (argument.get("arg") or {}).get("as_graph")
            if isinstance(sub, dict) and isinstance(sub.get("graph"), dict):
                _graph_to_executorch_schema(sub["graph"], where)


def to_executorch_schema(doc: dict[str, Any], where: str = "program") -> dict[str, Any]:
    """A torch 2.13 serialized-program JSON document in the schema ExecuTorch 1.5.1 reads (in place)."""
    _drop(doc, _NEWER_PROGRAM_FIELDS)
    doc["schema_version"] = dict(EXECUTORCH_SCHEMA_VERSION)
    module = doc["graph_module"]
    _drop(module, _NEWER_GRAPH_MODULE_FIELDS)
    _graph_to_executorch_schema(module["graph"], where)
    for entry in module.get("module_call_graph", []):
        if isinstance(entry.get("signature"), dict):
            _drop(entry["signature"], _NEWER_SIGNATURE_FIELDS)
    return doc


def serialize_program(program: Any) -> SerializedProgram:
    """``program`` (a ``torch.export.ExportedProgram``) as ExecuTorch's ETRecord stores it."""
    serde = _serde()
    try:
        artifact = serde.serialize(program)
    except Exception as exc:
        raise ProgramSerdeError(f"torch.export could not serialize the program: {type(exc).__name__}: {exc}") from exc
    handles = _handles_by_output(program)
    doc = json.loads(artifact.exported_program)
    for node in _graph_json_nodes(doc):
        for name in _output_names(node):
            if name in handles:
                node.setdefault("metadata", {})[DEBUG_HANDLE] = str(handles[name])
                break
    to_executorch_schema(doc)
    return SerializedProgram(json.dumps(doc).encode(), artifact.state_dict, artifact.constants,
                             artifact.example_inputs)


def deserialize_program(data: SerializedProgram, where: str) -> Any:
    """The ``ExportedProgram`` stored as ``data`` (from an edgeport or ExecuTorch ETRecord), handles restored."""
    serde = _serde()
    try:
        doc = json.loads(data.exported_program)
        by_output = {}
        for node in _graph_json_nodes(doc):
            handle = (node.get("metadata") or {}).get(DEBUG_HANDLE)
            if handle is not None:
                for name in _output_names(node):
                    by_output[name] = int(handle)
    except (ValueError, KeyError, TypeError) as exc:
        raise ProgramSerdeError(f"{where}: not a serialized exported program ({type(exc).__name__}: {exc})") from exc
    try:
        doc.pop("dialect", None)  # ExecuTorch's field; its programs' verifiers say the same
        artifact = serde.SerializedArtifact(json.dumps(doc).encode(), data.state_dict, data.constants,
                                            data.example_inputs)
        # schema 5.4 (ExecuTorch's) lacks only fields that have defaults in torch's newer schema
        program = serde.deserialize(artifact, _unsafe_skip_version_check=True)
    except Exception as exc:
        raise ProgramSerdeError(f"{where}: torch.export could not read the program: {type(exc).__name__}: "
                                f"{exc}") from exc
    for node in program.graph.nodes:
        if node.name in by_output and not _is_getitem(node):
            node.meta[DEBUG_HANDLE] = by_output[node.name]
    for node in program.graph.nodes:  # a multi-output node: named in the file by its outputs (its getitems)
        if _is_getitem(node) and node.name in by_output and DEBUG_HANDLE not in node.args[0].meta:
            node.args[0].meta[DEBUG_HANDLE] = by_output[node.name]
    return program


def _is_getitem(node: Any) -> bool:
    import operator

    return node.op == "call_function" and node.target is operator.getitem and bool(node.args) \
        and hasattr(node.args[0], "meta")


def _handles_by_output(program: Any) -> dict[str, int]:
    """Output name -> the debug handle the file records for the node producing it. The file names a multi-output
    node (``native_layer_norm``) by its outputs, which are its getitems' names: those carry the node's own handle,
    not the getitems', so the Inspectors find the operator (ExecuTorch's reads the handle of the file's node)."""
    handles: dict[str, int] = {}
    for n in program.graph.nodes:
        if n.op != "call_function" or not isinstance(handle := n.meta.get(DEBUG_HANDLE), int):
            continue
        source = n.args[0].meta.get(DEBUG_HANDLE) if _is_getitem(n) else None
        handles[n.name] = source if isinstance(source, int) else handle
    return handles
