"""Our schema text and dataclasses against ExecuTorch 1.5.1's; dtype helpers; writer/reader speed."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from edgeport.program import load_pte, serialize_pte
from edgeport.program import schema as S
from edgeport.program.layout import layout, parse_fbs


def _executorch_dir() -> Path:
    et = pytest.importorskip("executorch")
    return Path(list(et.__path__)[0])


@pytest.mark.executorch
def test_fbs_is_wire_identical_to_executorch(tmp_path):
    """flatc's binary schema (tables, field ids, types, enums, unions, attributes) is byte-identical."""
    root = _executorch_dir()
    flatc = root / "data" / "bin" / "flatc"
    if not flatc.exists():
        flatc = Path(shutil.which("flatc") or "/nonexistent")
    if not flatc.exists():
        pytest.skip("no flatc")
    ours = resources.files("edgeport.program")
    outputs = []
    for name, src in (("et", root / "schema"), ("ours", Path(str(ours)))):
        out = tmp_path / name
        out.mkdir()
        subprocess.run([str(flatc), "-b", "--schema", "-o", str(out), str(src / "program.fbs")], check=True)
        outputs.append((out / "program.bfbs").read_bytes())
    assert outputs[0] == outputs[1]


@pytest.mark.executorch
def test_dataclasses_and_enums_match_executorch():
    root = _executorch_dir()
    from executorch.exir import schema as ets

    for name, cls in S.TABLES.items():
        theirs = getattr(ets, name, None)
        if theirs is None:  # CompileSpec lives elsewhere in ExecuTorch
            continue
        assert {f.name for f in dataclasses.fields(cls)} == {f.name for f in dataclasses.fields(theirs)}, name
    # ExecuTorch's Python ScalarType has extra members; its schema file is the reference
    (_, members), = parse_fbs((root / "schema" / "scalar_type.fbs").read_text())["enums"].values()
    assert {m.name: int(m) for m in S.ScalarType} == members
    for ours, theirs in [(S.TensorShapeDynamism, ets.TensorShapeDynamism),
                         (S.TensorDataLocation, ets.TensorDataLocation), (S.DeviceType, ets.DeviceType),
                         (S.DataLocation, ets.DataLocation)]:
        assert {m.name: int(m) for m in ours} == {m.name: int(m.value) for m in theirs}


def test_layout_matches_dataclasses():
    lay = layout()
    assert set(lay.tables) == set(S.TABLES)
    for name, table in lay.tables.items():
        assert [f.name for f in table.fields] == [f.name for f in dataclasses.fields(S.TABLES[name])]
    assert lay.tables["EValue"].fields[0].slot == 1  # the union type byte takes slot 0
    assert [f.force_align for f in lay.tables["Buffer"].fields] == [16]
    assert [f.force_align for f in lay.tables["BackendDelegateInlineData"].fields] == [16]
    assert lay.unions["KernelTypes"][:5] == ("Null", "Int", "Bool", "Double", "Tensor")


def test_union_aliases():
    assert S.KernelTypes.__args__ == (S.Null, S.Int, S.Bool, S.Double, S.Tensor, S.String, S.IntList,
                                      S.DoubleList, S.BoolList, S.TensorList, S.OptionalTensorList)
    assert S.InstructionArguments.__args__ == (S.KernelCall, S.DelegateCall, S.MoveCall, S.JumpFalseCall,
                                               S.FreeCall)


def test_dtype_helpers():
    for dt, st in [(np.float32, S.ScalarType.FLOAT), (np.int64, S.ScalarType.LONG), (np.bool_, S.ScalarType.BOOL),
                   (np.uint8, S.ScalarType.BYTE), (np.float16, S.ScalarType.HALF), (np.uint32, S.ScalarType.UINT32)]:
        assert S.scalar_type_from_numpy(dt) == st
        assert S.numpy_dtype(st) == np.dtype(dt)
        assert S.element_size(st) == np.dtype(dt).itemsize
    assert S.scalar_type_from_name("torch.bfloat16") == S.ScalarType.BFLOAT16
    assert S.scalar_type_name(S.ScalarType.FLOAT8E4M3FN) == "float8_e4m3fn"
    assert S.numpy_dtype(S.ScalarType.BFLOAT16, storage=True) == np.uint16
    assert S.element_size(S.ScalarType.BFLOAT16) == 2
    with pytest.raises(ValueError, match="bfloat16"):
        S.numpy_dtype(S.ScalarType.BFLOAT16)
    with pytest.raises(ValueError):
        S.element_size(99)
    with pytest.raises(ValueError):
        S.scalar_type_from_numpy(np.complex64)


@pytest.mark.executorch
def test_dtype_names_match_torch():
    torch = pytest.importorskip("torch")
    for st in S.ScalarType:
        name = S.scalar_type_name(st)
        dtype = getattr(torch, name)
        assert dtype.itemsize == S.element_size(st), name


def test_program_package_does_not_import_torch():
    code = ("import sys, edgeport.program as p; p.load_pte(p.serialize_pte(p.Program())); "
            "assert 'torch' not in sys.modules and 'executorch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def _big_program(num_values: int = 5000, num_instructions: int = 2000) -> S.Program:
    values = []
    for i in range(num_values):
        if i % 4 == 0:
            values.append(S.EValue(S.Int(i)))
        else:
            values.append(S.EValue(S.Tensor(S.ScalarType.FLOAT, sizes=[1, 16, 8, 8], dim_order=[0, 1, 2, 3],
                                            allocation_info=S.AllocationDetails.at(1, 4096 * i))))
    instrs = [S.Instruction(S.KernelCall(i % 3, [(i + k) % num_values for k in range(4)] + [(i + 3) % num_values]))
              for i in range(num_instructions)]
    plan = S.ExecutionPlan("forward", S.ContainerMetadata("[1]", "[1]"), values, [1, 2], [3],
                           [S.Chain(instructions=instrs)],
                           [S.Operator("aten::add", "out"), S.Operator("aten::mul", "out"),
                            S.Operator("aten::convolution", "out")], [], [0, 4096 * num_values])
    consts = [S.Buffer(b"")] + [S.Buffer(bytes(1000)) for _ in range(50)]
    return S.Program(execution_plan=[plan], constant_buffer=consts)


def test_big_program_speed():
    p = _big_program()
    serialize_pte(p)  # warm up the per-table packers
    t0 = time.perf_counter()
    data = serialize_pte(p)
    t1 = time.perf_counter()
    lp = load_pte(data)
    t2 = time.perf_counter()
    assert lp.program.execution_plan == p.execution_plan
    print(f"\n5000 values/2000 instructions: serialize {1e3 * (t1 - t0):.0f} ms, load {1e3 * (t2 - t1):.0f} ms, "
          f"{len(data)} bytes")
    assert t1 - t0 < 1.0 and t2 - t1 < 1.0
