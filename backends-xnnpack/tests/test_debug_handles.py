"""The XNNPACK delegate map covers every event ExecuTorch's runtime reports for edgeport's blobs (issue 26, item 4).

Oracle: the stock ExecuTorch runtime (1.5.1, child process) profiling edgeport's programs. Per delegate call, the
per-operator events it reports (``"<XNNPACK operator> #k"``) must be, in order, the events
:func:`~edgeport_xnnpack.schema.operator_names.stock_event_ids` predicts from the blob -- XNNPACK's fusions
included (a clamp into the convolution before it, a zero padding into the convolution after it, a 1x1
convolution run as a fully connected operator, a bounded add split into add + clamp, reshape chains, dynamic
quantization into its fully connected) -- and each must be a key of the delegate map naming the edge nodes of
that operator. Models: float CNNs that exercise the fusions, static int8 (per channel and per tensor), dynamic
int8 linears (transformers: ``tests/devtools/test_operator_resolution.py``). No timing.
"""

from __future__ import annotations

import collections

import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.devtools.etdump import load_etdump
from edgeport.program import load_pte
from edgeport.program import schema as S
from edgeport.testing.conformance.stock_checks import stock_runtime_missing
from edgeport.testing.stock_runtime import run_cases
from edgeport_xnnpack import XnnpackPartitioner
from edgeport_xnnpack.schema.operator_names import stock_event_ids
from edgeport_xnnpack.schema.reader import read_blob

pytestmark = pytest.mark.executorch
if stock_runtime_missing():
    pytest.skip(stock_runtime_missing(), allow_module_level=True)


class _Fusions(torch.nn.Module):
    """Conv + ReLU, max pool, depthwise conv + ReLU6, 1x1 conv, residual add + ReLU, explicit zero padding before
    a conv, average pool + clamp, unary ops, concatenation, hardswish, global average pool, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, groups=8, padding=1)
        self.pw = torch.nn.Conv2d(8, 8, 1)
        self.c2 = torch.nn.Conv2d(8, 8, 3)
        self.fc = torch.nn.Linear(24, 5)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(self.c1(x).relu(), 2)
        z = torch.nn.functional.relu6(self.dw(y))
        r = (self.pw(z) + y).relu()
        p = self.c2(torch.nn.functional.pad(r, (1, 1, 1, 1)))
        a = torch.nn.functional.avg_pool2d(p, 2).clamp(0, 1)
        h = torch.nn.functional.hardswish(torch.cat([r, -r, r.abs()], 1))
        return a.sigmoid(), self.fc(h.mean(dim=(2, 3))), torch.nn.functional.elu(p).exp()


class _Cnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, groups=8, padding=1),
            torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 1), torch.nn.MaxPool2d(2), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(16, 4))

    def forward(self, x):
        return self.body(x)


def _int8(model: torch.nn.Module, args: tuple, **options) -> torch.nn.Module:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeport_xnnpack.quantizer import XnnpackQuantizer

    prepared = prepare_pt2e(torch.export.export(model, args).module(), XnnpackQuantizer(**options))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _ in range(3):
            prepared(*(torch.randn(a.shape, generator=gen) for a in args))
    return convert_pt2e(prepared)


def _cases() -> dict[str, tuple[torch.nn.Module, tuple]]:
    torch.manual_seed(0)
    image = (torch.randn(1, 3, 16, 16),)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).eval()
    return {
        "fusions": (_Fusions().eval(), image),
        "int8 per channel": (_int8(_Cnn().eval(), image), image),
        "int8 per tensor": (_int8(_Cnn().eval(), image, per_channel=False), image),
        "dynamic int8 linears": (_int8(mlp, (torch.randn(4, 32),), dynamic=True), (torch.randn(4, 32),)),
    }


@pytest.fixture(scope="module")
def profiled() -> dict[str, tuple[object, dict]]:
    """name -> (the program manager, the stock runtime's per-operator event ids per delegate instruction)."""
    lowered, cases = {}, []
    for name, (model, args) in _cases().items():
        et = to_edge_transform_and_lower(torch.export.export(model, args),
                                         partitioner=[XnnpackPartitioner()]).to_executorch()
        lowered[name] = et
        cases.append((name, et.buffer, "forward", [[a.numpy() for a in args]], None, True, True))
    out = {}
    for result in run_cases(cases):
        assert result.etdump is not None, result.describe() + "\n" + result.log
        events = collections.defaultdict(list)
        for ev in load_etdump(result.etdump).run_data[-1].events:
            pe = ev.profile_event
            if pe is not None and pe.delegate_debug_id_str:
                events[pe.instruction_id].append(pe.delegate_debug_id_str)
        out[result.name] = (lowered[result.name], events)
    return out


def _delegate_calls(et) -> list[tuple[int, object]]:
    """(instruction index, the blob's graph) of each delegate call of ``forward``."""
    lp = load_pte(et.buffer)
    plan = lp.program.execution_plan[0]
    calls = []
    for i, ins in enumerate(plan.chains[0].instructions):
        if isinstance(ins.instr_args, S.DelegateCall):
            calls.append((i, read_blob(lp.delegate_data(0, ins.instr_args.delegate_index))[0]))
    return calls


@pytest.mark.parametrize("name", ["fusions", "int8 per channel", "int8 per tensor", "dynamic int8 linears"])
def test_every_stock_event_is_predicted_in_order_and_mapped(profiled, name):
    et, events = profiled[name]
    calls = _delegate_calls(et)
    assert calls, f"{name}: nothing delegated"
    for instruction, graph in calls:
        got = events[instruction]
        stock = stock_event_ids(graph)
        predicted = [alternatives for node in stock.events for alternatives in node]
        assert len(got) == len(predicted), f"{name} call {instruction}: {got} vs {predicted}"
        for position, (event, alternatives) in enumerate(zip(got, predicted, strict=True)):
            assert event in alternatives, f"{name} call {instruction} event {position}: {event!r} not {alternatives}"
        delegate_map = et.delegate_map["forward"][instruction]["delegate_map"]
        handles = collections.defaultdict(set)
        for i, node in enumerate(graph.nodes):
            handles[stock.fused_into.get(i, i)].add(node.debug_handle)
        for i, node in enumerate(stock.events):
            for alternatives in node:
                for key in alternatives:
                    assert set(delegate_map[key]) == handles[i], f"{name}: {key}"
        assert set(got) <= set(delegate_map)


def test_the_fusions_are_exercised(profiled):
    """The models do make XNNPACK fuse (otherwise the ordered comparison above proves less)."""
    et, _ = profiled["fusions"]
    (_, graph), = _delegate_calls(et)
    assert "XNNStaticConstantPad" in {graph.nodes[i].kind for i in stock_event_ids(graph).fused_into}
    assert any(len(node) == 2 for node in stock_event_ids(graph).events)  # add + relu: add and clamp operators
    for name, kind in (("int8 per channel", "XNNStaticReshape"), ("dynamic int8 linears", "XNNConvert")):
        graphs = [g for _, g in _delegate_calls(profiled[name][0])]
        assert any(g.nodes[i].kind == kind for g in graphs for i in stock_event_ids(g).fused_into), name
