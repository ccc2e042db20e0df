"""ETDump: edgeport's runtime records per-instruction profiling events in ExecuTorch's ETDump format.

Oracles: ExecuTorch 1.5.1's own readers (``deserialize_from_etdump_flatcc``, which goes through flatc's verifier,
and the Inspector) read what edgeport writes; edgeport reads the ETDump ExecuTorch's runtime writes.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgeport.devtools.etdump import ETDump, load_etdump, serialize_etdump
from edgeport.errors import ProgramError
from edgeport.runtime import Runtime

torch = pytest.importorskip("torch")


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x, y):
        return torch.relu(self.fc(x + y)) * 2


def _program(partitioner=None) -> tuple[bytes, list]:
    from edgeport import to_edge, to_edge_transform_and_lower

    args = (torch.randn(2, 4), torch.randn(2, 4))
    ep = torch.export.export(_Model().eval(), args)
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner]) if partitioner else to_edge(ep)
    return edge.to_executorch().buffer, list(args)


def _recorded(pte: bytes, args: list, runs: int, tmp_path) -> tuple[ETDump, bytes, list]:
    program = Runtime.get().load_program(pte, enable_etdump=True)
    method = program.load_method("forward")
    outs = [method.execute(args) for _ in range(runs)]
    path = tmp_path / "run.etdp"
    program.write_etdump_result_to_file(path, tmp_path / "debug.bin")
    data = path.read_bytes()
    return load_etdump(data), data, outs


def test_events_per_instruction_and_run(tmp_path):
    pte, args = _program()
    dump, _, outs = _recorded(pte, args, 3, tmp_path)
    plain = Runtime.get().load_program(pte).load_method("forward").execute(args)
    np.testing.assert_array_equal(outs[0][0], plain[0])  # recording does not change results
    assert [r.name for r in dump.run_data] == ["Default", "Execute", "Execute", "Execute"]
    assert {e.profile_event.name for e in dump.run_data[0].events} == {"Method::init", "Program::load_method"}
    kernels = [e.profile_event for e in dump.run_data[1].events if e.profile_event.name != "OPERATOR_CALL"]
    assert all(p.name.startswith("native_call_") for p in kernels)
    assert [p.instruction_id for p in kernels] == sorted(p.instruction_id for p in kernels)
    assert any("relu" in p.name for p in kernels) and any("mul" in p.name for p in kernels)
    for block in dump.run_data[1:]:
        for e in block.events:
            p = e.profile_event
            assert p.end_time >= p.start_time > 0 and p.chain_index == 0


def test_delegate_calls_are_events(tmp_path):
    from edgeport_example.partitioner import ExamplePartitioner

    pte, args = _program(ExamplePartitioner())
    dump, _, _ = _recorded(pte, args, 1, tmp_path)
    names = [e.profile_event.name for e in dump.run_data[1].events]
    assert "DELEGATE_CALL" in names


def test_not_enabled_says_how():
    pte, _ = _program()
    program = Runtime.get().load_program(pte)
    with pytest.raises(RuntimeError, match="enable_etdump=True"):
        program.write_etdump_result_to_file("/nonexistent/x.etdp")


def test_bad_files_are_refused(tmp_path):
    pte, args = _program()
    _, data, _ = _recorded(pte, args, 1, tmp_path)
    for bad in (b"", data[:10], data[:-8], b"\xff\xff\xff\x7f" + data[4:], data[:8] + b"XXXX" + data[12:]):
        with pytest.raises(ProgramError):
            load_etdump(bad)


@pytest.mark.executorch
def test_executorch_reads_edgeport_etdump(tmp_path):
    serialize = pytest.importorskip("executorch.devtools.etdump.serialize")
    pte, args = _program()
    dump, data, _ = _recorded(pte, args, 2, tmp_path)
    theirs = serialize.deserialize_from_etdump_flatcc(data)
    assert [r.name for r in theirs.run_data] == [r.name for r in dump.run_data]
    for ours_block, their_block in zip(dump.run_data, theirs.run_data, strict=True):
        assert [(e.profile_event.name, e.profile_event.instruction_id, e.profile_event.start_time)
                for e in their_block.events] == [(e.profile_event.name, e.profile_event.instruction_id,
                                                  e.profile_event.start_time) for e in ours_block.events]
    from executorch.devtools import Inspector

    inspector = Inspector(etdump_path=str(tmp_path / "run.etdp"))
    frame = inspector.to_dataframe()
    # the Inspector merges runs of one method into one block, with each event's time per run
    assert [b.name for b in inspector.event_blocks] == ["Default", "Execute"]
    execute = inspector.event_blocks[1]
    assert execute.events and all(len(e.perf_data.raw) == 2 for e in execute.events if e.perf_data is not None)
    names = set(frame["event_name"])
    assert any("relu" in n for n in names) and "Method::init" in names


@pytest.mark.executorch
def test_edgeport_reads_executorch_etdump(tmp_path):
    rt = pytest.importorskip("executorch.runtime")
    from executorch.exir import to_edge

    args = (torch.randn(2, 4), torch.randn(2, 4))
    pte = to_edge(torch.export.export(_Model().eval(), args)).to_executorch().buffer
    (tmp_path / "m.pte").write_bytes(pte)
    program = rt.Runtime.get().load_program(str(tmp_path / "m.pte"), enable_etdump=True, debug_buffer_size=1 << 20)
    program.load_method("forward").execute(list(args))
    program.write_etdump_result_to_file(str(tmp_path / "et.etdp"), str(tmp_path / "et.bin"))
    dump = load_etdump((tmp_path / "et.etdp").read_bytes())
    assert [r.name for r in dump.run_data] == ["Default", "Execute"]
    names = [e.profile_event.name for e in dump.run_data[1].events if e.profile_event is not None]
    assert "OPERATOR_CALL" in names and any(n.startswith("native_call_") for n in names)
    assert load_etdump(serialize_etdump(dump)) == dump
