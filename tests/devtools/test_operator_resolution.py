"""Profiles that explain the time: the share of ETDump events an Inspector names the operator of (issue 26, item 4).

The same model goes through edgeport's XNNPACK flow and ExecuTorch 1.5.1's own (each recording its ETRecord);
the stock ExecuTorch runtime (child process) profiles both programs. Oracle: ExecuTorch's ``Inspector``. With
edgeport's program and ETRecord it must name the operator of at least the share of events it names on
ExecuTorch's own program and ETRecord; so must edgeport's ``Inspector``. On edgeport's runtime, edgeport's
Inspector names every delegate step. Windowed attention (HF Swin from a small config) in the default run; a CNN
(HF ResNet) and BERT in the slow run (ExecuTorch's lowering takes tens of seconds per model). Counts, no timing.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("edgeport_xnnpack")
pytestmark = pytest.mark.executorch

from edgeport.testing.conformance.stock_checks import stock_runtime_missing  # noqa: E402

if stock_runtime_missing():
    pytest.skip(stock_runtime_missing(), allow_module_level=True)


def _swin() -> tuple[torch.nn.Module, tuple]:
    from edgeport.testing.architectures import swin

    return swin()


def _model(name: str) -> tuple[torch.nn.Module, tuple]:
    if name == "swin":
        return _swin()
    from edgeport.testing.architectures import ARCHITECTURES

    arch = ARCHITECTURES[name](seed=0, size="small")
    return arch.model, tuple(arch.example_inputs)


def _lower(name: str, tmp) -> dict[str, dict]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtXnnpack
    from executorch.exir import to_edge_transform_and_lower as et_lower

    import edgeport
    from edgeport_xnnpack import XnnpackPartitioner

    model, args = _model(name)
    flows = {}
    for flow in ("edgeport", "executorch"):
        ep = torch.export.export(model, args)  # a fresh export per flow
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if flow == "edgeport":
                et = edgeport.to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                                          generate_etrecord=True).to_executorch()
            else:
                et = et_lower(ep, partitioner=[EtXnnpack()], generate_etrecord=True).to_executorch()
        record = tmp / f"{flow}.etrecord"
        et.get_etrecord().save(str(record))
        flows[flow] = {"pte": bytes(et.buffer), "etrecord": record, "args": [a.numpy() for a in args]}
    return flows


def _profile_stock(flows: dict[str, dict], tmp) -> None:
    from edgeport.testing.stock_runtime import run_cases

    cases = [(flow, d["pte"], "forward", [d["args"], d["args"]], None, True, True) for flow, d in flows.items()]
    for result in run_cases(cases):
        assert result.etdump is not None, result.describe() + "\n" + result.log
        flows[result.name]["stock"] = tmp / f"{result.name}.stock.etdp"
        flows[result.name]["stock"].write_bytes(result.etdump)


def _events(etdump, etrecord, inspector: str) -> list:
    if inspector == "executorch":
        from executorch.devtools import Inspector as EtInspector

        logging.getLogger().setLevel(logging.ERROR)  # ExecuTorch's Inspector warns per unmapped delegate event
        found = EtInspector(etdump_path=str(etdump), etrecord=str(etrecord))
    else:
        from edgeport.devtools import Inspector

        found = Inspector(etdump, etrecord=etrecord)
    return [e for block in found.event_blocks for e in block.events]


#: events no ETRecord maps to a node: loading and the method as a whole
UNMAPPED = {"Program::load_method", "Method::init", "Method::execute"}


def _unnamed(events: list) -> set[str]:
    return {e.name for e in events if not e.op_types}


def _share(events: list) -> float:
    assert events
    return sum(1 for e in events if e.op_types) / len(events)


@pytest.fixture(scope="module", params=[
    "swin", pytest.param("resnet", marks=pytest.mark.slow), pytest.param("bert", marks=pytest.mark.slow)])
def profiled(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    flows = _lower(request.param, tmp)
    _profile_stock(flows, tmp)
    return request.param, flows, tmp


def test_executorchs_inspector_names_at_least_executorchs_share_on_edgeports_program(profiled):
    name, flows, _ = profiled
    theirs = _share(_events(flows["executorch"]["stock"], flows["executorch"]["etrecord"], "executorch"))
    ours = _events(flows["edgeport"]["stock"], flows["edgeport"]["etrecord"], "executorch")
    assert _share(ours) >= theirs, f"{name}: {_share(ours):.2f} < ExecuTorch's own flow {theirs:.2f}"
    # every event but loading and the whole method names its operator: each XNNPACK operator event too
    assert any(e.delegate_debug_identifier is not None for e in ours)
    assert _unnamed(ours) <= UNMAPPED, _unnamed(ours) - UNMAPPED


def test_edgeports_inspector_names_as_many_as_executorchs(profiled):
    name, flows, _ = profiled
    theirs = _share(_events(flows["executorch"]["stock"], flows["executorch"]["etrecord"], "executorch"))
    oracle = _events(flows["edgeport"]["stock"], flows["edgeport"]["etrecord"], "executorch")
    ours = _events(flows["edgeport"]["stock"], flows["edgeport"]["etrecord"], "edgeport")
    assert _share(ours) >= max(theirs, _share(oracle)), name
    # the same operators: ExecuTorch's Inspector and edgeport's name each delegate sub-event alike
    named = {(e._instruction_id, e.delegate_debug_identifier): sorted(t.removeprefix("aten.") for t in e.op_types)
             for e in oracle if e.delegate_debug_identifier is not None}
    mine = {(e.instruction_id, e.delegate_debug_identifier): sorted(e.op_types)
            for e in ours if e.delegate_debug_identifier is not None}
    assert mine == named


def test_edgeports_runtime_profile_names_every_step(profiled):
    from edgeport.runtime import Runtime

    name, flows, tmp = profiled
    d = flows["edgeport"]
    program = Runtime.get().load_program(d["pte"], enable_etdump=True)
    method = program.load_method("forward")
    method.execute(d["args"])
    program.write_etdump_result_to_file(tmp / "edgeport.etdp")
    events = _events(tmp / "edgeport.etdp", d["etrecord"], "edgeport")
    assert any(e.delegate_debug_identifier is not None for e in events), name
    assert _unnamed(events) <= UNMAPPED, _unnamed(events) - UNMAPPED


def test_an_etrecord_file_keeps_the_handle_of_a_multi_output_node(tmp_path):
    """``native_layer_norm`` is stored under its outputs' names (its getitems): the file keeps the node's own
    handle, so both Inspectors find a layer norm a delegate carried out (it was lost before)."""
    import edgeport
    from edgeport.devtools.etrecord import parse_etrecord
    from edgeport_xnnpack import XnnpackPartitioner

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)).eval()
    ep = torch.export.export(model, (torch.randn(2, 8),))
    et = edgeport.to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                              generate_etrecord=True).to_executorch()
    before = {n.name: n.meta.get("debug_handle") for n in et.get_etrecord().edge_programs()["forward"].graph.nodes
              if n.op == "call_function"}
    et.get_etrecord().save(tmp_path / "m.etrecord")
    after = {n.name: n.meta.get("debug_handle")
             for n in parse_etrecord(tmp_path / "m.etrecord").edge_programs()["forward"].graph.nodes
             if n.op == "call_function"}
    norms = [k for k in before if "layer_norm" in k and "getitem" not in k and "unused" not in k]
    assert norms and all(isinstance(before[k], int) and after[k] == before[k] for k in norms), (before, after)
