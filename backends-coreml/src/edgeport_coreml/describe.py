"""``describe_blob`` of ``CoreMLBackend``: what a Core ML delegate holds (for ``edgeport inspect``).

Reads the flattened directory (refusing damaged blobs with ``ValueError``), ``metadata.json``, the package's
``Manifest.json`` and its model specification (coremltools' protobuf classes; nothing is compiled or loaded).
"""

from __future__ import annotations

import json
from typing import Any

from edgeport.errors import ProgramError
from edgeport_coreml.schema.flat_directory import FlatDirectory, FlatDirectoryError, read_flat_directory


def model_spec_path(flat: FlatDirectory) -> str | None:
    """Path (in the blob) of the package's root model specification, from its ``Manifest.json``."""
    pkg = "model.mlpackage"
    try:
        manifest = json.loads(flat.read(f"{pkg}/Manifest.json"))
    except (FlatDirectoryError, ValueError):
        return None
    root = manifest.get("rootModelIdentifier")
    entry = manifest.get("itemInfoEntries", {}).get(root, {})
    path = entry.get("path")
    return f"{pkg}/Data/{path}" if isinstance(path, str) else None


def _feature(f: Any) -> dict[str, Any]:
    kind = f.type.WhichOneof("Type")
    out: dict[str, Any] = {"name": f.name, "type": kind}
    if kind == "multiArrayType":
        t = f.type.multiArrayType
        out["shape"] = [int(d) for d in t.shape]
        from coremltools.proto import FeatureTypes_pb2

        out["dtype"] = FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name(t.dataType).lower()
    return out


def read_model_spec(flat: FlatDirectory) -> Any:
    """The package's ``Model`` protobuf (coremltools' ``Model_pb2``), or ``None`` for a compiled model."""
    path = model_spec_path(flat)
    if path is None:
        return None
    from coremltools.proto import Model_pb2

    spec = Model_pb2.Model()
    try:
        spec.ParseFromString(flat.read(path))
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise FlatDirectoryError(f"the model specification {path} is not a Core ML model: {exc}") from None
    return spec


def mil_op_counts(spec: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    if spec.WhichOneof("Type") != "mlProgram":
        return counts
    for function in spec.mlProgram.functions.values():
        for block in function.block_specializations.values():
            for op in block.operations:
                counts[op.type] = counts.get(op.type, 0) + 1
    return counts


def describe_coreml_blob(processed: bytes | memoryview) -> dict[str, Any]:
    if bytes(processed[:4]) == b"CMJR":
        return {"format": "reference to a shared multifunction Core ML model in the program's named data",
                "reference": bytes(processed[4:]).decode("utf-8", "replace")}
    try:
        flat = read_flat_directory(processed)
        from edgeport_coreml.runtime import read_metadata

        meta = read_metadata(flat, "CoreMLBackend blob")
        spec = read_model_spec(flat)
    except (FlatDirectoryError, ProgramError) as exc:
        raise ValueError(f"not a valid CoreMLBackend blob: {exc}") from None
    out: dict[str, Any] = {
        "format": "Core ML model directory (ExecuTorch's flattened CoreMLBackend blob)",
        "identifier": meta.get("identifier"),
        "files": {path: len(data) for path, data in sorted(flat.files.items())},
        "model_type": "compiled_model" if any(p.startswith("model.mlmodelc/") for p in flat.files) else "model",
        "input_names": meta["inputNames"],
        "output_names": meta["outputNames"],
    }
    if spec is not None:
        out["specification_version"] = int(spec.specificationVersion)
        out["model_kind"] = spec.WhichOneof("Type")
        out["inputs"] = [_feature(f) for f in spec.description.input]
        out["outputs"] = [_feature(f) for f in spec.description.output]
        out["mil_operators"] = dict(sorted(mil_op_counts(spec).items()))
        out["weight_bytes"] = sum(len(d) for p, d in flat.files.items() if "/weights/" in p)
    return out
