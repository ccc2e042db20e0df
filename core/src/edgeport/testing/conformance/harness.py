"""The machinery behind :class:`~edgeport.testing.conformance.BackendConformance`, usable on its own.

* :class:`Case` / :func:`op_cases` / :func:`model_case` - what is tested: one call of one claimed op (op, dtype,
  sample) or one model of :mod:`edgeport.testing.models`;
* :class:`OpModule` - a tiny ``torch.nn.Module`` that calls one op overload on its inputs;
* :class:`RecordingPartitioner` - wraps a backend's partitioner inside the real pipeline and checks, at the moment
  it returns, that it only tagged nodes and which nodes it tagged (:class:`PartitionRecord`);
* :func:`lower_case` - export, ``to_edge_transform_and_lower``, ``to_executorch``, keeping each stage's error;
* :func:`compare_outputs`, :func:`corrupt_blob`, :func:`patch_program` - the runtime checks.

Cases live in :mod:`~edgeport.testing.conformance.cases`, the partition contract in
:mod:`~edgeport.testing.conformance.partition_contract` and the runtime checks in
:mod:`~edgeport.testing.conformance.runtime_checks`; they are re-exported here.
"""

from __future__ import annotations

import copy
import dataclasses
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from edgeport.backend import CapabilityTable
from edgeport.testing.conformance.cases import Case, OpModule, model_case, op_cases, resolve_op
from edgeport.testing.conformance.cases import matches_any as matches_any
from edgeport.testing.conformance.partition_contract import NodeRecord, PartitionRecord, RecordingPartitioner
from edgeport.testing.conformance.partition_contract import (
    describe_unclaimed_tagged as describe_unclaimed_tagged,
)
from edgeport.testing.conformance.partition_contract import describe_untagged as describe_untagged
from edgeport.testing.conformance.runtime_checks import CORRUPTIONS as CORRUPTIONS
from edgeport.testing.conformance.runtime_checks import SAME_LENGTH as SAME_LENGTH
from edgeport.testing.conformance.runtime_checks import compare_outputs, corrupt_blob, patch_program

__all__ = [
    "DEFAULT_MODELS",
    "DEFAULT_MODEL_TOLERANCES",
    "DEFAULT_TOLERANCES",
    "Case",
    "LoweredCase",
    "NodeRecord",
    "OpModule",
    "PartitionRecord",
    "RecordingPartitioner",
    "compare_outputs",
    "corrupt_blob",
    "lower_case",
    "model_case",
    "op_cases",
    "patch_program",
    "resolve_op",
]

DEFAULT_MODELS = ("mlp", "cnn_bn_pool", "mobilenet_v2_style", "resnet_block", "transformer_encoder_layer")
"""Models of :data:`edgeport.testing.models.MODELS` every backend is run on."""

# (atol, rtol) by dtype name; integer and bool outputs must match exactly.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-5, 1.3e-6),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1.6e-2),
}
DEFAULT_MODEL_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-6, 1e-6),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}


# -- lowering ----------------------------------------------------------------------------------------------


@dataclass
class LoweredCase:
    """A case taken through the pipeline; ``errors`` maps a stage name to the formatted error it raised."""

    case: Case
    module: Any = None
    inputs: tuple[Any, ...] = ()
    expected: list[Any] = field(default_factory=list)
    recorder: RecordingPartitioner | None = None
    edge: Any = None
    lowered_modules: list[Any] = field(default_factory=list)
    executorch: Any = None
    pte: bytes | None = None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def records(self) -> list[PartitionRecord]:
        return self.recorder.records if self.recorder is not None else []

    def failed_stage(self, *stages: str) -> str | None:
        """The first of ``stages`` (or of all stages) that raised, with its error."""
        for stage in stages or tuple(self.errors):
            if stage in self.errors:
                return f"{stage} failed for {self.case.id}:\n{self.errors[stage]}"
        return None


def _flatten_outputs(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        for v in value:
            out.extend(_flatten_outputs(v))
        return out
    return [value]


def _error(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-6))


def lower_case(
    case: Case,
    partitioner: Any,
    backend_id: str,
    table: CapabilityTable,
    compile_options_type: type | None = None,
) -> LoweredCase:
    """Build, run eagerly, export, lower with ``partitioner`` (wrapped in a :class:`RecordingPartitioner`) and
    serialize one case. Never raises: each stage's error is kept in ``LoweredCase.errors``."""
    from edgeport import to_edge_transform_and_lower
    from edgeport.aot.lowered_module import LoweredBackendModule

    out = LoweredCase(case)
    try:
        module, inputs = case.build()
        out.module, out.inputs = module, inputs
        with torch.no_grad():
            out.expected = _flatten_outputs(module(*copy.deepcopy(inputs)))
    except Exception as exc:  # noqa: BLE001
        out.errors["build"] = _error(exc)
        return out
    try:
        ep = torch.export.export(module, inputs)
    except Exception as exc:  # noqa: BLE001
        out.errors["export"] = _error(exc)
        return out
    out.recorder = RecordingPartitioner(partitioner, backend_id, table, compile_options_type)
    try:
        out.edge = to_edge_transform_and_lower(ep, partitioner=[out.recorder.as_partitioner()])
    except Exception as exc:  # noqa: BLE001
        out.errors["lowering"] = _error(exc)
        return out
    gm = out.edge.exported_program().graph_module
    out.lowered_modules = [m for _, m in gm.named_children() if isinstance(m, LoweredBackendModule)]
    try:
        out.executorch = out.edge.to_executorch()
        out.pte = bytes(out.executorch.buffer)
    except Exception as exc:  # noqa: BLE001
        out.errors["to_executorch"] = _error(exc)
    return out


def options_type_of(spec: Any) -> type | None:
    """The compile-options dataclass a backend spec declares (``None`` if it declares none)."""
    options = getattr(spec, "compile_options", None)
    return options if isinstance(options, type) and dataclasses.is_dataclass(options) else None
