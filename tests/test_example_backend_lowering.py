"""Lowering to the example backend through the full pipeline (core + edgeport-example together)."""

from __future__ import annotations

import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.aot.delegate_op import CALL_DELEGATE
from edgeport.testing.models import MODELS

example = pytest.importorskip("edgeport_example")
from edgeport_example.partitioner import ExamplePartitioner  # noqa: E402


def _delegates(ep):
    return [n for n in ep.graph.nodes if n.target is CALL_DELEGATE]


def test_ops_to_not_decompose_keeps_linear_whole_for_the_partitioner():
    model, inputs = MODELS["mlp"]()
    ep = torch.export.export(model, inputs)
    edge = to_edge_transform_and_lower(ep, partitioner=[ExamplePartitioner()])
    program = edge.exported_program()
    (call,) = _delegates(program)
    lowered = edge.exported_program().graph_module.lowered_module_0
    inner = [str(n.target) for n in lowered.original_module.graph.nodes if n.op == "call_function"]
    assert inner.count("aten.linear.default") == 4 and inner.count("aten.relu.default") == 3
    # Nothing outside the delegate: the whole MLP went to the backend, weights included.
    assert [n for n in program.graph.nodes if n.op == "call_function" and n.target is not CALL_DELEGATE
            and "getitem" not in str(n.target)] == []
    assert not program.state_dict
    with torch.no_grad():
        torch.testing.assert_close(program.module()(*inputs), model(*inputs))


def test_kept_op_left_undelegated_is_decomposed_afterwards():
    model, inputs = MODELS["two_linear"]()
    ep = torch.export.export(model, inputs)
    # Reject the second linear: it was kept whole for the partitioner, so it must be decomposed after lowering.
    partitioner = ExamplePartitioner(node_filter=lambda n: "rejected by test" if n.name == "linear_1" else True)
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    targets = [str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"]
    assert "aten.linear.default" not in targets
    assert "aten.addmm.default" in targets or "aten.mm.default" in targets
    assert partitioner.rejections["linear_1"] == "rejected by test"
    with torch.no_grad():
        torch.testing.assert_close(edge.exported_program().module()(*inputs), model(*inputs))
    # And the result still serializes.
    assert edge.to_executorch().buffer[4:8] == b"ET12"


def test_partitioners_apply_in_priority_order(demo_backend, demo_partitioner):
    class M(torch.nn.Module):
        def forward(self, a, b):
            return torch.mm(a, b) + torch.sin(a)

    inputs = (torch.randn(3, 3), torch.randn(3, 3))
    ep = torch.export.export(M(), inputs)
    # The demo partitioner (add, mm) goes first and takes mm + add; the example backend then takes sin.
    edge = to_edge_transform_and_lower(ep, partitioner=[demo_partitioner(), ExamplePartitioner()])
    backends = [edge.exported_program().graph_module.get_submodule(name).backend_id
                for name, _ in edge.exported_program().graph_module.named_children()]
    assert sorted(backends) == ["BackendWithCompilerDemo", "ExampleBackend"]
    torch.testing.assert_close(edge.exported_program().module()(*inputs), M()(*inputs))


def test_transform_passes_run_before_partitioning():
    from edgeport import ExportPass

    class TanhToRelu(ExportPass):
        def call_operator(self, op, args, kwargs, meta):
            if op == torch.ops.aten.tanh.default:
                op = torch.ops.aten.relu.default
            return super().call_operator(op, args, kwargs, meta)

    model, inputs = MODELS["two_linear"]()
    ep = torch.export.export(model, inputs)
    edge = to_edge_transform_and_lower(ep, transform_passes=[TanhToRelu()], partitioner=[ExamplePartitioner()])
    # With tanh gone, linear-relu-linear is one partition.
    assert len(_delegates(edge.exported_program())) == 1


def test_min_partition_size_keeps_small_partitions_portable():
    model, inputs = MODELS["two_linear"]()
    ep = torch.export.export(model, inputs)
    edge = to_edge_transform_and_lower(ep, partitioner=[ExamplePartitioner(min_partition_size=2)])
    assert _delegates(edge.exported_program()) == []
