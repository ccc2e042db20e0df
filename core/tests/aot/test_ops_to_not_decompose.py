"""``Partitioner.ops_to_not_decompose``'s per-node filter in ``to_edge_transform_and_lower``.

A node of a listed op stays whole when some partitioner lists the op and that partitioner's filter is ``None`` or
accepts the node; the other nodes of the op are decomposed as usual. The toy backend here takes
``aten.linear.default`` whole; its partitioner keeps (and delegates) only linears with at least ``min_out``
output features, read from the node's ``meta["val"]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.export import ExportedProgram

import edgeport
from edgeport import EdgeCompileConfig, to_edge_transform_and_lower
from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner
from edgeport.aot.delegate_op import CALL_DELEGATE
from edgeport.aot.partitioner import Partitioner, PartitionResult
from edgeport.backend import BackendSpec, CapabilityTable, CompileSpec, OpCapability, PreprocessResult
from edgeport.errors import PartitionError

LINEAR = torch.ops.aten.linear.default
LINEAR_ID = "LinearWholeDemo"
NodeFilter = Callable[[torch.fx.Node], bool]


def _out_features(node: torch.fx.Node) -> int:
    return node.meta["val"].shape[-1]


def _linear_preprocess(edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
    """Takes only whole linears: one text record per op, like the tutorial's demo backend."""
    records = []
    for node in edge_program.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is not LINEAR:
            raise RuntimeError(f"{node.target} is not supported in backend {LINEAR_ID}")
        records.append(f"op:linear, out:{_out_features(node)}#")
    return PreprocessResult(processed_bytes="".join(records).encode())


class _LinearPlugin:
    @edgeport.hookimpl
    def edgeport_register_backends(self, registry: Any) -> None:
        registry.add(BackendSpec(backend_id=LINEAR_ID, version="0.0.1", preprocess=_linear_preprocess))


@pytest.fixture
def linear_backend() -> Iterator[str]:
    plugin = _LinearPlugin()
    edgeport.register_plugin(plugin, name="linear-whole-demo")
    try:
        yield LINEAR_ID
    finally:
        edgeport.unregister_plugin(plugin)


class BigLinearPartitioner(CapabilityBasedPartitioner):
    """Keeps whole, and delegates, the linears with ``out_features >= min_out`` (all of them when ``None``)."""

    def __init__(self, min_out: int | None) -> None:
        def big_enough(node: torch.fx.Node) -> str | None:
            return None if self.wants(node) else f"out_features < {min_out}"

        table = CapabilityTable(ops=(OpCapability("aten.linear.default", constraint=big_enough),))
        super().__init__(LINEAR_ID, table)
        self.min_out = min_out
        self.filtered: list[str] = []  # names of the nodes the filter was asked about

    def wants(self, node: torch.fx.Node) -> bool:
        return self.min_out is None or _out_features(node) >= self.min_out

    def ops_to_not_decompose(self, ep: ExportedProgram) -> tuple[list[torch._ops.OpOverload], NodeFilter | None]:
        if self.min_out is None:
            return [LINEAR], None

        def node_filter(node: torch.fx.Node) -> bool:
            self.filtered.append(node.name)
            return self.wants(node)

        return [LINEAR], node_filter


class ListingPartitioner(Partitioner):
    """Delegates nothing; lists ``ops`` with ``node_filter`` in ``ops_to_not_decompose``."""

    def __init__(self, ops: list[torch._ops.OpOverload], node_filter: NodeFilter | None) -> None:
        super().__init__()
        self.ops, self.node_filter = ops, node_filter

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        return PartitionResult(tagged_exported_program=exported_program, partition_tags={})

    def ops_to_not_decompose(self, ep: ExportedProgram) -> tuple[list[torch._ops.OpOverload], NodeFilter | None]:
        return self.ops, self.node_filter


class SmallThenBig(torch.nn.Module):
    """A 8 -> 4 linear (no bias: it decomposes to permute + mm), relu, then a 4 -> 64 linear."""

    def __init__(self) -> None:
        super().__init__()
        self.small = torch.nn.Linear(8, 4, bias=False)
        self.big = torch.nn.Linear(4, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.big(torch.relu(self.small(x)))


def _model() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return SmallThenBig().eval(), (torch.randn(2, 8),)


def _targets(ep: ExportedProgram) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function" and n.target is not CALL_DELEGATE
            and "getitem" not in str(n.target)]


def _delegated(ep: ExportedProgram) -> dict[str, list[str]]:
    """Backend id -> the ops inside each of its delegates, in graph order."""
    result: dict[str, list[str]] = {}
    for name, module in ep.graph_module.named_children():
        if name.startswith("lowered_module_"):
            inner = [str(n.target) for n in module.original_module.graph.nodes if n.op == "call_function"]
            result.setdefault(module.backend_id, []).extend(inner)
    return result


class Recorder:
    """A transform pass (run after decomposition, before partitioning) recording the graph's ops."""

    def __init__(self) -> None:
        self.targets: list[str] = []

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        self.targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _check_matches_eager(edge: Any, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    with torch.no_grad():
        torch.testing.assert_close(edge.exported_program().module()(*inputs), model(*inputs))
    assert edge.to_executorch().buffer[4:8] == b"ET12"


def test_filter_keeps_only_the_big_linear_whole(linear_backend):
    model, inputs = _model()
    partitioner = BigLinearPartitioner(min_out=32)
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[partitioner])
    program = edge.exported_program()
    # The small linear was decomposed as usual; the big one stayed whole and went to the backend.
    assert _targets(program) == ["aten.permute_copy.default", "aten.mm.default", "aten.relu.default"]
    assert _delegated(program) == {LINEAR_ID: ["aten.linear.default"]}
    assert [name for name in partitioner.rejections if name.startswith("linear")] == []  # no unwanted linear
    # The filter is asked only about nodes of the ops its partitioner lists.
    assert sorted(partitioner.filtered) == ["linear", "linear_1"]
    _check_matches_eager(edge, model, inputs)


def test_without_filter_every_linear_is_kept(linear_backend):
    model, inputs = _model()
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[BigLinearPartitioner(None)])
    program = edge.exported_program()
    assert _targets(program) == ["aten.relu.default"]
    assert _delegated(program) == {LINEAR_ID: ["aten.linear.default", "aten.linear.default"]}
    _check_matches_eager(edge, model, inputs)


def test_filter_rejecting_every_node_decomposes_them_all():
    model, inputs = _model()
    seen = Recorder()
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), transform_passes=[seen],
                                       partitioner=[ListingPartitioner([LINEAR], lambda node: False)])
    # Decomposed before the partitioners run, not kept and decomposed afterwards.
    assert "aten.linear.default" not in seen.targets and "aten.addmm.default" in seen.targets
    assert _targets(edge.exported_program()) == seen.targets
    _check_matches_eager(edge, model, inputs)


def test_decomposed_small_linear_goes_to_the_demo_backend(linear_backend, demo_backend, demo_partitioner):
    # Per-node keeping lets two backends share one op: the big linear whole to the linear backend, the small
    # one's mm (after decomposition) to the tutorial's demo backend, which takes mm and add.Tensor.
    model, inputs = _model()
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs),
                                       partitioner=[BigLinearPartitioner(min_out=32), demo_partitioner()])
    program = edge.exported_program()
    assert _targets(program) == ["aten.permute_copy.default", "aten.relu.default"]
    assert _delegated(program) == {LINEAR_ID: ["aten.linear.default"], demo_backend: ["aten.mm.default"]}
    _check_matches_eager(edge, model, inputs)


@pytest.mark.parametrize("big_first", [True, False])
def test_op_kept_by_one_partitioner_and_filtered_out_by_another(linear_backend, big_first):
    # The other partitioner lists linear too but its filter rejects every node: the big linear stays whole
    # because BigLinearPartitioner keeps it (in either priority order), the small one is rejected by both.
    model, inputs = _model()
    refusing = ListingPartitioner([LINEAR], lambda node: False)
    big = BigLinearPartitioner(min_out=32)
    partitioners = [big, refusing] if big_first else [refusing, big]
    seen = Recorder()
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), transform_passes=[seen],
                                       partitioner=partitioners)
    assert seen.targets == ["aten.permute_copy.default", "aten.mm.default", "aten.relu.default",
                            "aten.linear.default"]
    program = edge.exported_program()
    assert _targets(program) == ["aten.permute_copy.default", "aten.mm.default", "aten.relu.default"]
    assert _delegated(program) == {LINEAR_ID: ["aten.linear.default"]}
    _check_matches_eager(edge, model, inputs)


def test_node_kept_for_a_partitioner_that_does_not_take_it_is_decomposed_afterwards(linear_backend):
    # ListingPartitioner keeps the small linear whole but delegates nothing; BigLinearPartitioner declines it
    # (constraint), so after lowering it is decomposed like any other op and the program is valid edge IR.
    model, inputs = _model()
    keeps_small = ListingPartitioner([LINEAR], lambda node: _out_features(node) < 32)
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs),
                                       partitioner=[keeps_small, BigLinearPartitioner(min_out=32)])
    program = edge.exported_program()
    assert _targets(program) == ["aten.permute_copy.default", "aten.mm.default", "aten.relu.default"]
    assert _delegated(program) == {LINEAR_ID: ["aten.linear.default"]}
    _check_matches_eager(edge, model, inputs)


def test_filter_that_raises_names_the_partitioner_and_the_node():
    class Fussy(ListingPartitioner):
        pass

    def broken(node: torch.fx.Node) -> bool:
        raise KeyError("out_features")

    model, inputs = _model()
    with pytest.raises(PartitionError, match=r"filter of Fussy raised KeyError on node 'linear'") as info:
        to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[Fussy([LINEAR], broken)])
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (([torch.ops.aten.linear], None), r"not a torch OpOverload; name an overload, e\.g\. aten\.linear\.default"),
        (([LINEAR], "big"), r"filter that is not callable"),
        ([LINEAR], r"must return \(list of OpOverload, filter or None\)"),
    ],
)
def test_malformed_ops_to_not_decompose_answer_is_a_clear_error(answer, message):
    class Odd(ListingPartitioner):
        def ops_to_not_decompose(self, ep: ExportedProgram) -> Any:
            return answer

    model, inputs = _model()
    with pytest.raises(PartitionError, match=r"Odd\.ops_to_not_decompose .*" + message):
        to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[Odd([], None)])


def test_filter_applies_inside_control_flow_branches():
    # The filter is asked about the linears of both cond branches; only the big one stays whole through
    # decomposition (seen by a transform pass, which runs before partitioning). Nothing delegates it, so it is
    # decomposed afterwards. Edge IR has no cond, hence the relaxed check.
    class Branches(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.small = torch.nn.Linear(8, 4)
            self.big = torch.nn.Linear(8, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.sum() > 0, lambda x: self.small(x).sum(-1), lambda x: self.big(x).sum(-1), (x,))

    torch.manual_seed(0)
    model, x = Branches().eval(), torch.randn(2, 8)
    asked: list[int] = []

    def big_only(node: torch.fx.Node) -> bool:
        asked.append(_out_features(node))
        return _out_features(node) >= 32

    seen: list[list[str]] = []

    def record(gm: torch.fx.GraphModule) -> None:
        for module in gm.modules():
            if isinstance(module, torch.fx.GraphModule) and module is not gm:
                seen.append([str(n.target) for n in module.graph.nodes if n.op == "call_function"])

    edge = to_edge_transform_and_lower(torch.export.export(model, (x,)), transform_passes=[record],
                                       partitioner=[ListingPartitioner([LINEAR], big_only)],
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    assert sorted(asked) == [4, 64]
    small_branch, big_branch = sorted(seen, key=len, reverse=True)
    assert "aten.addmm.default" in small_branch and "aten.linear.default" not in small_branch
    assert big_branch == ["aten.linear.default", "aten.sum.dim_IntList"]
    for module in edge.exported_program().graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            assert all(n.target is not LINEAR for n in module.graph.nodes)
    with torch.no_grad():
        for sample in (x, -x):
            torch.testing.assert_close(edge.exported_program().module()(sample), model(sample))
