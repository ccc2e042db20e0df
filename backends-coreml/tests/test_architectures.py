"""Real architectures lowered for Core ML: ``edgeport.lower(model, inputs, backends=["CoreMLBackend"])`` on every
architecture of :data:`edgeport.testing.architectures.ARCHITECTURES` (lowering only: Core ML predicts on macOS).

Each lowers, every partition converts (no node refused by coremltools), and at least 98% of the compute ops are
inside Core ML delegates (ExecuTorch 1.5.1's Core ML partitioner: 98-100% on the same exports). The slow test runs
ExecuTorch's ``CoreMLPartitioner`` on the same export and checks edgeport delegates as large a share.
"""

from __future__ import annotations

import functools
import operator

import pytest
import torch

import edgeport
from edgeport.testing.architectures import ARCHITECTURES

pytest.importorskip("transformers")
pytest.importorskip("coremltools")

BACKEND = "CoreMLBackend"
MIN_SHARE = 0.98


def edgeport_share(manager) -> tuple[int, int]:
    """(compute ops inside delegates, compute ops left on the CPU) of ``edgeport.lower``'s result."""
    report = manager.lowering_report
    return sum(ops for _, ops in report.delegates), len(report.portable_ops)


def executorch_share(ep: torch.export.ExportedProgram) -> tuple[int, int]:
    """The same count for ExecuTorch's lowering of ``ep`` with its Core ML partitioner."""
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner
    from executorch.exir import to_edge_transform_and_lower

    program = to_edge_transform_and_lower(ep, partitioner=[CoreMLPartitioner()]).exported_program()
    inside = outside = 0
    for n in program.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        if "executorch_call_delegate" in str(n.target):
            lowered = getattr(program.graph_module, n.args[0].target)
            inside += sum(1 for m in lowered.original_module.graph.nodes
                          if m.op == "call_function" and m.target is not operator.getitem)
        else:
            outside += 1
    return inside, outside


@functools.cache
def _lowered(name: str):
    arch = ARCHITECTURES[name]()
    return arch, edgeport.lower(arch.model, arch.example_inputs, backends=[BACKEND])


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_architecture_lowers_for_coreml(name):
    _, manager = _lowered(name)
    report = manager.lowering_report
    refused = [(node, why) for node, _, why in report.portable_ops if "could not convert" in why]
    assert not refused, refused
    inside, outside = edgeport_share(manager)
    assert report.delegates and all(b == BACKEND for b, _ in report.delegates)
    assert inside / (inside + outside) >= MIN_SHARE, f"{name}: {inside} of {inside + outside} ops delegated"
    from edgeport.program import load_pte

    assert load_pte(manager.buffer).program.execution_plan  # the program reads back


@pytest.mark.slow
@pytest.mark.executorch
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_share_at_least_executorchs(name):
    pytest.importorskip("executorch")
    arch, manager = _lowered(name)
    ours = edgeport_share(manager)
    theirs = executorch_share(torch.export.export(arch.model, arch.example_inputs))
    assert ours[0] / sum(ours) >= theirs[0] / sum(theirs), f"{name}: edgeport {ours}, ExecuTorch {theirs}"
