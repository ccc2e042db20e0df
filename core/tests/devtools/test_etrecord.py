"""Debug handles end to end and ETRecord in ExecuTorch's format.

Oracles: ExecuTorch 1.5.1 lowering the same model (its debug maps resolve each instruction to the same edge ops
as ours), its ``parse_etrecord`` and ``Inspector`` reading the ETRecord + ETDump edgeport writes.
"""

from __future__ import annotations

import json
import zipfile

import pytest

from edgeport.devtools.etrecord import ETRecordError, parse_etrecord
from edgeport.runtime import Runtime

torch = pytest.importorskip("torch")
xnnpack = pytest.importorskip("edgeport_xnnpack")


class _Model(torch.nn.Module):
    """Two XNNPACK partitions around ops XNNPACK (2022) does not take, so both kernel and delegate instructions."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, y):
        a = self.conv(x).relu()  # LINE_CONV
        b = torch.cumsum(y, dim=1)  # LINE_CUMSUM
        return a.sum(dim=(2, 3)), self.fc(b)


def _args():
    torch.manual_seed(0)
    return (torch.randn(1, 3, 8, 8), torch.randn(2, 8))


def _lowered(generate_etrecord=True):
    import edgeport

    ep = torch.export.export(_Model().eval(), _args())
    edge = edgeport.to_edge_transform_and_lower(ep, partitioner=[xnnpack.XnnpackPartitioner()],
                                               generate_etrecord=generate_etrecord)
    return edge, edge.to_executorch()


def _ops_per_instruction(edge_program, debug_handle_map) -> dict[int, list[str]]:
    """instruction -> the edge ops its handles name (the Inspector's view of a program)."""
    by_handle = {n.meta["debug_handle"]: n.target.__name__ for n in edge_program.graph.nodes
                 if n.op == "call_function" and "debug_handle" in n.meta}
    out = {}
    for instr, handles in debug_handle_map.items():
        handles = handles if isinstance(handles, list) else [handles]
        out[int(instr)] = sorted(by_handle[h].removeprefix("aten.") for h in handles)
    return out


def test_every_edge_node_has_a_unique_handle_and_every_instruction_maps_to_nodes():
    edge, et = _lowered()
    recorded = edge.get_etrecord().edge_dialect_program
    handles = [n.meta.get("debug_handle") for n in recorded.graph.nodes if n.op == "call_function"]
    assert all(isinstance(h, int) for h in handles) and len(set(handles)) == len(handles)
    program = et.executorch_program.execution_plan[0]
    dhm = et.debug_handle_map["forward"]
    assert set(dhm) == set(range(len(program.chains[0].instructions)))  # every instruction is mapped
    ops = _ops_per_instruction(recorded, dhm)
    delegate_calls = {i for i, ins in enumerate(program.chains[0].instructions)
                      if type(ins.instr_args).__name__ == "DelegateCall"}
    assert set(et.delegate_map["forward"]) == delegate_calls
    assert {et.delegate_map["forward"][i]["name"] for i in delegate_calls} == {"XnnpackBackend"}
    assert sorted(tuple(ops[i]) for i in delegate_calls) == [("convolution.default", "relu.default"),
                                                             ("linear.default",)]
    assert et.instruction_id_to_num_outs_map["forward"] == {i: 1 for i in delegate_calls}


@pytest.mark.executorch
def test_instructions_map_to_the_same_ops_as_executorchs():
    """ExecuTorch 1.5.1 lowers the same model: instruction by instruction, its maps name the same edge ops."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(_Model().eval(), _args())
    theirs = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()], generate_etrecord=True)
    their_et = theirs.to_executorch()
    their_ops = _ops_per_instruction(their_et.get_etrecord().edge_dialect_program, their_et.debug_handle_map["forward"])
    edge, et = _lowered()
    our_ops = _ops_per_instruction(edge.get_etrecord().edge_dialect_program, et.debug_handle_map["forward"])

    def split(ops, delegate_map):  # ExecuTorch groups partitions differently; the ops each side runs must agree
        delegated = sorted(o for i, v in ops.items() if i in delegate_map or str(i) in delegate_map for o in v)
        kernels = sorted(o for i, v in ops.items() if i not in delegate_map and str(i) not in delegate_map for o in v)
        return delegated, kernels

    assert split(our_ops, et.delegate_map["forward"]) == split(their_ops, their_et.delegate_map["forward"])
    assert split(our_ops, et.delegate_map["forward"]) == (
        ["convolution.default", "linear.default", "relu.default"], ["cumsum.default", "sum.dim_IntList"])
    assert {v["name"] for v in et.delegate_map["forward"].values()} == \
        {v["name"] for v in their_et.delegate_map["forward"].values()}

def test_recorded_programs_are_not_changed_by_to_executorch():
    import edgeport
    from edgeport.aot.graph_utils import graph_fingerprint

    ep = torch.export.export(_Model().eval(), _args())
    edge = edgeport.to_edge_transform_and_lower(ep, partitioner=[xnnpack.XnnpackPartitioner()],
                                               generate_etrecord=True)
    record = edge.get_etrecord()
    before = graph_fingerprint(record.edge_dialect_program.graph), graph_fingerprint(record.exported_program.graph)
    edge.to_executorch()
    edge.to_executorch()
    assert (graph_fingerprint(record.edge_dialect_program.graph),
            graph_fingerprint(record.exported_program.graph)) == before
    with pytest.raises(ETRecordError, match="to_executorch"):
        record.save("unused.etrecord")  # no debug maps yet: the error says where they come from


def test_get_etrecord_without_generate_says_how():
    edge, et = _lowered(generate_etrecord=False)
    with pytest.raises(RuntimeError, match="generate_etrecord=True"):
        et.get_etrecord()
    with pytest.raises(RuntimeError, match="generate_etrecord=True"):
        edge.get_etrecord()


def test_saved_etrecord_round_trips(tmp_path):
    edge, et = _lowered()
    path = tmp_path / "model.etrecord"
    et.get_etrecord().save(path)
    names = set(zipfile.ZipFile(path).namelist())
    assert {"ETRECORD_V0", "exported_program", "edge_dialect_exported_program/forward", "debug_handle_map",
            "delegate_map", "instruction_id_to_num_outs_map"} <= names
    back = parse_etrecord(path)
    original = edge.get_etrecord().edge_dialect_program
    assert [(n.name, n.meta.get("debug_handle")) for n in back.edge_dialect_program.graph.nodes] == \
        [(n.name, n.meta.get("debug_handle")) for n in original.graph.nodes]
    assert back._debug_handle_map == json.loads(json.dumps(et.debug_handle_map))
    x, y = _args()
    expected = edge.get_etrecord().exported_program.module()(x, y)
    for got, want in zip(back.exported_program.module()(x, y), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # same weights, same graph


@pytest.mark.executorch
def test_executorchs_inspector_reads_edgeports_etrecord_and_etdump(tmp_path):
    """The issue's acceptance: ExecuTorch 1.5.1's Inspector, given edgeport's ETRecord and ETDump of an
    XNNPACK-lowered model, names each event's edge ops and links them to this file's source lines."""
    from executorch.devtools import Inspector
    from executorch.devtools.etrecord import parse_etrecord as et_parse

    edge, et = _lowered()
    record_path, dump_path = tmp_path / "m.etrecord", tmp_path / "m.etdp"
    et.get_etrecord().save(record_path)
    parsed = et_parse(str(record_path))
    assert [n.meta.get("debug_handle") for n in parsed.edge_dialect_program.graph.nodes] == \
        [n.meta.get("debug_handle") for n in edge.get_etrecord().edge_dialect_program.graph.nodes]
    program = Runtime.get().load_program(et.buffer, enable_etdump=True)
    method = program.load_method("forward")
    args = [a.numpy() for a in _args()]
    for _ in range(2):
        method.execute(args)
    program.write_etdump_result_to_file(dump_path)
    inspector = Inspector(etdump_path=str(dump_path), etrecord=str(record_path))
    df = inspector.to_dataframe()
    rows = df[df.event_block_name == "Execute"]
    delegated = rows[rows.event_name == "DELEGATE_CALL"]
    assert sorted(tuple(sorted(v)) for v in delegated.op_types) == [("convolution.default", "relu.default"),
                                                                   ("linear.default",)]
    assert set(delegated.delegate_backend_name) == {"XnnpackBackend"}
    source = open(__file__).read().splitlines()
    conv_line = next(i + 1 for i, line in enumerate(source) if "# LINE_CONV" in line)
    cumsum_line = next(i + 1 for i, line in enumerate(source) if "# LINE_CUMSUM" in line)
    traces = " ".join(str(t) for t in rows.stack_traces)
    assert f"line {conv_line}" in traces and f"line {cumsum_line}" in traces
    assert all(len(r) == 2 for r in rows.raw)  # two runs, two timings per event


def test_bad_etrecord_files_are_named(tmp_path):
    edge, et = _lowered()
    good = tmp_path / "good.etrecord"
    et.get_etrecord().save(good)
    not_zip = tmp_path / "junk.etrecord"
    not_zip.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ETRecordError, match="junk.etrecord.*not a zip"):
        parse_etrecord(not_zip)
    truncated = tmp_path / "cut.etrecord"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ETRecordError, match="cut.etrecord"):
        parse_etrecord(truncated)
    foreign = tmp_path / "foreign.zip"
    with zipfile.ZipFile(foreign, "w") as z:
        z.writestr("hello.txt", "hi")
    with pytest.raises(ETRecordError, match="no ETRECORD_V0"):
        parse_etrecord(foreign)
    broken = tmp_path / "broken.etrecord"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(broken, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, b"{not json" if name in ("debug_handle_map", "exported_program") else data)
    with pytest.raises(ETRecordError, match="broken.etrecord"):
        parse_etrecord(broken)


def test_emit_stacktrace_writes_each_instructions_source_frames():
    """``ExecutorchBackendConfig(emit_stacktrace=True)`` (ExecuTorch's option): the program's ``Chain.stacktrace``
    holds one frame list per instruction -- the kernel's node, or every node of a delegate's partition."""
    import edgeport
    from edgeport.aot.config import ExecutorchBackendConfig
    from edgeport.program import load_pte

    ep = torch.export.export(_Model().eval(), _args())
    edge = edgeport.to_edge_transform_and_lower(ep, partitioner=[xnnpack.XnnpackPartitioner()])
    et = edge.to_executorch(ExecutorchBackendConfig(emit_stacktrace=True))
    chain = load_pte(et.buffer).program.execution_plan[0].chains[0]
    assert len(chain.stacktrace) == len(chain.instructions)
    source = open(__file__).read().splitlines()
    line = {tag: next(i + 1 for i, text in enumerate(source) if tag in text) for tag in ("# LINE_CONV", "# LINE_CUMSUM")}
    here = [[(f.lineno, f.context) for f in fl.items if f.filename == __file__] for fl in chain.stacktrace]
    cumsum = next(i for i, ins in enumerate(chain.instructions) if type(ins.instr_args).__name__ == "KernelCall"
                  and any(ln == line["# LINE_CUMSUM"] for ln, _ in here[i]))
    assert "torch.cumsum(y, dim=1)" in dict(here[cumsum])[line["# LINE_CUMSUM"]]
    first_delegate = next(i for i, ins in enumerate(chain.instructions) if type(ins.instr_args).__name__ == "DelegateCall")
    assert any(ln == line["# LINE_CONV"] for ln, _ in here[first_delegate])
    assert load_pte(edge.to_executorch().buffer).program.execution_plan[0].chains[0].stacktrace in (None, [])
