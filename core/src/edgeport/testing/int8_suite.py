"""What every backend's int8 architecture suite does (tests and benches): quantize an
:class:`~edgeport.testing.architectures.Architecture` with pt2e the same way, measure SQNR, count the share of ops
delegated.

The int8 done-when of the architecture suite: a backend's program is within 1 dB of the SQNR (against fp32 eager)
that its own pt2e-converted model reaches -- the converted model is what the backend must reproduce -- and its
share of delegated compute ops is at least ExecuTorch's partitioner's on the same export.
"""

from __future__ import annotations

import operator
from typing import Any

from edgeport.testing.architectures import Architecture

__all__ = ["calibration_inputs", "delegated_ops", "pt2e_convert", "sqnr_db"]

_QDQ = ("quantize_per_tensor", "dequantize_per_tensor", "dequantize_per_channel", "quantize_per_channel")


def calibration_inputs(arch: Architecture, batches: int = 4, seed: int = 1) -> list[tuple[Any, ...]]:
    """``batches`` random inputs shaped like the example (token ids below the vocabulary, or normal images), then
    the example itself: the calibration every suite uses."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = arch.example_inputs[0]
    out = [(torch.randint(0, arch.vocab, x.shape, generator=gen) if arch.kind == "text"
            else torch.randn(x.shape, generator=gen),) for _ in range(batches)]
    return out + [tuple(arch.example_inputs)]


def pt2e_convert(arch: Architecture, quantizer: Any, batches: int = 4, seed: int = 1) -> Any:
    """``arch.model`` exported, prepared with ``quantizer`` (torchao's ``prepare_pt2e``), calibrated on
    :func:`calibration_inputs` and converted: the model a backend's int8 program must reproduce."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    prepared = prepare_pt2e(torch.export.export(arch.model, tuple(arch.example_inputs)).module(), quantizer)
    with torch.no_grad():
        for inputs in calibration_inputs(arch, batches, seed):
            prepared(*inputs)
    return convert_pt2e(prepared)


def sqnr_db(got: Any, want: Any) -> float:
    """Signal-to-quantization-noise ratio of ``got`` against ``want`` in dB (``inf`` when equal)."""
    import numpy as np

    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if g.shape != w.shape:
        raise AssertionError(f"shape {list(g.shape)}, expected {list(w.shape)}")
    noise = float(((g - w) ** 2).sum())
    return float("inf") if noise == 0 else float(10 * np.log10(float((w ** 2).sum()) / noise))


def _compute(node: Any, count_qdq: bool) -> bool:
    return (node.op == "call_function" and node.target is not operator.getitem
            and (count_qdq or not any(k in str(node.target) for k in _QDQ)))


def delegated_ops(program: Any, count_qdq: bool = False) -> tuple[int, int]:
    """(compute ops inside delegates, all compute ops) of a lowered ``ExportedProgram`` or an
    ``EdgeProgramManager`` -- edgeport's or ExecuTorch's (delegate calls read their lowered module's
    ``original_module``); quantize / dequantize nodes counted only with ``count_qdq``."""
    ep = program.exported_program() if hasattr(program, "exported_program") else program
    inside = outside = 0
    for n in ep.graph.nodes:
        if n.op == "call_function" and "call_delegate" in str(getattr(n.target, "__name__", n.target)):
            key = n.args[0]
            if isinstance(key, str):  # edgeport: the lowered module's registry key
                from edgeport.aot.delegate_op import lookup_lowered_module

                lowered = lookup_lowered_module(key)
            else:  # ExecuTorch: a get_attr of the lowered module
                lowered = getattr(ep.graph_module, key.target)
            inside += sum(1 for m in lowered.original_module.graph.nodes if _compute(m, count_qdq))
        elif _compute(n, count_qdq):
            outside += 1
    return inside, inside + outside
