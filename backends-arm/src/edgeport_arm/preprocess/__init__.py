"""``preprocess`` of the Arm backends: one edge sub-program -> a TOSA 1.0 flatbuffer (``TOSABackend``), or that
graph compiled by Vela into ExecuTorch's Ethos-U block stream (``EthosUBackend``).

The lowering itself is :class:`~edgeport_arm.preprocess.lowering.Lowering` driving the per-op functions of
:mod:`edgeport_arm.preprocess.ops`; Arm's ``tosa_serializer`` writes the flatbuffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.export import ExportedProgram

from edgeport.backend import CompileSpec, PreprocessResult
from edgeport_arm.options import TosaSpecification
from edgeport_arm.preprocess.lowering import Lowering
from edgeport_arm.preprocess.ops import LOWERINGS

__all__ = ["LOWERINGS", "lower_to_tosa"]


def lower_to_tosa(edge_program: ExportedProgram, spec: TosaSpecification) -> tuple[bytes, dict[str, Any]]:
    """The partition's TOSA flatbuffer and a summary (TOSA operator counts, input names)."""
    lowering = Lowering(edge_program, spec, LOWERINGS)
    blob = lowering.run()
    return blob, {"tosa_ops": dict(lowering.g.op_counts), "inputs": list(lowering.input_names)}


def preprocess_tosa(edge_program: ExportedProgram, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
    from edgeport_arm.options import TosaCompileSpec

    options = TosaCompileSpec.from_compile_specs(compile_specs)
    blob, _ = lower_to_tosa(edge_program, options.specification)
    return PreprocessResult(processed_bytes=blob)
