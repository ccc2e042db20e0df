"""Executor of ``CoreMLBackend``: runs the delegate's ML program with Core ML, which exists only on Apple systems.

Off macOS (Linux CI, this build machine) :func:`coreml_available` is false with the reason, so the core runtime
refuses a program with a Core ML delegate at load with ``BackendNotFoundError`` naming the backend (or runs the
program's portable fallback when it carries one and the caller allows it).

On macOS 13+ the executor unflattens the blob into a private temporary directory, loads ``model.mlpackage`` (or
``model.mlmodelc``) with ``coremltools.models.MLModel`` on the compute units of the compile specs, and predicts with
the input names of ``metadata.json`` in the delegate's argument order; outputs come back in ``outputNames`` order.
That path cannot run on the build machine and is untested here (see docs/backends/coreml.md).
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeport.backend import CompileSpec
from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport_coreml.options import COREML_BACKEND_ID, CoreMLCompileSpec
from edgeport_coreml.schema.flat_directory import FlatDirectoryError, read_flat_directory, unflatten_to

REQUIREMENT = "Core ML runs on macOS 13+/iOS 16+"


def coreml_available() -> tuple[bool, str]:
    """Whether Core ML can execute models in this process, and why not."""
    if sys.platform != "darwin":
        return False, f"{REQUIREMENT}; this is {platform.system() or sys.platform} (lowering works here, execution " \
                      "does not)"
    release = platform.mac_ver()[0]
    try:
        major = int(release.split(".")[0])
    except ValueError:
        major = 0
    if major < 13:
        return False, f"{REQUIREMENT}; this is macOS {release or 'unknown'}"
    try:
        import coremltools.libcoremlpython  # noqa: F401  (coremltools' binding to the Core ML framework)
    except ImportError as exc:
        return False, f"coremltools cannot reach the Core ML framework ({exc}); pip install coremltools==9.0"
    return True, f"Core ML on macOS {release}"


def read_metadata(flat: Any, where: str = COREML_BACKEND_ID) -> dict[str, Any]:
    try:
        meta = json.loads(flat.read("metadata.json").decode("utf-8"))
    except (FlatDirectoryError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProgramError(f"{where}: the delegate has no readable metadata.json ({exc})") from None
    if not isinstance(meta, dict):
        raise ProgramError(f"{where}: metadata.json is not an object")
    if "methods" in meta:
        raise ProgramError(f"{where}: multifunction Core ML models (ExecuTorch's weight-shared methods) are not "
                           "supported by edgeport-coreml yet")
    for key in ("inputNames", "outputNames"):
        if not isinstance(meta.get(key), list) or not all(isinstance(n, str) for n in meta[key]):
            raise ProgramError(f"{where}: metadata.json lacks a list of {key}")
    return meta


@dataclass
class _Handle:
    directory: Path
    model: Any
    input_names: list[str]
    output_names: list[str]
    options: CoreMLCompileSpec
    extra: dict[str, Any] = field(default_factory=dict)


def _has_state(model: Any) -> bool:
    """The model declares Core ML state (iOS18+ packages converted from mutated buffers)."""
    try:
        return bool(model.get_spec().description.state)
    except Exception:  # noqa: BLE001 - a compiled model has no spec to read: it was made without state here
        return False


class CoreMLExecutor:
    """Loads the package with coremltools and predicts (macOS only)."""

    thread_safe = False

    def is_available(self) -> tuple[bool, str]:
        return coreml_available()

    def init(self, processed: memoryview, compile_specs: Sequence[CompileSpec]) -> _Handle:
        if bytes(processed[:4]) == b"CMJR":
            raise ProgramError(f"{COREML_BACKEND_ID}: the delegate refers to a shared multifunction model in the "
                               "program's named data (ExecuTorch's weight sharing), which edgeport-coreml does not "
                               "load yet")
        try:
            flat = read_flat_directory(processed)
        except FlatDirectoryError as exc:
            raise ProgramError(f"{COREML_BACKEND_ID}: {exc}") from None
        meta = read_metadata(flat)
        try:
            options = CoreMLCompileSpec.from_compile_specs(compile_specs)
        except ValueError as exc:
            raise ProgramError(f"{COREML_BACKEND_ID}: {exc}") from None
        import coremltools as ct

        tmp = Path(tempfile.mkdtemp(prefix="edgeport_coreml_run_"))
        try:
            root = unflatten_to(flat, tmp)
            units = ct.ComputeUnit[options.compute_unit.upper()]
            if (root / "model.mlmodelc").is_dir():
                model = ct.models.CompiledMLModel(str(root / "model.mlmodelc"), compute_units=units)
            elif (root / "model.mlpackage").is_dir():
                model = ct.models.MLModel(str(root / "model.mlpackage"), compute_units=units)
            else:
                raise ProgramError(f"{COREML_BACKEND_ID}: the delegate holds neither model.mlpackage nor "
                                   f"model.mlmodelc (files: {sorted(flat.files)[:10]})")
        except Exception:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        handle = _Handle(tmp, model, list(meta["inputNames"]), list(meta["outputNames"]), options)
        if _has_state(model):  # a buffer the delegate owns (take_over_mutable_buffer): one state per handle
            handle.extra["state"] = model.make_state()
        return handle

    def describe_execution(self, handle: _Handle) -> str:
        return f"Core ML (coremltools MLModel, compute units {handle.options.compute_unit})"

    def num_outputs(self, handle: _Handle) -> int:
        return len(handle.output_names)

    def execute(self, handle: _Handle, inputs: Sequence[Any]) -> list[np.ndarray]:
        if len(inputs) != len(handle.input_names):
            raise RuntimeExecutionError(f"{COREML_BACKEND_ID}: {len(inputs)} inputs given, the model takes "
                                        f"{len(handle.input_names)} ({handle.input_names})")
        # Core ML multiarrays have no int64: coremltools made such inputs int32 (outputs come back int32 and the
        # runtime copies them into the program's int64 tensors)
        feed = {name: np.ascontiguousarray(x, dtype=np.int32 if np.asarray(x).dtype == np.int64 else None)
                for name, x in zip(handle.input_names, inputs, strict=True)}
        state = handle.extra.get("state")
        try:
            result = handle.model.predict(feed) if state is None else handle.model.predict(feed, state=state)
        except Exception as exc:  # noqa: BLE001 - Core ML errors come as many types
            raise RuntimeExecutionError(f"{COREML_BACKEND_ID}: Core ML prediction failed: {exc}") from exc
        missing = [n for n in handle.output_names if n not in result]
        if missing:
            raise RuntimeExecutionError(f"{COREML_BACKEND_ID}: Core ML returned no output(s) {missing}")
        return [np.asarray(result[n]) for n in handle.output_names]

    def destroy(self, handle: _Handle) -> None:
        handle.model = None
        shutil.rmtree(handle.directory, ignore_errors=True)
