"""Assertion nodes export leaves in the graph (``_assert_scalar``, ``_assert_async``, ``sym_constrain_range*``) and
the composite ops ExecuTorch's ``to_edge`` decomposes beyond torch's core table (``linalg_vector_norm``): programs
that ExecuTorch lowers lower with edgeport too and match eager PyTorch on edgeport's runtime; an assertion the graph
refutes is an ExportError naming the node. (The stock runtime runs these programs in tests/test_architectures.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeport import to_edge
from edgeport.aot.passes.graph_asserts import ASSERT_OPS, remove_graph_asserts
from edgeport.errors import ExportError
from edgeport.runtime import Runtime


class Nonzero(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x > 0)


class OneHot(torch.nn.Module):
    def forward(self, i: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(i, 5)


class Norms(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.nn.functional.normalize(x, dim=-1), x.norm(dim=0, keepdim=True),
                torch.linalg.vector_norm(x, ord=float("inf")), torch.linalg.vector_norm(x, ord=1, dim=1))


class MeanOfNonzero(torch.nn.Module):
    """A data-dependent length with a run-time assertion on it (``u0 >= 1``), used as a divisor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nz = torch.nonzero(x > 0)
        torch._check(nz.shape[0] >= 1)
        return nz.sum(0) / nz.shape[0]


X = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))


def _targets(ep: torch.export.ExportedProgram) -> set:
    return {n.target for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule)
            for n in gm.graph.nodes}


def _run(ep: torch.export.ExportedProgram, *args: torch.Tensor) -> list[np.ndarray]:
    method = Runtime.get().load_program(to_edge(ep).to_executorch().buffer).load_method("forward")
    return method.execute([a.numpy() for a in args])


def test_nonzero_lowers_and_its_data_dependent_length_runs():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    ep = torch.export.export(Nonzero(), (x,))
    assert torch.ops.aten._assert_scalar.default in _targets(ep.run_decompositions())
    edge = to_edge(ep).exported_program()
    assert not _targets(edge) & ASSERT_OPS
    assert not any(n.target is torch.ops.aten.sym_size.int for n in edge.graph.nodes), \
        "the sizes computed only for the assertions go with them"
    method = Runtime.get().load_program(to_edge(ep).to_executorch().buffer).load_method("forward")
    for probe in (x, torch.ones(3, 4), -torch.ones(3, 4), torch.eye(3, 4)):  # 0 .. 12 rows out of one program
        (got,) = method.execute([probe.numpy()])
        np.testing.assert_array_equal(got, Nonzero()(probe).numpy())


def test_one_hot_data_checks_are_removed_with_the_nodes_computing_them():
    i = torch.tensor([1, 4, 0])
    ep = torch.export.export(OneHot(), (i,))
    assert torch.ops.aten._assert_async.msg in _targets(ep.run_decompositions())
    edge = to_edge(ep).exported_program()
    assert not _targets(edge) & ASSERT_OPS
    assert torch.ops.aten.any.dims not in _targets(edge), "the data checks' reductions are dead code"
    for probe in (i, torch.tensor([3, 3, 2])):
        (got,) = Runtime.get().load_program(to_edge(ep).to_executorch().buffer).load_method("forward").execute(
            [probe.numpy()])
        np.testing.assert_array_equal(got, OneHot()(probe).numpy())


def test_a_data_dependent_assertion_goes_and_the_size_it_names_is_a_scalar_argument():
    (got,) = _run(torch.export.export(MeanOfNonzero(), (X,)), X)
    np.testing.assert_allclose(got, MeanOfNonzero()(X).numpy(), rtol=1e-6)


def test_range_constraints_are_removed_with_the_sizes_they_constrain():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    size = graph.call_function(torch.ops.aten.sym_size.int, (x, 0))
    graph.call_function(torch.ops.aten.sym_constrain_range_for_size.default, (size,), {"min": 0, "max": 8})
    graph.call_function(torch.ops.aten.sym_constrain_range.default, (size,), {"min": 0, "max": 8})
    graph.output((graph.call_function(torch.ops.aten.relu.default, (x,)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert remove_graph_asserts(gm, "forward") == 2
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [torch.ops.aten.relu.default]


def test_vector_norms_are_decomposed_as_executorch_does():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    ep = torch.export.export(Norms(), (x,))
    assert torch.ops.aten.linalg_vector_norm.default not in _targets(to_edge(ep).exported_program())
    for got, want in zip(_run(ep, x), Norms()(x)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


def test_a_norm_kept_whole_on_request_is_not_decomposed():
    from edgeport.aot.config import EdgeCompileConfig

    ep = torch.export.export(Norms(), (torch.randn(4, 6),))
    config = EdgeCompileConfig(preserve_ops=[torch.ops.aten.linalg_vector_norm.default], _check_ir_validity=False)
    assert torch.ops.aten.linalg_vector_norm.default in _targets(to_edge(ep, compile_config=config).exported_program())


def test_an_assertion_the_graph_refutes_is_refused_with_the_node():
    ep = torch.export.export(Nonzero(), (torch.randn(3, 4),)).run_decompositions()
    gm = ep.graph_module
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten._assert_scalar.default)
    node.args = (False, "u0 >= 0 (made to fail)")
    with pytest.raises(ExportError, match=rf"method 'm', node '{node.name}': .*never holds.*made to fail"):
        remove_graph_asserts(gm, "m")


def test_an_assertion_whose_result_is_used_is_refused_not_dropped():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    token = graph.call_function(torch.ops.aten._functional_assert_async.msg,
                                (x, "checked", graph.call_function(torch.ops.aten._make_dep_token.default)))
    graph.output((x, token))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(ExportError, match=r"is used by \['output'\]"):
        remove_graph_asserts(gm, "forward")
