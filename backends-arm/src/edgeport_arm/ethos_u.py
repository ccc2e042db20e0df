"""``EthosUBackend``'s ``preprocess``: the partition's TOSA 1.0 INT graph, compiled by Vela for the target.

The blob is Vela's output in ExecuTorch's Ethos-U block stream (:mod:`edgeport_arm.schema.vela_stream`), so
ExecuTorch's runtime on Corstone hardware runs it. Two named-data entries go beside it, keyed by the blob's
sha256 and ignored by ExecuTorch's runtime: the TOSA graph (``edgeport.arm.tosa.<sha>``, which edgeport's
runtime executes on the reference model) and Vela's estimates as JSON (``edgeport.arm.vela.<sha>``: cycles,
SRAM / flash use, MACs, NPU / CPU operator split, per layer when asked for), which ``edgeport inspect`` shows.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from torch.export import ExportedProgram

from edgeport.aot.capability_partitioner import op_name
from edgeport.backend import CompileSpec, PreprocessResult
from edgeport.errors import LoweringError
from edgeport.named_data import NamedDataStore
from edgeport_arm.keys import estimates_key, tosa_key
from edgeport_arm.options import EthosUCompileSpec
from edgeport_arm.preprocess import lower_to_tosa


def op_list(program: ExportedProgram, limit: int = 12) -> str:
    """``"12 ops: aten.convolution.default x5, ..."``: the partition's operators, for messages."""
    counts = Counter(op_name(n.target) for n in program.graph.nodes if n.op == "call_function")
    parts = [f"{op} x{k}" if k > 1 else op for op, k in counts.most_common(limit)]
    more = ", ..." if len(counts) > limit else ""
    return f"{sum(counts.values())} ops: {', '.join(parts)}{more}"


def vela_compile(tosa: bytes, summary: dict[str, Any], edge_program: ExportedProgram, spec: EthosUCompileSpec) -> Any:
    """Vela's result for a partition's TOSA graph (compiled in the isolated worker, cached by input).

    Raises :class:`~edgeport_arm.vela.VelaError` (:class:`~edgeport_arm.vela.VelaCrashed` on a crash, naming
    the partition's inputs, its operators and the signal) or ``ValueError`` for options Vela does not accept.
    """
    from edgeport_arm.vela import compile_tosa_isolated

    name = ",".join(summary["inputs"]) or "partition"
    return compile_tosa_isolated(tosa, target=spec.target, system_config=spec.system_config,
                                 memory_mode=spec.memory_mode, extra_flags=spec.extra_flags,
                                 config_ini=spec.config_ini, partition_name=f"inputs {name}",
                                 ops=op_list(edge_program))


def preprocess_ethos_u(edge_program: ExportedProgram, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
    from edgeport_arm.vela import VelaError

    spec = EthosUCompileSpec.from_compile_specs(compile_specs)
    tosa, summary = lower_to_tosa(edge_program, spec.specification)
    try:
        result = vela_compile(tosa, summary, edge_program, spec)
    except (VelaError, ValueError) as exc:
        raise LoweringError(f"EthosUBackend: {exc}") from exc
    estimates = result.estimates.to_dict()
    estimates["tosa_ops"] = summary["tosa_ops"]
    estimates["target"] = spec.target
    store = NamedDataStore()
    store.add_named_data(tosa_key(result.blob), tosa, alignment=16)
    store.add_named_data(estimates_key(result.blob), json.dumps(estimates, sort_keys=True).encode(), alignment=1)
    return PreprocessResult(processed_bytes=result.blob, data_store_output=store.output())
