"""Programs written with every Python ``flatbuffers`` release from 24.x to the newest are read and run.

Python flatbuffers before 25.12 shares one vtable between tables whose fields sit at the same offsets even when
the tables differ in size, so a vtable's table-size entry can be smaller than a table that uses it (an ``Int``
whose 8-byte value sits at offset 4 under a vtable saying 8 bytes). flatbuffers' own verifier never checks a field
against that size, only against the buffer and its alignment, and neither may we.

Each release runs in a child interpreter with its directory (``scripts/install.sh`` fills
``.venv/flatbuffers-versions/<version>``) first on ``PYTHONPATH``; the child checks it got that release, writes an
MLP with edgeport (portable, and lowered with the XNNPACK partitioner) and with ExecuTorch's own serializer (which
uses the same Python package), and reads and runs each with edgeport's runtime. The parent compares every output
with eager PyTorch, runs the same files on the stock ExecuTorch runtime (which verifies them with flatbuffers' C++
verifier) in a child process, and checks the odd layout really is in the files of the releases that make it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeport.errors import ProgramError
from edgeport.program import load_pte, serialize_pte, verify_program
from edgeport.program import schema as S
from edgeport.program.layout import SCALARS, layout
from edgeport.runtime import Runtime

REPO = Path(__file__).resolve().parents[3]
VERSIONS_DIR = REPO / ".venv" / "flatbuffers-versions"
# Every release from the oldest 24.x to the newest (pip index versions flatbuffers), each installed side by side by
# scripts/install.sh; "venv" is the venv's own (25.2.10 while tosa-tools pins it). A child takes ~7 s (importing
# executorch's serializer alone takes 3): the default run (CI) covers the oldest, the newest and the venv's own.
OLDER = ["24.3.6", "24.3.7", "24.3.25", "24.12.23", "25.1.21", "25.1.24", "25.2.10", "25.9.23"]
NEWEST = "25.12.19"
RELEASES = [*OLDER, NEWEST]
DEFAULT_RUN = {"24.3.6", NEWEST, "venv"}
# Releases whose builder shares a vtable between tables of different sizes (fixed in 25.12.19).
SHARES_VTABLES_ACROSS_SIZES = set(OLDER)
CASES = ("edgeport-portable", "edgeport-xnnpack", "executorch-portable")
RTOL, ATOL = 1e-4, 1e-5

_CHILD = r"""
import json, os, sys, traceback
want, out = sys.argv[1], sys.argv[2]
import flatbuffers
report = {"version": flatbuffers.__version__, "where": os.path.dirname(os.path.abspath(flatbuffers.__file__)),
          "cases": {}, "running": "imports"}
def save():  # after every step: if the stock runtime kills this process, the parent knows which case did it
    with open(os.path.join(out, "report.json.tmp"), "w") as f:
        json.dump(report, f)
    os.replace(os.path.join(out, "report.json.tmp"), os.path.join(out, "report.json"))
save()
if report["version"] != want:
    sys.exit(0)
import numpy as np
import torch
import edgeport
import edgeport.program.flatbuffer_writer as ep_writer
import edgeport_xnnpack.schema.writer as xnn_writer
import executorch.exir._serialize._flatbuffer_program as et_writer
from edgeport.program import load_pte, verify_program
from edgeport.runtime import Runtime
from edgeport_xnnpack.partitioner import XnnpackPartitioner
from executorch.exir import to_edge as et_to_edge
from executorch.runtime import Runtime as StockRuntime, Verification

# every writer must use the flatbuffers package under test
report["writers"] = {m.__name__: m.flatbuffers is flatbuffers for m in (ep_writer, xnn_writer, et_writer)}

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
    def forward(self, x):
        return self.b(torch.relu(self.a(x))) * 0.5

torch.manual_seed(0)
model = MLP().eval()
x = torch.randn(3, 8)
with torch.no_grad():
    eager = model(x).numpy()
np.savez(os.path.join(out, "io.npz"), x=x.numpy(), eager=eager)
exported = torch.export.export(model, (x,))
writers = {
    "edgeport-portable": lambda: edgeport.to_edge(exported).to_executorch().buffer,
    "edgeport-xnnpack": lambda: edgeport.to_edge_transform_and_lower(
        exported, partitioner=[XnnpackPartitioner()]).to_executorch().buffer,
    "executorch-portable": lambda: et_to_edge(exported).to_executorch().buffer,
}
for name, write in writers.items():
    case = report["cases"][name] = {}
    try:
        report["running"] = f"{name}: writing, reading and running with edgeport"
        pte = bytes(write())
        case["pte"] = os.path.join(out, name + ".pte")
        with open(case["pte"], "wb") as f:
            f.write(pte)
        lp = load_pte(pte)
        verify_program(lp.program)
        case["delegates"] = sum(len(plan.delegates) for plan in lp.program.execution_plan)
        got = Runtime.get().load_program(pte).load_method("forward").execute([x.numpy()])
        np.save(os.path.join(out, name + ".out.npy"), np.asarray(got[0]))
        # the stock runtime, with flatbuffers' C++ verifier on
        report["running"] = f"{name}: loading and running on the stock ExecuTorch runtime"
        save()
        program = StockRuntime.get().load_program(case["pte"], verification=Verification.InternalConsistency)
        stock = program.load_method("forward").execute([x])
        np.save(os.path.join(out, name + ".stock.npy"), stock[0].detach().numpy())
    except Exception as exc:
        case["error"] = report["running"] + ": " + "".join(
            traceback.format_exception_only(type(exc), exc)).strip()
report["running"] = None
save()
"""


# ------------------------------------------------------------------------------------- layout statistics


def tables(buf: bytes) -> list[tuple[str, int, int, int, int]]:
    """Every table of a .pte's flatbuffer: (name, position, vtable position, vtable's table size, end of its
    furthest present field). A plain walk for the tests, trusting the buffer (only valid files are passed)."""
    lay = layout()
    u32 = lambda at: struct.unpack_from("<I", buf, at)[0]  # noqa: E731
    out, seen, stack = [], set(), [("Program", u32(0))]
    while stack:
        name, pos = stack.pop()
        if (name, pos) in seen:
            continue
        seen.add((name, pos))
        vt = pos - struct.unpack_from("<i", buf, pos)[0]
        vsize, tsize = struct.unpack_from("<HH", buf, vt)
        voffs = struct.unpack_from(f"<{(vsize - 4) // 2}H", buf, vt + 4) + (0,) * 64
        voff = voffs.__getitem__
        furthest = 4
        for f in lay.tables[name].fields:
            at = pos + voff(f.slot)
            if at == pos:
                continue
            if f.kind == "scalar":
                furthest = max(furthest, voff(f.slot) + SCALARS[f.scalar][1])
                continue
            furthest = max(furthest, voff(f.slot) + 4)
            target = at + u32(at)
            if f.kind == "union":
                furthest = max(furthest, voff(f.slot - 1) + 1)
                stack.append((lay.unions[f.ref][buf[pos + voff(f.slot - 1)] - 1], target))
            elif f.kind == "table":
                stack.append((f.ref, target))
            elif f.kind == "vector" and f.elem == "table":
                for i in range(u32(target)):
                    p = target + 4 + 4 * i
                    stack.append((f.ref, p + u32(p)))
        out.append((name, pos, vt, tsize, furthest))
    return out


def fields_beyond_table_size(buf: bytes) -> list[str]:
    """Tables with a field ending past the table size their vtable gives (the layout of flatbuffers < 25.12)."""
    return [f"{name}@{pos}: fields end at {end} > {tsize}" for name, pos, _, tsize, end in tables(buf) if end > tsize]


# ------------------------------------------------------------------------------------- every release


def _version_param(version: str):
    return version if version in DEFAULT_RUN else pytest.param(version, marks=pytest.mark.slow)


@pytest.mark.executorch
@pytest.mark.parametrize("version", [_version_param(v) for v in [*RELEASES, "venv"]])
def test_programs_written_with_each_flatbuffers_release_read_and_run(version, tmp_path):
    pytest.importorskip("executorch")
    env = dict(os.environ)
    if version == "venv":
        want, where = importlib.metadata.version("flatbuffers"), None
    else:
        want, where = version, VERSIONS_DIR / version
        if not (where / "flatbuffers" / "__init__.py").is_file():
            pytest.fail(f"flatbuffers {version} is not installed in {where}: run scripts/install.sh")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(where), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", _CHILD, want, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    report_path = tmp_path / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    assert proc.returncode == 0 and report.get("running", "") is None, (
        f"flatbuffers {want}: the child died (exit {proc.returncode}) while "
        f"{report.get('running', 'starting')}:\n{proc.stderr[-4000:]}")
    assert report["version"] == want, f"asked for flatbuffers {want}, the child imported {report['version']}"
    if where is not None:
        assert Path(report["where"]) == where / "flatbuffers", report["where"]
    else:
        assert VERSIONS_DIR not in Path(report["where"]).parents, report["where"]
        newest = max([*RELEASES, want], key=lambda v: tuple(int(p) for p in v.split(".")))
        assert newest == NEWEST, f"the venv's flatbuffers {want} is newer than the newest release this test pins"
    assert report["writers"] and all(report["writers"].values()), report["writers"]

    eager = np.load(tmp_path / "io.npz")["eager"]
    odd = {}
    for name in CASES:
        case = report["cases"][name]
        assert "error" not in case, f"flatbuffers {want}, {case['error']}"
        for runtime in ("out", "stock"):
            np.testing.assert_allclose(np.load(tmp_path / f"{name}.{runtime}.npy"), eager, rtol=RTOL, atol=ATOL,
                                       err_msg=f"flatbuffers {want}, {name}, {runtime} runtime vs eager")
        assert (case["delegates"] > 0) == (name == "edgeport-xnnpack"), (name, case["delegates"])
        odd[name] = fields_beyond_table_size(Path(case["pte"]).read_bytes())
    if want in SHARES_VTABLES_ACROSS_SIZES:
        # the files really have the layout the old reader refused (else this test would prove nothing)
        assert all(odd.values()), f"flatbuffers {want}: expected fields beyond the vtable's table size: {odd}"
    else:
        assert not any(odd.values()), f"flatbuffers {want}: {odd}"


# ------------------------------------------------------------------------------------- the rule, case by case


def _add_program() -> S.Program:
    """forward(x, y) = aten::add.out(x, y, alpha=1): one Int table (alpha), vectors, unions, strings."""
    def tensor(offset: int) -> S.EValue:
        return S.EValue(S.Tensor(S.ScalarType.FLOAT, sizes=[2, 3], dim_order=[0, 1],
                                 allocation_info=S.AllocationDetails(1, offset, 0)))
    values = [tensor(0), tensor(32), S.EValue(S.Int(1)), tensor(64)]
    plan = S.ExecutionPlan(
        "forward", S.ContainerMetadata("", ""), values, [0, 1], [3],
        [S.Chain([0, 1], [3], [S.Instruction(S.KernelCall(0, [0, 1, 2, 3, 3]))])],
        [S.Operator("aten::add", "out")], [], [0, 96])
    return S.Program(0, [plan], [S.Buffer(b"")])


def _slot(table: str, field: str) -> int:
    return next(f.slot for f in layout().tables[table].fields if f.name == field)


def _field_at(buf: bytes, pos: int, vt: int, table: str, field: str) -> int:
    """Byte position of ``field`` of the table at ``pos`` (which must be present)."""
    voff = struct.unpack_from("<H", buf, vt + 4 + 2 * _slot(table, field))[0]
    assert voff, (table, field)
    return pos + voff


@functools.cache
def _variants() -> dict[str, tuple[bytes, str | None]]:
    """name -> (file, None if it must be accepted, else a fragment of the reader's refusal)."""
    good = serialize_pte(_add_program())
    found = tables(good)
    (_, int_pos, int_vt, int_tsize, int_end), = [t for t in found if t[0] == "Int"]
    # soffset, then the 8-byte int_val at 4; the vtable says 12 (flatbuffers >= 25.12) or 8 (older releases, e.g.
    # 25.2.10, which tosa-tools pins): each variant below writes the size it tests
    assert int_pos % 8 == 4 and int_end == 12 and int_tsize in (8, 12)
    int_vts = {vt for name, _, vt, _, _ in found if name == "Int"}
    (_, ev_pos, ev_vt, _, _), = [t for t in found if t[0] == "EValue"
                                 and int_pos in _union_targets(good, t)]
    (_, plan_pos, plan_vt, _, _), = [t for t in found if t[0] == "ExecutionPlan"]

    def patched(*writes: tuple[str, int, int]) -> bytes:
        out = bytearray(good)
        for fmt, at, value in writes:
            struct.pack_into(fmt, out, at, value)
        return bytes(out)

    end = len(good)
    past_end = (end + 7) // 8 * 8  # 8-aligned, and its 8 bytes do not fit
    val_at = _field_at(good, ev_pos, ev_vt, "EValue", "val")
    inputs_at = _field_at(good, plan_pos, plan_vt, "ExecutionPlan", "inputs")
    return {
        # what flatbuffers 24.x .. 25.9 writes: the Int shares a vtable saying the table is 8 bytes
        "vtable table size 8 (flatbuffers 25.2.10)": (patched(*[("<H", vt + 2, 8) for vt in int_vts]), None),
        "vtable table size 0": (patched(*[("<H", vt + 2, 0) for vt in int_vts]), None),
        "int64 not 8-byte aligned": (patched(*[("<H", vt + 4, 8) for vt in int_vts]), "is not 8-byte aligned"),
        "int64 past the end": (patched(*[("<H", vt + 4, past_end - int_pos) for vt in int_vts]),
                               "runs past end of buffer"),
        "table not 4-byte aligned": (patched(("<I", val_at, struct.unpack_from("<I", good, val_at)[0] + 2)),
                                     "is not 4-byte aligned"),
        "vector not 4-byte aligned": (patched(("<I", inputs_at, struct.unpack_from("<I", good, inputs_at)[0] + 2)),
                                      "is not 4-byte aligned"),
    }


def _union_targets(buf: bytes, table: tuple[str, int, int, int, int]) -> set[int]:
    _, pos, vt, _, _ = table
    at = _field_at(buf, pos, vt, "EValue", "val")
    return {at + struct.unpack_from("<I", buf, at)[0]}


def _add_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((2, 3), dtype=np.float32), rng.standard_normal((2, 3), dtype=np.float32)


@pytest.mark.parametrize("name", list(_variants()))
def test_reader_follows_the_format_not_the_vtable_table_size(name):
    data, refusal = _variants()[name]
    x, y = _add_inputs()
    if refusal is None:
        lp = load_pte(data)
        verify_program(lp.program)
        assert lp.program.execution_plan[0].values[2].val == S.Int(1)
        out = Runtime.get().load_program(data).load_method("forward").execute([x, y])[0]
        np.testing.assert_allclose(out, x + y, rtol=1e-6)
    else:
        with pytest.raises(ProgramError, match=refusal) as info:
            load_pte(data)
        assert "execution_plan[0]" in str(info.value)  # says where


@pytest.mark.slow
@pytest.mark.executorch
def test_stock_runtime_agrees_on_each_case():
    """flatbuffers' C++ verifier (the stock runtime with Verification.InternalConsistency) accepts and refuses
    exactly what our reader does (child processes: a crash fails the case)."""
    pytest.importorskip("executorch")
    from edgeport.testing.stock_runtime import run_cases

    variants = _variants()
    x, y = _add_inputs()
    results = run_cases([(name, data, "forward", [x, y]) for name, (data, _) in variants.items()])
    for res in results:
        assert res.crash is None, res.describe()
        if variants[res.name][1] is None:
            assert res.ok, res.describe()
            np.testing.assert_allclose(res.outputs[0], x + y, rtol=1e-6, err_msg=res.name)
        else:
            # refused when loading the program (Error::InvalidProgram, 0x23), i.e. by the verifier
            assert not res.ok and "Failed to load program" in (res.error or "") and "0x:23" in res.error, \
                res.describe()
