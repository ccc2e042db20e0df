"""Tests of edgeport.aot.capability_partitioner on exported programs (random graphs and deep MLPs are in
test_capability_partitioner_invariants.py)."""

from __future__ import annotations

import operator

import pytest
import torch
from partitioner_checks import assert_partition_invariants, export, snapshot, table
from torch.fx import Graph, Node

from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner, op_name
from edgeport.aot.partitioner import DELEGATION_TAG, PartitionResult
from edgeport.backend import CapabilityTable, CompileSpec, DelegationSpec, OpCapability

aten = torch.ops.aten


def tags_by_name(graph: Graph) -> dict[str, str]:
    return {n.name: n.meta[DELEGATION_TAG] for n in graph.nodes if DELEGATION_TAG in n.meta}


class Tutorial(torch.nn.Module):
    def forward(self, a, x, b):
        y = torch.mm(a, x)
        z = y + b
        a = z - a
        y = torch.mm(a, x)
        z = y + b
        return z


def tutorial_ep(dtype=torch.float32):
    return export(Tutorial(), *(torch.randn(2, 2, dtype=dtype) for _ in range(3)))


# --- unit tests ------------------------------------------------------------------------------------------


def test_op_name_is_str_of_overload():
    assert str(aten.add.Tensor) == "aten.add.Tensor"
    assert op_name(aten.add.Tensor) == "aten.add.Tensor"
    assert op_name(aten.mm.default) == "aten.mm.default"
    assert op_name(operator.getitem) == "operator.getitem"


def test_tutorial_two_partitions():
    ep = tutorial_ep()
    before = snapshot(ep.graph)
    specs = [CompileSpec("max_value", bytes([4]))]
    p = CapabilityBasedPartitioner("Demo", table("aten.mm.default", "aten.add.Tensor"), specs)
    result = p.partition(ep)
    assert isinstance(result, PartitionResult)
    assert result.tagged_exported_program is ep
    assert result.partition_tags == {
        "tag0": DelegationSpec("Demo", specs),
        "tag1": DelegationSpec("Demo", specs),
    }
    assert tags_by_name(ep.graph) == {"mm": "tag0", "add": "tag0", "mm_1": "tag1", "add_1": "tag1"}
    assert p.rejections == {"sub": "op aten.sub.Tensor is not in the Demo capability table"}
    assert snapshot(ep.graph) == before


def test_tutorial_all_supported_is_one_partition():
    ep = tutorial_ep()
    p = CapabilityBasedPartitioner("Demo", table("aten.mm.default", "aten.add.Tensor", "aten.sub.Tensor"))
    tags = p.partition(ep).partition_tags
    assert list(tags) == ["tag0"]
    assert set(tags_by_name(ep.graph)) == {"mm", "add", "sub", "mm_1", "add_1"}
    assert p.rejections == {}


def test_dtype_rejection():
    ep = tutorial_ep(torch.float64)
    p = CapabilityBasedPartitioner("Demo", table("aten.mm.default", "aten.add.Tensor"))
    assert p.partition(ep).partition_tags == {}
    assert tags_by_name(ep.graph) == {}
    assert set(p.rejections) == {"mm", "add", "sub", "mm_1", "add_1"}
    assert "float64" in p.rejections["mm"] and "(float32)" in p.rejections["mm"]
    # accepting float64 makes them supported again
    p64 = CapabilityBasedPartitioner("Demo", table("aten.mm.default", "aten.add.Tensor", dtypes=("float64",)))
    assert len(p64.partition(ep).partition_tags) == 2


def test_input_dtype_is_checked():
    class M(torch.nn.Module):
        def forward(self, x, i):
            return x * i  # float32 output, int64 input

    ep = export(M(), torch.randn(3), torch.arange(3))
    p = CapabilityBasedPartitioner("Demo", table("aten.mul.Tensor"))
    p.partition(ep)
    assert tags_by_name(ep.graph) == {}
    assert "int64" in p.rejections["mul"] and "'i'" in p.rejections["mul"]


def test_constraint_and_node_filter():
    def only_2x2(node: Node) -> str | None:
        return None if tuple(node.meta["val"].shape) == (2, 2) else "only 2x2"

    caps = CapabilityTable(
        (OpCapability("aten.mm.default", constraint=only_2x2), OpCapability("aten.add.Tensor"))
    )
    ep = tutorial_ep()
    p = CapabilityBasedPartitioner(
        "Demo", caps, node_filter=lambda n: "no second add" if n.name == "add_1" else True
    )
    p.partition(ep)
    assert tags_by_name(ep.graph) == {"mm": "tag0", "add": "tag0", "mm_1": "tag1"}
    assert p.rejections["add_1"] == "no second add"

    ep = export(Tutorial(), *(torch.randn(3, 3) for _ in range(3)))
    p = CapabilityBasedPartitioner("Demo", caps, node_filter=lambda n: n.name != "add")
    p.partition(ep)
    assert tags_by_name(ep.graph) == {"add_1": "tag0"}
    assert p.rejections["mm"] == "aten.mm.default: only 2x2"
    assert p.rejections["add"] == "rejected by node_filter"


def test_min_partition_size():
    ep = tutorial_ep()
    p = CapabilityBasedPartitioner("Demo", table("aten.mm.default", "aten.add.Tensor"), min_partition_size=3)
    assert p.partition(ep).partition_tags == {}
    assert tags_by_name(ep.graph) == {}
    assert "min_partition_size=3" in p.rejections["mm"]
    assert "min_partition_size=3" in p.rejections["add_1"]
    p = CapabilityBasedPartitioner("Demo", table("aten.mm.default", "aten.add.Tensor"), min_partition_size=2)
    assert len(p.partition(ep).partition_tags) == 2
    with pytest.raises(ValueError):
        CapabilityBasedPartitioner("Demo", table(), min_partition_size=0)


def test_cycle_is_refused_and_reported():
    class M(torch.nn.Module):
        def forward(self, x):
            a = torch.sin(x)
            b = torch.cos(a)  # not supported
            return a + b  # joining sin's partition would give sin -> cos -> add in one delegate

    ep = export(M(), torch.randn(4))
    p = CapabilityBasedPartitioner("Demo", table("aten.sin.default", "aten.add.Tensor"))
    assert len(p.partition(ep).partition_tags) == 2
    assert tags_by_name(ep.graph) == {"sin": "tag0", "add": "tag1"}
    p = CapabilityBasedPartitioner("Demo", table("aten.sin.default", "aten.add.Tensor"), min_partition_size=2)
    p.partition(ep)
    assert tags_by_name(ep.graph) == {}
    assert "cycle" in p.rejections["add"]


def test_quotient_cycle_between_convex_partitions_is_refused():
    # Two partitions that are each convex but feed each other: {a, d} and {b, c} with a->c and b->d.
    # Built by hand: s(a)=sin, the joins are adds; u1/u2 are unsupported.
    g = Graph()
    x = g.placeholder("x")
    nodes = {}

    def op(name, target, *args):
        n = g.call_function(target, args)
        n.name = name
        n.meta["val"] = torch.empty(2)
        nodes[name] = n
        return n

    x.meta["val"] = torch.empty(2)
    a = op("a", aten.sin.default, x)
    b = op("b", aten.sin.default, x)
    u1 = op("u1", aten.cos.default, a)  # a -> u1 -> c
    u2 = op("u2", aten.cos.default, b)  # b -> u2 -> d
    c = op("c", aten.add.Tensor, b, u1)
    d = op("d", aten.add.Tensor, a, u2)
    g.output((c, d))
    p = CapabilityBasedPartitioner("Demo", table("aten.sin.default", "aten.add.Tensor"))
    p.tag_graph(g)
    assert_partition_invariants(g, p, 1)


def test_constants_follow_their_partition():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("scale", torch.full((4,), 2.0))
            self.shared = torch.nn.Parameter(torch.ones(4))

        def forward(self, x):
            y = torch.relu(self.lin(x)) * self.scale + self.shared
            z = torch.cos(y)  # not supported: splits the graph
            return z + self.shared

    ep = export(M(), torch.randn(2, 4))
    p = CapabilityBasedPartitioner(
        "Demo",
        table(
            "aten.addmm.default",
            "aten.permute.default",
            "aten.relu.default",
            "aten.mul.Tensor",
            "aten.add.Tensor",
        ),
    )
    tags = p.partition(ep).partition_tags
    assert list(tags) == ["tag0", "tag1"]
    tagged = tags_by_name(ep.graph)
    assert tagged["p_lin_weight"] == tagged["p_lin_bias"] == tagged["b_scale"] == "tag0"
    assert "p_shared" not in tagged and "x" not in tagged
    assert "tag0" in p.shared_constants["p_shared"] and "tag1" in p.shared_constants["p_shared"]

    # a constant also used outside any partition is not tagged
    class N(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, x):
            return torch.sin(x * self.w) + torch.cos(self.w)

    ep = export(N(), torch.randn(4))
    p = CapabilityBasedPartitioner("Demo", table("aten.mul.Tensor", "aten.sin.default", "aten.add.Tensor"))
    p.partition(ep)
    assert "p_w" not in tags_by_name(ep.graph)
    assert "non-delegated" in p.shared_constants["p_w"]


def test_mutated_buffer_is_not_tagged():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(3))

        def forward(self, x):
            self.count.add_(x)
            return self.count * 2

    ep = export(M(), torch.randn(3))
    p = CapabilityBasedPartitioner("Demo", table("aten.add.Tensor", "aten.mul.Tensor"))
    p.partition(ep)
    tagged = tags_by_name(ep.graph)
    assert tagged  # the add and mul are delegated
    assert "b_count" not in tagged


def test_getitem_follows_its_producer():
    class M(torch.nn.Module):
        def forward(self, x):
            values, indices = torch.max(x, dim=1)
            return values + 1.0, indices

    ep = export(M(), torch.randn(3, 4))
    ops = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert any(n.target is operator.getitem for n in ops)
    before = snapshot(ep.graph)
    p = CapabilityBasedPartitioner(
        "Demo", table("aten.max.dim", "aten.add.Tensor", dtypes=("float32", "int64"))
    )
    p.partition(ep)
    tagged = tags_by_name(ep.graph)
    assert {n.name for n in ops} == set(tagged)
    assert set(tagged.values()) == {"tag0"}
    assert snapshot(ep.graph) == before

    p = CapabilityBasedPartitioner("Demo", table("aten.add.Tensor"))
    p.partition(ep)
    getitems = [n.name for n in ops if n.target is operator.getitem]
    for name in getitems:
        assert name not in tags_by_name(ep.graph)
        assert "getitem of non-delegated node" in p.rejections[name]


def test_stale_tags_are_cleared():
    ep = tutorial_ep()
    for n in ep.graph.nodes:
        n.meta[DELEGATION_TAG] = "old"
    CapabilityBasedPartitioner("Demo", table("aten.mm.default")).partition(ep)
    assert tags_by_name(ep.graph) == {"mm": "tag0", "mm_1": "tag1"}
