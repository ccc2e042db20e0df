"""Delegate sub-events, intermediate outputs (debug buffer) and edgeport's Inspector.

Oracles: eager PyTorch (each recorded intermediate output against the same node run eagerly), ExecuTorch 1.5.1's
Inspector reading the same ETRecord + ETDump + debug buffer, and ExecuTorch's runtime writing an ETDump that
edgeport's Inspector reads.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from edgeport.devtools.etdump import load_etdump
from edgeport.devtools.inspector import Inspector, InspectorError
from edgeport.runtime import Runtime

torch = pytest.importorskip("torch")
xnnpack = pytest.importorskip("edgeport_xnnpack")


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x).relu()


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _Block()
        self.head = torch.nn.Linear(8, 8)

    def forward(self, x, y):
        a = self.block(x)
        b = torch.cumsum(y, dim=1)  # not delegated: a kernel instruction between the two partitions
        return a.sum(dim=(2, 3)), self.head(b).permute(1, 0) * 2


def _args():
    torch.manual_seed(1)
    return (torch.randn(1, 3, 8, 8), torch.randn(2, 8))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    import edgeport

    tmp = tmp_path_factory.mktemp("inspector")
    ep = torch.export.export(_Model().eval(), _args())
    edge = edgeport.to_edge_transform_and_lower(ep, partitioner=[xnnpack.XnnpackPartitioner()],
                                               generate_etrecord=True)
    et = edge.to_executorch()
    paths = {"etrecord": tmp / "m.etrecord", "etdump": tmp / "m.etdp", "buffer": tmp / "m.bin"}
    et.get_etrecord().save(paths["etrecord"])
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size=1 << 20)
    method = program.load_method("forward")
    args = [a.numpy() for a in _args()]
    outputs = [method.execute(args) for _ in range(3)]
    program.write_etdump_result_to_file(paths["etdump"], paths["buffer"])
    return {"edge": edge, "et": et, "outputs": outputs, **paths}


def test_xnnpack_reports_its_steps_inside_each_delegate_call(recorded):
    dump = load_etdump(recorded["etdump"].read_bytes())
    run = [e.profile_event for e in dump.run_data[1].events if e.profile_event is not None]
    calls = {p.instruction_id: p for p in run if p.name == "DELEGATE_CALL"}
    subs = [p for p in run if p.delegate_debug_id_str]
    assert set(calls) == set(recorded["et"].delegate_map["forward"])
    assert {p.instruction_id for p in subs} == set(calls)  # every delegate call has steps
    for p in subs:
        call = calls[p.instruction_id]
        assert call.start_time <= p.start_time <= p.end_time <= call.end_time  # inside its call
        handles = {int(h) for h in bytes(p.delegate_debug_metadata).decode().split("=")[1].split(",")}
        assert handles <= set(recorded["et"].debug_handle_map["forward"][p.instruction_id])
        # a step of several blob nodes is "step K: <label>"; a step of one node carries that node's id in
        # ExecuTorch's XNNPACK profile, a key of the delegate map naming (at least) the same edge nodes
        keys = recorded["et"].delegate_map["forward"][p.instruction_id]["delegate_map"]
        assert p.delegate_debug_id_str.startswith("step ") or handles <= set(keys[p.delegate_debug_id_str])


def test_recording_without_outputs_writes_an_empty_debug_buffer_and_no_debug_events(tmp_path):
    import edgeport

    ep = torch.export.export(_Model().eval(), _args())
    et = edgeport.to_edge_transform_and_lower(ep, partitioner=[xnnpack.XnnpackPartitioner()]).to_executorch()
    program = Runtime.get().load_program(et.buffer, enable_etdump=True)
    program.load_method("forward").execute([a.numpy() for a in _args()])
    program.write_etdump_result_to_file(tmp_path / "d.etdp", tmp_path / "d.bin")
    dump = load_etdump((tmp_path / "d.etdp").read_bytes())
    assert not any(e.debug_event for r in dump.run_data for e in r.events)
    assert (tmp_path / "d.bin").read_bytes() == b""


def test_intermediate_outputs_equal_the_eager_graph(recorded):
    """Each recorded output (kernels and delegate calls) against the same edge node run eagerly in torch."""
    inspector = Inspector(recorded["etdump"], etrecord=recorded["etrecord"], debug_buffer_path=recorded["buffer"])
    rows = inspector.calculate_numeric_gap("MSE", inputs=_args())
    compared = {r["event_name"] for r in rows}
    assert compared == {"DELEGATE_CALL", "native_call_cumsum.out", "native_call_sum.IntList_out"}
    assert len([r for r in rows if r["event_name"] == "DELEGATE_CALL"]) == 2
    for r in rows:
        assert r["max_abs"] < 1e-5, r
    # the recorded method outputs are the run's outputs
    execute = next(b for b in inspector.event_blocks if b.name == "Execute")
    last = [e for e in execute.events if e.name == "DELEGATE_CALL"][-1]
    np.testing.assert_array_equal(last.debug_data[0], recorded["outputs"][0][1])
    assert len(last.debug_data) == execute.runs == 3


def test_inspector_names_ops_sources_modules_and_totals(recorded):
    inspector = Inspector(recorded["etdump"], etrecord=recorded["etrecord"], debug_buffer_path=recorded["buffer"])
    execute = next(b for b in inspector.event_blocks if b.name == "Execute")
    calls = [e for e in execute.events if e.name == "DELEGATE_CALL"]
    assert [sorted(e.op_types) for e in calls] == [["convolution.default", "relu.default"],
                                                   ["linear.default", "mul.Scalar", "permute_copy.default"]]
    assert all(e.delegate_backend_name == "XnnpackBackend" for e in calls)
    assert all(len(e.perf_data.raw) == 3 for e in execute.events)
    cumsum = next(e for e in execute.events if e.name == "native_call_cumsum.out")
    assert "torch.cumsum(y, dim=1)" in next(iter(cumsum.stack_traces.values()))
    assert any("block" in key for stack in calls[0].module_hierarchy.values() for key in stack)
    total_block = inspector.find_total_for_module("block")
    assert total_block == pytest.approx(calls[0].perf_data.avg)  # the block is exactly the first delegate call
    steps = [e for e in execute.events if e.is_delegated_op]
    assert steps and all(e.op_types for e in steps)  # resolved through the handles in the events' metadata
    text = io.StringIO()
    inspector.print_data_tabular(file=text)
    assert "DELEGATE_CALL" in text.getvalue() and "cumsum.default" in text.getvalue()
    rows = inspector.to_rows()
    assert {r["event_block_name"] for r in rows} == {"Default", "Execute"}


@pytest.mark.executorch
def test_executorchs_inspector_reads_the_debug_buffer(recorded):
    from executorch.devtools import Inspector as EtInspector

    theirs = EtInspector(etdump_path=str(recorded["etdump"]), etrecord=str(recorded["etrecord"]),
                         debug_buffer_path=str(recorded["buffer"]))
    ours = Inspector(recorded["etdump"], etrecord=recorded["etrecord"], debug_buffer_path=recorded["buffer"])
    their_calls = [e for b in theirs.event_blocks for e in b.events if e.name == "native_call_cumsum.out"]
    our_calls = [e for b in ours.event_blocks for e in b.events if e.name == "native_call_cumsum.out"]
    assert their_calls and our_calls
    np.testing.assert_array_equal(np.asarray(their_calls[0].debug_data[0]), our_calls[0].debug_data[0])


@pytest.mark.executorch
def test_edgeports_inspector_reads_an_etdump_executorchs_runtime_wrote(tmp_path, recorded):
    """ExecuTorch's runtime (in a child process) profiles the program edgeport wrote; edgeport's Inspector reads
    its ETDump and, with edgeport's ETRecord, names the same delegate calls' ops."""
    pte = tmp_path / "m.pte"
    pte.write_bytes(recorded["et"].buffer)
    dump = tmp_path / "et.etdp"
    script = textwrap.dedent(f"""
        import torch
        from executorch.runtime import Runtime
        program = Runtime.get().load_program({str(pte)!r}, enable_etdump=True, debug_buffer_size=1 << 20)
        method = program.load_method("forward")
        torch.manual_seed(1)
        args = (torch.randn(1, 3, 8, 8), torch.randn(2, 8))
        for _ in range(2):
            method.execute(args)
        program.write_etdump_result_to_file({str(dump)!r}, {str(tmp_path / 'et.bin')!r})
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    inspector = Inspector(dump, etrecord=recorded["etrecord"])
    calls = [e for b in inspector.event_blocks for e in b.events if e.name == "DELEGATE_CALL"]
    assert [sorted(e.op_types) for e in calls] == [["convolution.default", "relu.default"],
                                                   ["linear.default", "mul.Scalar", "permute_copy.default"]]
    assert all(len(e.perf_data.raw) == 2 for e in calls)


def test_bad_inspector_inputs_are_named(tmp_path, recorded):
    with pytest.raises(InspectorError, match="missing.etdp"):
        Inspector(tmp_path / "missing.etdp")
    junk = tmp_path / "junk.etdp"
    junk.write_bytes(b"\x10\x00\x00\x00" + b"\x00" * 20)
    with pytest.raises(InspectorError, match="junk.etdp"):
        Inspector(junk)
    short = tmp_path / "short.bin"
    short.write_bytes(recorded["buffer"].read_bytes()[:16])
    with pytest.raises(InspectorError, match="outside the debug buffer"):
        Inspector(recorded["etdump"], debug_buffer_path=short)
    profile_only = Inspector(recorded["etdump"], etrecord=recorded["etrecord"])  # outputs not loaded, times are
    assert profile_only.has_intermediate_outputs and not any(
        e.debug_data for b in profile_only.event_blocks for e in b.events)
    with pytest.raises(InspectorError, match="debug_buffer_path"):
        profile_only.calculate_numeric_gap(inputs=_args())
    with pytest.raises(InspectorError, match="needs the ETRecord"):
        Inspector(recorded["etdump"], debug_buffer_path=recorded["buffer"]).calculate_numeric_gap()
    with pytest.raises(ValueError, match="time scale"):
        Inspector(recorded["etdump"], source_time_scale="fortnights")


def test_a_too_small_debug_buffer_warns_with_the_size_needed(tmp_path):
    import edgeport

    ep = torch.export.export(_Model().eval(), _args())
    et = edgeport.to_edge_transform_and_lower(ep, partitioner=[xnnpack.XnnpackPartitioner()]).to_executorch()
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size=64)
    program.load_method("forward").execute([a.numpy() for a in _args()])
    with pytest.warns(RuntimeWarning, match="debug_buffer_size >="):
        program.write_etdump_result_to_file(tmp_path / "d.etdp", tmp_path / "d.bin")


def test_a_backend_without_sub_events_is_timed_as_a_whole_call(tmp_path):
    """The example backend's executor has no ``set_event_tracer``: its delegate calls are still profiled."""
    example = pytest.importorskip("edgeport_example")
    import edgeport

    ep = torch.export.export(_Block().eval(), (torch.randn(1, 3, 8, 8),))
    edge = edgeport.to_edge_transform_and_lower(ep, partitioner=[example.ExamplePartitioner()], generate_etrecord=True)
    et = edge.to_executorch()
    assert et.delegate_map["forward"], "the example backend should take part of this model"
    et.get_etrecord().save(tmp_path / "e.etrecord")
    program = Runtime.get().load_program(et.buffer, enable_etdump=True)
    program.load_method("forward").execute([np.random.rand(1, 3, 8, 8).astype(np.float32)])
    program.write_etdump_result_to_file(tmp_path / "e.etdp")
    inspector = Inspector(tmp_path / "e.etdp", etrecord=tmp_path / "e.etrecord")
    events = [e for b in inspector.event_blocks if b.name == "Execute" for e in b.events]
    calls = [e for e in events if e.name == "DELEGATE_CALL"]
    assert len(calls) == len(et.delegate_map["forward"]) and all(e.perf_data.raw[0] > 0 for e in calls)
    assert not any(e.is_delegated_op for e in events)
    assert all(e.delegate_backend_name == "ExampleBackend" and e.op_types for e in calls)
