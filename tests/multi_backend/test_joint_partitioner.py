"""JointPartitioner: priorities, the max_pool2d keep-whole conflict, islands, size/count rules, bad input,
and partition counts against ExecuTorch's flow."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import edgeport
from edgeport import to_edge, to_edge_transform_and_lower
from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner
from edgeport.aot.delegate_op import is_call_delegate
from edgeport.aot.joint_partitioner import JointPartitioner
from edgeport.backend import CapabilityTable, OpCapability
from edgeport.errors import PartitionError

xnn = pytest.importorskip("edgeport_xnnpack.partitioner")
XnnpackPartitioner = xnn.XnnpackPartitioner


class PoolNet(torch.nn.Module):
    """conv -> relu -> max_pool2d -> flatten -> linear -> sin."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return torch.sin(self.fc(y.flatten(1)))


class Chain(torch.nn.Module):
    """add -> mul -> sub -> mul -> add: five elementwise ops in a row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x + 1.0) * 2.0
        y = y - 0.5
        return (y * 3.0) + 1.0


def _table(*ops: str) -> CapabilityTable:
    """float32 ops; ``max_pool2d_with_indices`` also has its int64 indices output."""
    return CapabilityTable(tuple(OpCapability(op, ("float32", "int64") if "indices" in op else ("float32",))
                                 for op in ops))


ALL_ELEMENTWISE = ("aten.add.Scalar", "aten.mul.Scalar", "aten.sub.Scalar")


def _toy(backend_id: str, *ops: str) -> CapabilityBasedPartitioner:
    """A capability partitioner for a real backend id with a restricted table (tags only; not lowered)."""
    return CapabilityBasedPartitioner(backend_id, _table(*ops))


def _edge(model: torch.nn.Module, *inputs: torch.Tensor) -> torch.export.ExportedProgram:
    return to_edge(torch.export.export(model.eval(), inputs)).exported_program()


def _owners(jp: JointPartitioner) -> dict[str, str | None]:
    return {name: r.owner for name, r in jp.ownership.items()}


def _delegates(program: torch.export.ExportedProgram) -> list[str]:
    return [n.meta["delegate_backend"] for n in program.graph.nodes if is_call_delegate(n)]


def test_priority_decides_the_owner_and_the_report_says_why() -> None:
    ep = _edge(Chain(), torch.randn(4))
    first = JointPartitioner([_toy("XnnpackBackend", *ALL_ELEMENTWISE), _toy("VulkanBackend", *ALL_ELEMENTWISE)])
    result = first.partition(ep)
    assert {s.backend_id for s in result.partition_tags.values()} == {"XnnpackBackend"}
    assert set(_owners(first).values()) == {"XnnpackBackend"}
    assert all(r.not_taken["VulkanBackend"] == "owned by higher-priority XnnpackBackend"
               for r in first.ownership.values())
    ep = _edge(Chain(), torch.randn(4))
    second = JointPartitioner([_toy("VulkanBackend", *ALL_ELEMENTWISE), _toy("XnnpackBackend", *ALL_ELEMENTWISE)])
    second.partition(ep)
    assert set(_owners(second).values()) == {"VulkanBackend"}


def test_one_op_island_is_not_split_off() -> None:
    # Vulkan (first) takes only sub; XNNPACK (second) takes everything. sub sits between XNNPACK ops.
    parts = lambda: [_toy("VulkanBackend", "aten.sub.Scalar"), _toy("XnnpackBackend", *ALL_ELEMENTWISE)]  # noqa: E731
    ep = _edge(Chain(), torch.randn(4))
    split = JointPartitioner(parts(), boundary_cost=0)
    tags = split.partition(ep).partition_tags
    assert [s.backend_id for s in tags.values()] == ["XnnpackBackend", "VulkanBackend", "XnnpackBackend"]
    ep = _edge(Chain(), torch.randn(4))
    joint = JointPartitioner(parts(), boundary_cost=1)
    tags = joint.partition(ep).partition_tags
    assert [s.backend_id for s in tags.values()] == ["XnnpackBackend"]
    assert "island" in joint.ownership["sub"].not_taken["VulkanBackend"]


def test_min_partition_ops_and_max_partitions_apply_to_every_backend() -> None:
    ep = _edge(Chain(), torch.randn(4))
    # XNNPACK can take add and mul only: partitions {add, mul} and {mul_1, add_1}, sub on the CPU
    jp = JointPartitioner([_toy("XnnpackBackend", "aten.add.Scalar", "aten.mul.Scalar")], min_partition_ops=3)
    assert jp.partition(ep).partition_tags == {}
    assert "min_partition_ops=3" in jp.ownership["add"].not_taken["XnnpackBackend"]
    ep = _edge(Chain(), torch.randn(4))
    jp = JointPartitioner([_toy("XnnpackBackend", "aten.add.Scalar", "aten.mul.Scalar")], max_partitions=1)
    assert len(jp.partition(ep).partition_tags) == 1
    assert sum(r.owner == "XnnpackBackend" for r in jp.ownership.values()) == 2
    # the partition given up goes to the next backend that can take it
    ep = _edge(Chain(), torch.randn(4))
    jp = JointPartitioner([_toy("XnnpackBackend", "aten.add.Scalar", "aten.mul.Scalar"),
                           _toy("VulkanBackend", *ALL_ELEMENTWISE)], max_partitions=1, boundary_cost=0)
    backends = sorted(s.backend_id for s in jp.partition(ep).partition_tags.values())
    assert backends == ["VulkanBackend", "XnnpackBackend"]


class _KeepsMaxPool(CapabilityBasedPartitioner):
    """A backend that asks for max_pool2d whole (as Arm, QNN and Vulkan do)."""

    def ops_to_not_decompose(self, ep):  # type: ignore[no-untyped-def]
        return [torch.ops.aten.max_pool2d.default], None


_CNN_OPS = ("aten.convolution.default", "aten.relu.default", "aten.max_pool2d_with_indices.default")


def test_max_pool2d_kept_whole_only_for_its_owner_and_the_program_runs() -> None:
    """ExecuTorch #14458: the second backend keeps max_pool2d whole, the first can only take its decomposed form.
    Sequentially the first backend loses the node (ExecuTorch's lowering broke); resolved per node by its owner,
    the first backend gets the decomposed form, and the program matches eager."""
    pytest.importorskip("edgeport_vulkan")
    torch.manual_seed(0)
    model, x = PoolNet().eval(), torch.randn(1, 3, 8, 8)
    ep = torch.export.export(model, (x,))

    def parts() -> list[CapabilityBasedPartitioner]:
        return [CapabilityBasedPartitioner("XnnpackBackend", _table(*_CNN_OPS)),
                _KeepsMaxPool("VulkanBackend", _table("aten.max_pool2d.default"))]

    seq = to_edge_transform_and_lower(ep, partitioner=parts()).exported_program()
    assert _delegates(seq) == ["XnnpackBackend", "VulkanBackend"]  # priority lost: max_pool2d went to Vulkan
    jp = JointPartitioner(parts())
    manager = to_edge_transform_and_lower(ep, partitioner=[jp])
    assert jp.decompositions["max_pool2d"].startswith("decomposed: CapabilityBasedPartitioner comes first")
    assert _owners(jp)["max_pool2d_with_indices"] == "XnnpackBackend"
    assert _delegates(manager.exported_program()) == ["XnnpackBackend"]  # flatten, linear, sin: on the CPU
    out = edgeport.load(manager.to_executorch().buffer)(x.numpy())[0]
    np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    # and when the keeping backend comes first, it gets max_pool2d whole
    jp = JointPartitioner(parts()[::-1])
    to_edge_transform_and_lower(ep, partitioner=[jp])
    assert jp.decompositions["max_pool2d"].startswith("kept whole: _KeepsMaxPool")
    assert _owners(jp)["max_pool2d"] == "VulkanBackend"


def test_same_backend_twice_with_conflicting_compile_specs_is_an_error() -> None:
    from edgeport.backend import CompileSpec

    ep = _edge(Chain(), torch.randn(4))
    a = CapabilityBasedPartitioner("XnnpackBackend", _table(*ALL_ELEMENTWISE), [CompileSpec("k", b"1")])
    b = CapabilityBasedPartitioner("XnnpackBackend", _table(*ALL_ELEMENTWISE), [CompileSpec("k", b"2")])
    with pytest.raises(PartitionError, match="conflicting compile specs"):
        JointPartitioner([a, b]).partition(ep)


@pytest.mark.parametrize("kwargs", [{"min_partition_ops": 0}, {"max_partitions": 0}, {"boundary_cost": -1}])
def test_bad_options(kwargs: dict[str, int]) -> None:
    with pytest.raises(PartitionError):
        JointPartitioner([XnnpackPartitioner()], **kwargs)


class SplitNet(torch.nn.Module):
    """conv -> relu -> cumsum -> conv -> relu: cumsum is on no XNNPACK (ours or ExecuTorch's)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.c2(torch.cumsum(torch.relu(self.c1(x)), 1)))


@pytest.mark.executorch
def test_partition_count_matches_executorch_flow() -> None:
    et_exir = pytest.importorskip("executorch.exir")
    et_xnn = pytest.importorskip("executorch.backends.xnnpack.partition.xnnpack_partitioner")
    torch.manual_seed(0)
    model, x = SplitNet().eval(), torch.randn(1, 3, 8, 8)
    ep = torch.export.export(model, (x,))
    theirs = et_exir.to_edge_transform_and_lower(ep, partitioner=[et_xnn.XnnpackPartitioner()])
    their_count = sum(1 for n in theirs.exported_program().graph.nodes
                      if n.op == "call_function" and "call_delegate" in str(n.target))
    ours = to_edge_transform_and_lower(ep, partitioner=[JointPartitioner([XnnpackPartitioner()])])
    assert len(_delegates(ours.exported_program())) == their_count == 2
