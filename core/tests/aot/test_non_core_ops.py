"""Non-core ATen ops export leaves in the graph: ``aten._assert_tensor_metadata`` (GPT-2, T5, Llama) is checked at
lowering and removed (an assertion the graph contradicts is an ExportError naming the node); an op nothing lowers is a
VerificationError naming the node, the op and the installed backends that claim it."""

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


class _ClaimsI0:
    """A script plugin whose capability table claims aten.i0.default (a non-core op export leaves in the graph)."""

    @staticmethod
    def table():
        from edgeport.backend import CapabilityTable, OpCapability

        return CapabilityTable(ops=(OpCapability("aten.i0.default"),))

    def __init__(self):
        import edgeport
        from edgeport.backend import BackendSpec, PreprocessResult

        class Plugin:
            @edgeport.hookimpl
            def edgeport_register_backends(self, registry):
                registry.add(BackendSpec(backend_id="I0Backend", version="0.0.1",
                                         preprocess=lambda ep, specs: PreprocessResult(b"x"),
                                         capabilities=_ClaimsI0.table))

        self.plugin = Plugin()


def test_an_op_nothing_lowers_names_the_node_the_op_and_who_would_take_it():
    import edgeport
    from edgeport.errors import VerificationError

    class Bessel(torch.nn.Module):
        def forward(self, x):
            return torch.special.i0(x) * 2

    ep = torch.export.export(Bessel(), (torch.randn(4),))
    with pytest.raises(VerificationError, match=r"node 'i0': operator aten.i0.default is not in core ATen.*"
                                                r"no installed backend claims it"):
        to_edge(ep)
    claims = _ClaimsI0()
    edgeport.register_plugin(claims.plugin, name="claims-i0")
    try:
        with pytest.raises(VerificationError, match=r"installed backends that claim it: I0Backend -- pass that "
                                                    r"backend's partitioner"):
            to_edge(ep)
    finally:
        edgeport.unregister_plugin(claims.plugin)
