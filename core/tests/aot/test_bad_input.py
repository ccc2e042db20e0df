"""Bad input gets a clear error naming what is wrong: not exported, unsupported ops, contract-breaking partitioners."""

from __future__ import annotations

import pytest
import torch

import edgeport
from edgeport import (
    DelegationSpec,
    Partitioner,
    PartitionResult,
    to_backend,
    to_edge,
    to_edge_transform_and_lower,
)
from edgeport.aot.partitioner import DELEGATION_TAG


class TwoMM(torch.nn.Module):
    def forward(self, a, x, b):
        y = torch.mm(a, x)
        z = y + b
        a = z - a
        y = torch.mm(a, x)
        return y + b


def _edge():
    inputs = (torch.randn(2, 2), torch.randn(2, 2), torch.randn(2, 2))
    return to_edge(torch.export.export(TwoMM(), inputs))


class ScriptedPartitioner(Partitioner):
    """Tags nodes by name according to ``plan`` ({node name: tag}) and may misbehave on purpose."""

    def __init__(self, plan, backend_id, mutate=False, extra_tag=None):
        super().__init__()
        self.plan, self.backend_id, self.mutate, self.extra_tag = plan, backend_id, mutate, extra_tag

    def partition(self, ep):
        for node in ep.graph.nodes:
            if node.name in self.plan:
                node.meta[DELEGATION_TAG] = self.plan[node.name]
        if self.mutate:
            first = next(n for n in ep.graph.nodes if n.op == "call_function")
            first.target = torch.ops.aten.sub.Tensor
        tags = {t: DelegationSpec(self.backend_id, []) for t in set(self.plan.values())}
        if self.extra_tag:
            tags[self.extra_tag] = DelegationSpec(self.backend_id, [])
        return PartitionResult(ep, tags)


def test_not_an_exported_program():
    with pytest.raises(edgeport.ExportError, match="torch.export.export"):
        to_edge(TwoMM())


def test_partitioner_that_changes_the_graph(demo_backend):
    edge = _edge()
    with pytest.raises(edgeport.PartitionError, match="ScriptedPartitioner changed the graph"):
        to_backend(edge.exported_program(), ScriptedPartitioner({"mm": "t0"}, demo_backend, mutate=True))


def test_partitioner_that_creates_a_cycle(demo_backend):
    # mm and the second mm in one partition, the add/sub between them outside: mm -> add -> sub -> mm_1.
    edge = _edge()
    with pytest.raises(edgeport.PartitionError, match="cycle"):
        to_backend(edge.exported_program(), ScriptedPartitioner({"mm": "t0", "mm_1": "t0"}, demo_backend))


def test_partitioner_that_names_an_unknown_backend(demo_backend):
    edge = _edge()
    with pytest.raises(edgeport.BackendNotFoundError, match="NoSuchBackend.*Installed backends"):
        to_backend(edge.exported_program(), ScriptedPartitioner({"mm": "t0"}, "NoSuchBackend"))


def test_partitioner_that_tags_a_user_input(demo_backend):
    edge = _edge()
    with pytest.raises(edgeport.PartitionError, match="tagged user input 'a'"):
        to_backend(edge.exported_program(), ScriptedPartitioner({"a": "t0", "mm": "t0"}, demo_backend))


def test_partitioner_with_a_tag_missing_from_partition_tags(demo_backend):
    class Sloppy(ScriptedPartitioner):
        def partition(self, ep):
            result = super().partition(ep)
            result.partition_tags.clear()
            return result

    edge = _edge()
    with pytest.raises(edgeport.PartitionError, match="not in partition_tags"):
        to_backend(edge.exported_program(), Sloppy({"mm": "t0"}, demo_backend))


def test_preprocess_failure_names_the_backend_and_partition(demo_backend):
    # The demo backend supports only sin/mm/add: give it a sub.
    edge = _edge()
    with pytest.raises(edgeport.LoweringError, match="BackendWithCompilerDemo.*sub"):
        to_backend(edge.exported_program(), ScriptedPartitioner({"sub": "t0"}, demo_backend))


def test_op_nothing_supports_is_named():
    @torch.library.custom_op("edgeport_test::mystery", mutates_args=())
    def mystery(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    @mystery.register_fake
    def _(x):
        return torch.empty_like(x)

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.edgeport_test.mystery(x) + 1

    ep = torch.export.export(M(), (torch.randn(3),))
    with pytest.raises(edgeport.VerificationError, match="node 'mystery'.*edgeport_test.mystery"):
        to_edge(ep)
    # Kept as an exception, it then has no out-variant: named at to_executorch.
    from edgeport import EdgeCompileConfig

    edge = to_edge(ep, compile_config=EdgeCompileConfig(
        _core_aten_ops_exception_list=[torch.ops.edgeport_test.mystery.default]))
    with pytest.raises(edgeport.UnsupportedOperatorError, match="node 'mystery'"):
        edge.to_executorch()


def test_partitioners_for_unknown_methods():
    ep = torch.export.export(TwoMM(), (torch.randn(2, 2), torch.randn(2, 2), torch.randn(2, 2)))
    with pytest.raises(edgeport.PartitionError, match="unknown methods"):
        to_edge_transform_and_lower(ep, partitioner={"decode": []})


def test_bad_alignment_is_rejected():
    with pytest.raises(edgeport.SerializationError, match="power of two"):
        edgeport.ExecutorchBackendConfig(segment_alignment=100)


def test_memory_planner_that_overlaps_live_tensors_is_rejected():
    from edgeport import ExecutorchBackendConfig

    class M(torch.nn.Module):
        def forward(self, x):
            return (x + 1) * (x + 2)

    edge = to_edge(torch.export.export(M(), (torch.randn(4),)))
    with pytest.raises(ValueError, match="overlapped"):
        edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=lambda tensors: [0] * len(tensors)))
