"""A toy backend (unary relu/neg over numpy) used to test the conformance suite itself.

``make_plugin(backend_id, executor=...)`` registers a backend whose executor can be the careful one (checks the
header and raises ``ProgramError``), a lax one (accepts anything) or one that raises ``ValueError``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

import edgeport
from edgeport import BackendSpec, CapabilityTable, OpCapability, PreprocessResult, ProgramError

MAGIC = b"TOY0"
VERSION = 1
HEADER = struct.Struct("<4sII")
KERNELS = {"aten.relu.default": lambda a: np.maximum(a, np.float32(0)), "aten.neg.default": np.negative}
TABLE = CapabilityTable((OpCapability("aten.relu.default"), OpCapability("aten.neg.default")))


def preprocess(ep: Any, compile_specs: Any) -> PreprocessResult:
    from edgeport.aot.capability_partitioner import op_name

    doc: dict[str, list] = {"inputs": [], "nodes": [], "outputs": []}
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            doc["inputs"].append(node.name)
        elif node.op == "call_function":
            doc["nodes"].append([op_name(node.target), node.args[0].name, node.name])
        elif node.op == "output":
            doc["outputs"] = [n.name for n in node.args[0]]
    raw = json.dumps(doc).encode()
    return PreprocessResult(HEADER.pack(MAGIC, VERSION, len(raw)) + raw)


class CarefulExecutor:
    def init(self, processed: memoryview, compile_specs: Any) -> Any:
        blob = bytes(processed)
        if len(blob) < HEADER.size:
            raise ProgramError("toy blob: truncated header")
        magic, version, n = HEADER.unpack_from(blob)
        if magic != MAGIC:
            raise ProgramError(f"toy blob: bad magic {magic!r}")
        if version != VERSION:
            raise ProgramError(f"toy blob: format version {version} is not supported")
        if HEADER.size + n != len(blob):
            raise ProgramError("toy blob: size mismatch")
        try:
            doc = json.loads(blob[HEADER.size:])
        except ValueError as exc:
            raise ProgramError(f"toy blob: corrupt document: {exc}") from None
        return doc

    def execute(self, doc: Any, inputs: Any) -> list:
        env = dict(zip(doc["inputs"], inputs, strict=True))
        for op, src, dst in doc["nodes"]:
            env[dst] = KERNELS[op](env[src])
        return [np.array(env[o]) for o in doc["outputs"]]

    def destroy(self, handle: Any) -> None:
        pass


class LaxExecutor(CarefulExecutor):
    """Trusts its input: finds the document by searching for '{' and never checks the header."""

    def init(self, processed: memoryview, compile_specs: Any) -> Any:
        blob = bytes(processed)
        start = blob.find(b"{")
        try:
            return json.loads(blob[start:]) if start >= 0 else {"inputs": [], "nodes": [], "outputs": []}
        except ValueError:
            return {"inputs": [], "nodes": [], "outputs": []}


class ValueErrorExecutor(CarefulExecutor):
    """Checks the blob but raises a plain ValueError."""

    def init(self, processed: memoryview, compile_specs: Any) -> Any:
        try:
            return super().init(processed, compile_specs)
        except ProgramError as exc:
            raise ValueError(str(exc)) from None


def make_plugin(backend_id: str, executor: type = CarefulExecutor, table: CapabilityTable = TABLE) -> Any:
    def partitioner(*args: Any) -> Any:
        from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner

        return CapabilityBasedPartitioner(backend_id, table)

    class Plugin:
        @edgeport.hookimpl
        def edgeport_register_backends(self, registry: Any) -> None:
            registry.add(BackendSpec(backend_id=backend_id, version="0.0.1", preprocess=preprocess,
                                     partitioner=partitioner, executor=executor, capabilities=lambda: table))

    return Plugin()
