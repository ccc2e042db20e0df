"""XnnpackPartitioner: driven by the one capability table; every rejected node says why."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import edgeport
from edgeport.aot.partitioner import DELEGATION_TAG
from edgeport_xnnpack import CAPABILITIES, XnnpackCompileOptions, XnnpackPartitioner


def edge_program(model: nn.Module, *args, dynamic_shapes=None):
    ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
    keep = XnnpackPartitioner().ops_to_not_decompose(ep)[0]
    from edgeport.aot.config import EdgeCompileConfig

    config = EdgeCompileConfig(preserve_ops=keep, _check_ir_validity=False)
    return edgeport.to_edge(ep, compile_config=config).exported_program()


def partition(model: nn.Module, *args, **kwargs):
    p = XnnpackPartitioner()
    result = p.partition(edge_program(model, *args, **kwargs))
    return p, result


class Lambda(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def test_table_rows_are_unique_core_aten_names():
    names = CAPABILITIES.op_names
    assert len(names) == len(set(names)) and all(n.startswith("aten.") for n in names)
    assert all(cap.dtypes for cap in CAPABILITIES.ops)


@pytest.mark.parametrize("model, args, node, reason", [
    (Lambda(lambda x: x + x), (torch.ones(3, dtype=torch.int32),), "add", "dtype int32"),
    (nn.Conv1d(2, 4, 3), (torch.randn(1, 2, 8),), "convolution", "only 2-D convolutions"),
    (nn.MaxPool2d(2, ceil_mode=True), (torch.randn(1, 2, 5, 5),), "max_pool2d_with_indices", "ceil_mode"),
    (nn.AvgPool2d(3, 1, 1), (torch.randn(1, 2, 5, 5),), "avg_pool2d", "count_include_pad"),
    (Lambda(lambda x: torch.softmax(x, 0)), (torch.randn(3, 4),), "_softmax", "last dimension"),
    (Lambda(lambda x: x.mean([1])), (torch.randn(1, 2, 5, 5),), "mean", "over H and W"),
    (Lambda(lambda x, w: nn.functional.conv2d(x, w)), (torch.randn(1, 2, 5, 5), torch.randn(4, 2, 3, 3)),
     "convolution", "not a constant"),
    (Lambda(lambda x: torch.tanh(x)), (torch.randn(3),), "tanh", "not in the XnnpackBackend capability table"),
    (Lambda(lambda x: x.reshape(1, 1, 1, 1, 1, 1, 1, -1) * 2), (torch.randn(4),), "mul", "rank 8"),
])
def test_rejections_record_why(model, args, node, reason):
    p, result = partition(model, *args)
    assert node in p.rejections, p.rejections
    assert reason in p.rejections[node]


def test_unbounded_dynamic_shapes_are_rejected():
    """Bounded dynamic dims are delegated (tests/test_dynamic_shapes.py); a dim without an upper bound is not."""
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    model = M()
    batch = torch.export.Dim("batch", min=2)
    p, result = partition(model, torch.randn(4, 3), dynamic_shapes={"x": {0: batch}})
    assert not result.partition_tags
    assert all("dynamic shape" in why and "no upper bound" in why for why in p.rejections.values())


def test_partitioner_only_tags():
    from edgeport.testing.models import mobilenet_v2_style

    model, args = mobilenet_v2_style()
    ep = edge_program(model, *args)
    before = [(n.name, n.target, n.args) for n in ep.graph.nodes]
    p = XnnpackPartitioner()
    result = p.partition(ep)
    assert [(n.name, n.target, n.args) for n in ep.graph.nodes] == before
    assert list(result.partition_tags) == ["tag0"], p.rejections  # the whole net in one partition
    assert result.partition_tags["tag0"].backend_id == "XnnpackBackend"
    tagged = {n.meta.get(DELEGATION_TAG) for n in ep.graph.nodes if n.op == "call_function"}
    assert tagged == {"tag0"}


def test_compile_options_and_keep_whole_ops():
    with pytest.raises(ValueError, match="unknown compile spec"):
        from edgeport.backend import CompileSpec

        XnnpackPartitioner([CompileSpec("threads", b"2")])
    p = XnnpackPartitioner(XnnpackCompileOptions(num_threads=2))
    assert [s.key for s in p.compile_specs] == ["num_threads"]
    assert XnnpackCompileOptions.from_compile_specs(p.compile_specs).num_threads == 2
    with pytest.raises(ValueError):
        XnnpackCompileOptions(num_threads=0)
    ops, _ = p.ops_to_not_decompose(None)
    assert torch.ops.aten.linear.default in ops


def test_backend_is_discovered():
    spec = edgeport.get_backend("XnnpackBackend")
    assert spec.distribution == "edgeport-xnnpack"
    assert spec.capabilities() is CAPABILITIES
    assert type(spec.partitioner()).__name__ == "XnnpackPartitioner"


def test_docs_op_table_is_generated_from_the_capability_table():
    """docs/backends/xnnpack.md lists exactly the capability table (`edgeport op-table XnnpackBackend --update`)."""
    from pathlib import Path

    from edgeport import scaffold
    from edgeport_xnnpack.capabilities import BACKEND_ID, CAPABILITIES

    doc = Path(__file__).resolve().parents[2] / "docs" / "backends" / "xnnpack.md"
    text = doc.read_text(encoding="utf-8")
    assert scaffold.update_generated_block(text, BACKEND_ID, CAPABILITIES) == text, (
        f"{doc} is stale: run edgeport op-table {BACKEND_ID} --update {doc}")
