"""OwnershipQuantizer: each node annotated by its owner's quantizer only; capability-aware; a report."""

from __future__ import annotations

import pytest
import torch

from edgeport.aot.composable_quantizer import OwnershipQuantizer, QuantizerEntry, describe_annotation
from edgeport.backend import CapabilityTable, OpCapability
from edgeport.registry import get_backend

pytest.importorskip("edgeport_xnnpack")
pytest.importorskip("edgeport_arm")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.floor(y) + torch.relu(y)


def _graph() -> torch.fx.GraphModule:
    torch.manual_seed(0)
    return torch.export.export(Net().eval(), (torch.randn(1, 3, 8, 8),)).module()


def _entry(backend: str, table: CapabilityTable | None = None) -> QuantizerEntry:
    spec = get_backend(backend)
    return QuantizerEntry(backend, spec.quantizers["int8"](), table if table is not None else spec.capabilities())


def _annotations(gm: torch.fx.GraphModule) -> dict[str, str]:
    return {n.name: describe_annotation(n.meta["quantization_annotation"])
            for n in gm.graph.nodes if "quantization_annotation" in n.meta}


def test_one_backend_is_its_quantizer_alone() -> None:
    gm = _graph()
    alone = get_backend("XnnpackBackend").quantizers["int8"]()
    alone.annotate(gm)
    expected = _annotations(gm)
    gm = _graph()
    q = OwnershipQuantizer([_entry("XnnpackBackend")])
    q.annotate(gm)
    assert _annotations(gm) == expected and expected
    assert {n for n, r in q.report.items() if r.owner == "XnnpackBackend"} == set(expected)


def test_priority_and_capabilities_decide_the_owner() -> None:
    gm = _graph()
    q = OwnershipQuantizer([_entry("EthosUBackend"), _entry("XnnpackBackend")])
    q.annotate(gm)
    assert q.report["conv2d"].owner == "EthosUBackend"
    assert q.report["conv2d"].not_used["XnnpackBackend"] == "owned by higher-priority EthosUBackend"
    assert q.report["floor"].owner is None and q.report["floor"].how == "float"
    # Ethos-U's table without add.Tensor: add goes to XNNPACK, annotated the XNNPACK way
    arm = get_backend("EthosUBackend").capabilities()
    no_add = CapabilityTable(tuple(c for c in arm.ops if c.op != "aten.add.Tensor"))
    gm = _graph()
    q = OwnershipQuantizer([_entry("EthosUBackend", no_add), _entry("XnnpackBackend")])
    q.annotate(gm)
    assert q.report["add"].owner == "XnnpackBackend"
    assert "cannot run aten.add.Tensor" in q.report["add"].not_used["EthosUBackend"]
    # swapping the priorities swaps the owners; the result depends on priority, not on annotation order
    gm = _graph()
    q = OwnershipQuantizer([_entry("XnnpackBackend"), _entry("EthosUBackend")])
    q.annotate(gm)
    assert q.report["conv2d"].owner == "XnnpackBackend"


def test_a_backend_whose_table_lacks_the_op_does_not_annotate_it() -> None:
    gm = _graph()
    empty = CapabilityTable((OpCapability("aten.mm.default"),))
    q = OwnershipQuantizer([_entry("XnnpackBackend", empty)])
    q.annotate(gm)
    # relu and add are core ops not in the table: not annotated; conv2d decomposes further: trusted
    assert "quantization_annotation" not in next(n for n in gm.graph.nodes if n.name == "relu").meta
    assert q.report["relu"].owner is None and "cannot run aten.relu.default" in q.report["relu"].not_used[
        "XnnpackBackend"]
    assert q.report["conv2d"].owner == "XnnpackBackend"
