"""Test-finalizing QNN partitions at partition time (:func:`edgeport.aot.trial.find_refusals`), so a graph the HTP
refuses as a whole -- although each of its nodes validated alone -- shrinks instead of failing the lowering.

Each candidate partition is extracted as a sub-program and lowered exactly as ``preprocess`` lowers it, finalized
in the QNN worker of its HTP configuration; the finalized graph is kept (:mod:`edgeport_qnn.preprocess`'s cache),
so the real ``preprocess`` of an accepted partition costs no second finalize.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.export import ExportedProgram

from edgeport.aot.capability_partitioner import op_name
from edgeport.aot.to_backend import extract_subprogram
from edgeport.aot.trial import TrialFailure
from edgeport_qnn.capabilities import DEQUANTIZE, QUANTIZE

__all__ = ["partition_subset", "qnn_trial"]


def qnn_trial(ep: ExportedProgram, chipset: int, use_fp16: bool
              ) -> Callable[[list[torch.fx.Node]], TrialFailure | None]:
    """``try_compile`` for :func:`~edgeport.aot.trial.find_refusals`: lower and finalize ``nodes`` of ``ep``."""
    from edgeport.errors import LoweringError
    from edgeport_qnn.isolated import QnnWorkerCrash
    from edgeport_qnn.preprocess import lower_to_qnn, on_soc_device

    def try_compile(nodes: list[torch.fx.Node]) -> TrialFailure | None:
        members = [n for n in nodes if n.op == "call_function"]
        if not members:
            return None
        try:
            sub = extract_subprogram(ep, members)
            soc = chipset if on_soc_device(sub.graph, use_fp16) else None
            lower_to_qnn(sub, soc, use_fp16)
        except QnnWorkerCrash as exc:
            return "QNN's HTP backend", str(exc), exc.signal
        except LoweringError as exc:
            return "QNN's HTP backend", str(exc), None
        except Exception as exc:  # noqa: BLE001 - any failure of our lowering refuses the candidate, visibly
            return "the QNN lowering", f"{type(exc).__name__}: {exc}", None
        return None

    return try_compile


def partition_subset(members: list[torch.fx.Node], excluded: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """``members`` without ``excluded``, and without the quantize nodes whose results would leave the rest and the
    dequantize nodes whose quantize left (delegates exchange float32 only)."""
    keep = [n for n in members if n not in set(excluded)]
    while True:
        kept = set(keep)
        drop = {n for n in keep if (op_name(n.target) == QUANTIZE and any(u not in kept for u in n.users))
                or (op_name(n.target) == DEQUANTIZE and isinstance(n.args[0], torch.fx.Node)
                    and op_name(getattr(n.args[0], "target", "")) == QUANTIZE and n.args[0] not in kept)}
        if not drop:
            return keep
        keep = [n for n in keep if n not in drop]
