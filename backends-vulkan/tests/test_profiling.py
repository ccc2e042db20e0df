"""ETDump sub-events from GPU timestamp queries: one per dispatch, inside its delegate call, linked to its edge op.

Oracles: eager PyTorch for the outputs of the timed runs, and ExecuTorch 1.5.1's Inspector for the op each
dispatch event resolves to through the delegate map.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgeport.devtools import Inspector
from edgeport.devtools.etdump import load_etdump
from edgeport.runtime import Runtime

torch = pytest.importorskip("torch")


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x, y):
        return self.conv(x).relu().mean(dim=(2, 3)), torch.sigmoid(self.fc(y))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, device):
    import edgeport
    from edgeport_vulkan import VulkanPartitioner

    if not device.info.timestamp_valid_bits:
        pytest.skip(f"{device.info.name} has no timestamp queries")
    tmp = tmp_path_factory.mktemp("vkprof")
    torch.manual_seed(0)
    model, args = _Net().eval(), (torch.randn(1, 3, 12, 12), torch.randn(4, 16))
    edge = edgeport.to_edge_transform_and_lower(torch.export.export(model, args), partitioner=[VulkanPartitioner()],
                                               generate_etrecord=True)
    et = edge.to_executorch()
    et.get_etrecord().save(tmp / "m.etrecord")
    program = Runtime.get().load_program(et.buffer, enable_etdump=True)
    method = program.load_method("forward")
    outs = [method.execute([a.numpy() for a in args]) for _ in range(2)]
    program.write_etdump_result_to_file(tmp / "m.etdp")
    expected = [t.detach().numpy() for t in model(*args)]
    return {"et": et, "outs": outs, "expected": expected, "etdump": tmp / "m.etdp", "etrecord": tmp / "m.etrecord"}


def test_timed_runs_compute_the_same_results(profiled):
    for run in profiled["outs"]:
        for got, want in zip(run, profiled["expected"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_each_dispatch_is_a_sub_event_inside_its_delegate_call(profiled):
    dump = load_etdump(profiled["etdump"].read_bytes())
    for run in dump.run_data[1:]:
        events = [e.profile_event for e in run.events if e.profile_event is not None]
        calls = {p.instruction_id: p for p in events if p.name == "DELEGATE_CALL"}
        subs = [p for p in events if p.delegate_debug_id_int not in (None, -1)]
        assert set(calls) == set(profiled["et"].delegate_map["forward"])
        per_call = {i: [p for p in subs if p.instruction_id == i] for i in calls}
        assert sorted(len(v) for v in per_call.values()) == [2, 3]  # linear+sigmoid, conv+relu+mean
        for i, sub in per_call.items():
            call = calls[i]
            assert all(call.start_time <= p.start_time <= p.end_time <= call.end_time for p in sub)
            busy = sum(p.end_time - p.start_time for p in sub)
            assert 0 < busy <= call.end_time - call.start_time


def test_dispatch_events_name_their_ops_in_both_inspectors(profiled):
    ours = Inspector(profiled["etdump"], etrecord=profiled["etrecord"])
    subs = [e for b in ours.event_blocks for e in b.events if e.is_delegated_op]
    assert sorted(op for e in subs for op in e.op_types) == sorted(
        ["convolution.default", "relu.default", "mean.dim", "linear.default", "sigmoid.default"])
    assert {e.delegate_backend_name for e in subs} == {"VulkanBackend"}


@pytest.mark.executorch
def test_executorchs_inspector_resolves_the_dispatch_events(profiled):
    from executorch.devtools import Inspector as EtInspector

    df = EtInspector(etdump_path=str(profiled["etdump"]), etrecord=str(profiled["etrecord"])).to_dataframe()
    delegated = df[df.is_delegated_op]
    assert sorted(op for ops in delegated.op_types for op in ops) == sorted(
        ["convolution.default", "relu.default", "mean.dim", "linear.default", "sigmoid.default"])
