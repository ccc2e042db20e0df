"""``aten._assert_tensor_metadata`` (left by export around dtype conversions, as in GPT-2, T5 and Llama) is checked
at lowering and removed; an assertion the graph contradicts is an ExportError naming the node."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeport import to_edge
from edgeport.errors import ExportError
from edgeport.runtime import Runtime


class CastAndScale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32) * 3.0


def _exported() -> torch.export.ExportedProgram:
    return torch.export.export(CastAndScale(), (torch.arange(6, dtype=torch.int32).reshape(2, 3),))


def _asserts(ep: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    return [n for n in ep.graph.nodes if n.target is torch.ops.aten._assert_tensor_metadata.default]


def test_metadata_asserts_are_removed_and_the_program_runs():
    ep = _exported()
    if not _asserts(ep):
        pytest.skip("this torch does not emit _assert_tensor_metadata for .to(); nothing to test")
    edge = to_edge(ep)
    assert not _asserts(edge.exported_program()), "the assertion must not reach the edge program"
    assert _asserts(ep), "the caller's exported program is left untouched"
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    (got,) = Runtime.get().load_program(edge.to_executorch().buffer).load_method("forward").execute([x])
    np.testing.assert_array_equal(got, CastAndScale()(torch.from_numpy(x)).numpy())


def test_an_assertion_the_graph_contradicts_is_refused_with_the_node():
    ep = _exported()
    nodes = _asserts(ep)
    if not nodes:
        pytest.skip("this torch does not emit _assert_tensor_metadata for .to(); nothing to test")
    node = nodes[0]
    node.kwargs = {**node.kwargs, "dtype": torch.float64}  # a model asserting a dtype its graph does not have
    # torch checks it while decomposing (retrace), edgeport again on the decomposed graph: either way an ExportError
    # naming the method, the assertion and the dtypes
    with pytest.raises(ExportError, match=r"(?s)method 'forward'.*_assert_tensor_metadata.*float64"):
        to_edge(ep)
