"""Shared helpers for the ExampleBackend tests (exposed as fixtures)."""

from __future__ import annotations

import pytest
import torch


def make_edge_program(
    module: torch.nn.Module, *args: torch.Tensor, keep_linear: bool = False, dynamic_shapes=None
):
    """An edge-like program without edgeport's pipeline: export, decompose, and swap view ops for *_copy ones
    (the two normalizations of edgeport's edge dialect that matter for ExampleBackend)."""
    ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    table = torch.export.default_decompositions()
    if keep_linear:
        table.pop(torch.ops.aten.linear.default, None)
    ep = ep.run_decompositions(table)
    for node in ep.graph.nodes:
        if node.target is torch.ops.aten.permute.default:
            node.target = torch.ops.aten.permute_copy.default
    ep.graph_module.recompile()
    return ep


@pytest.fixture
def edge_program():
    return make_edge_program
