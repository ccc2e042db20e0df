"""``preprocess`` of ``CoreMLBackend``: one edge sub-program -> an ML program (coremltools) -> ExecuTorch's Core
ML delegate blob.

Steps: read the compile specs (:class:`~edgeport_coreml.options.CoreMLCompileSpec`); copy the partition and apply
:func:`~edgeport_coreml.preprocess.normalize.normalize_for_coremltools`; ``coremltools.convert(program,
convert_to="mlprogram", minimum_deployment_target=..., compute_precision=..., compute_units=...,
skip_model_load=True)``; compress the weights when the compile specs ask
(:mod:`~edgeport_coreml.preprocess.compress`). Buffers the program mutates (``buffers_to_mutate``) become
Core ML state (coremltools does this for iOS18+ targets; older targets are refused). Save
``lowered_module/model.mlpackage`` with ``metadata.json`` (input and output names, identifier) and, when coremltools wrote a debug-handle mapping, ``debug_info.json``; flatten the directory
(:mod:`edgeport_coreml.schema.flat_directory`). The identifier is ``executorch_`` + a UUID derived from the
model's specification and weights (ExecuTorch draws a random one; the runtime caches compiled models under it, so equal ids must
mean equal models -- content-derived ids keep that and make lowering reproducible).

coremltools draws progress bars on ``sys.stderr`` during conversion; they are captured (never printed) and kept
for error messages.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeport.backend import CompileSpec, PreprocessResult
from edgeport.errors import LoweringError
from edgeport_coreml.options import COREML_BACKEND_ID, CoreMLCompileSpec, UnconvertiblePartition
from edgeport_coreml.preprocess.inputs import enumerated_inputs
from edgeport_coreml.preprocess.normalize import (
    contiguous_user_inputs,
    match_zero_point_dtypes,
    normalize_for_coremltools,
)
from edgeport_coreml.verify import lower_to_blob

__all__ = ["convert_partition", "preprocess_coreml", "write_delegate_directory"]

MODEL_DIR = "lowered_module"
PACKAGE = "model.mlpackage"
COMPILED = "model.mlmodelc"
METADATA = "metadata.json"
DEBUG_INFO = "debug_info.json"
_IOS18 = 9


def _coremltools() -> Any:
    import coremltools as ct

    return ct


def convert_partition(edge_program: Any, options: CoreMLCompileSpec) -> Any:
    """The partition as a ``coremltools.models.MLModel`` (ML program, not loaded: works off macOS)."""
    ct = _coremltools()
    program = copy.deepcopy(edge_program)
    normalize_for_coremltools(program.graph)
    match_zero_point_dtypes(program)
    contiguous_user_inputs(program)
    program.graph_module.recompile()
    inputs = enumerated_inputs(program, options)
    log = io.StringIO()
    try:
        with contextlib.redirect_stderr(log), contextlib.redirect_stdout(log):
            return ct.convert(
                program,
                source="pytorch",
                inputs=inputs,
                convert_to="mlprogram",
                minimum_deployment_target=ct.target(options.deployment_target_value),
                compute_precision=ct.precision(options.compute_precision),
                compute_units=ct.ComputeUnit[options.compute_unit.upper()],
                skip_model_load=True,
            )
    except Exception as exc:  # noqa: BLE001 - coremltools raises many kinds; report them as a lowering error
        raise UnconvertiblePartition(f"{COREML_BACKEND_ID}: coremltools {ct.__version__} could not convert the partition: "
                            f"{type(exc).__name__}: {exc}") from exc


def _debug_info(package: Path) -> dict[str, Any] | None:
    """ExecuTorch's ``debug_info.json`` from the package's ``executorch_debug_handle_mapping.json``, if any."""
    mapping_file = package / "executorch_debug_handle_mapping.json"
    try:
        info = json.loads(mapping_file.read_text())
    except (OSError, ValueError):
        return None
    mapping = info.get("mapping") if isinstance(info, dict) else None
    if not isinstance(mapping, dict):
        return None
    paths: dict[str, list[dict[str, str]]] = {}
    handles: dict[str, list[int]] = {}
    for handle, op_paths in mapping.items():
        try:
            handle_value = int(handle)
        except ValueError:
            continue
        for op_path in op_paths or []:
            last = op_path[-1] if op_path else {}
            if "Operator" not in last or "Output" not in last:
                continue
            symbol = f"{last['Output']}:{last['Operator']}"
            handles.setdefault(symbol, []).append(handle_value)
            paths[symbol] = op_path
    return {"versionInfo": info.get("version", {}), "debugSymbolToOperationPath": paths,
            "debugSymbolToHandles": handles}


def _content_uuid(root: Path) -> str:
    """A UUID from the model's specification and weights (not ``Manifest.json``, whose item ids are random)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "Manifest.json":
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(p.read_bytes())
    return str(uuid.UUID(bytes=h.digest()[:16], version=4))


def write_delegate_directory(mlmodel: Any, directory: Path, model_type: str = "model"
                             ) -> tuple[Path, dict[str, Any] | None]:
    """Write ``directory/lowered_module`` (package, metadata, debug info) and return it with the debug info."""
    spec = mlmodel.get_spec()
    inputs = [i.name for i in spec.description.input]
    outputs = [o.name for o in spec.description.output]
    if not outputs:
        raise UnconvertiblePartition(f"{COREML_BACKEND_ID}: the converted partition has no outputs")
    if not inputs and spec.specificationVersion < 9:
        raise UnconvertiblePartition(f"{COREML_BACKEND_ID}: a partition without inputs needs minimum_deployment_target "
                            "iOS18 or later")
    model_dir = directory / MODEL_DIR
    model_dir.mkdir(parents=True)
    package = model_dir / PACKAGE
    mlmodel.save(str(package))
    debug = _debug_info(package)
    if model_type == "compiled_model":
        compiled = mlmodel.get_compiled_model_path()  # needs macOS: the caller checked
        shutil.rmtree(package)
        shutil.move(compiled, model_dir / COMPILED)
    identifier = "executorch_" + _content_uuid(model_dir)
    (model_dir / METADATA).write_text(json.dumps({"inputNames": inputs, "outputNames": outputs,
                                                  "identifier": identifier}))
    if debug is not None:
        (model_dir / DEBUG_INFO).write_text(json.dumps(debug))
    return model_dir, debug


def preprocess_coreml(edge_program: Any, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
    try:
        options = CoreMLCompileSpec.from_compile_specs(compile_specs)
    except ValueError as exc:
        raise LoweringError(f"{COREML_BACKEND_ID}: {exc}") from None
    if options.model_type == "compiled_model":
        from edgeport_coreml.runtime import coreml_available

        ok, why = coreml_available()
        if not ok:
            raise LoweringError(f"{COREML_BACKEND_ID}: model_type='compiled_model' compiles the ML program with "
                                f"the Core ML framework, which is not here ({why}); use model_type='model' (the "
                                "runtime compiles the package on the device)")
    mutated = sorted(set(edge_program.graph_signature.buffers_to_mutate.values()))
    if mutated and options.deployment_target_value < _IOS18:
        raise LoweringError(f"{COREML_BACKEND_ID}: the program mutates buffers {mutated}, which become Core ML "
                            "state; state needs minimum_deployment_target iOS18/macOS15 (value 9) or newer, the "
                            f"compile specs ask for value {options.deployment_target_value}")
    blob, handle_map = lower_to_blob(edge_program, options)  # converted once: the partitioner may have done it
    return PreprocessResult(processed_bytes=blob, debug_handle_map=handle_map)
