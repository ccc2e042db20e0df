"""Hostile input: the reader raises ProgramError (never anything else), with a location, and never hangs."""

from __future__ import annotations

import mmap
import random
import struct
import time

import flatbuffers
import numpy as np
import pytest

from edgeport.errors import ProgramError
from edgeport.program import load_pte, program_to_flatbuffer, serialize_pte, verify_program
from edgeport.program import schema as S


def _exercise(data) -> str | None:
    """Load and fully use ``data``; return the ProgramError message, or None if everything was accepted."""
    try:
        lp = load_pte(data)
        for pi, plan in enumerate(lp.program.execution_plan):
            for di in range(len(plan.delegates)):
                lp.delegate_data(pi, di)
            for v in plan.values:
                if isinstance(v.val, S.Tensor) and v.val.data_buffer_idx:
                    lp.tensor_data(v.val)
        for i in range(lp.num_constants):
            lp.constant(i)
        for nd in lp.program.named_data or []:
            lp.named_data(nd.key)
        verify_program(lp.program)
    except ProgramError as exc:
        return str(exc)
    return None


def _valid_program(seed: int = 0) -> S.Program:
    """A small program that uses every union member, strings, constants, delegates and named data."""
    t = S.Tensor(S.ScalarType.FLOAT, sizes=[2, 3], dim_order=[0, 1], data_buffer_idx=1)
    p = S.Tensor(S.ScalarType.INT, sizes=[4], dim_order=[0], allocation_info=S.AllocationDetails(1, 0, 0))
    values = [S.EValue(v) for v in (
        S.Null(), S.Int(7), S.Bool(True), S.Double(2.5), t, S.String("MARKER_STRING"), S.IntList([1, 1]),
        S.DoubleList([1.0]), S.BoolList([True, False]), S.TensorList([4]), S.OptionalTensorList([-1, 4]), p)]
    instrs = [S.Instruction(a) for a in (
        S.KernelCall(0, [4, 4, 11]), S.DelegateCall(0, [11]), S.MoveCall(1, 1), S.JumpFalseCall(2, 4),
        S.FreeCall(11))]
    plan = S.ExecutionPlan(
        "forward", S.ContainerMetadata("in", "out"), values, [11], [11], [S.Chain([11], [11], instrs)],
        [S.Operator("aten::add", "out")],
        [S.BackendDelegate("backend", S.BackendDelegateDataReference(S.DataLocation.INLINE, 0),
                           [S.CompileSpec("k", b"v")])],
        [0, 64])
    return S.Program(0, [plan], [S.Buffer(b""), S.Buffer(np.arange(6, dtype=np.float32).tobytes())],
                     [S.BackendDelegateInlineData(b"DELEGATE" * 8)])


@pytest.fixture(scope="module")
def valid_files() -> list[bytes]:
    p = _valid_program()
    files = [serialize_pte(p, named_data={"nd": b"named"}), serialize_pte(p, segment_alignment=16),
             serialize_pte(p, extract_constant_segment=False, extract_delegate_segments=False)]
    for f in files:
        assert _exercise(f) is None
    return files


def test_truncations_raise_program_error(valid_files):
    for data in valid_files:
        for cut in range(len(data)):
            msg = _exercise(data[:cut])
            if cut < len(valid_files[0]) // 2:
                assert msg is not None, f"accepted a file cut at {cut}"


def test_every_single_byte_mutation(valid_files):
    messages = []
    for data in valid_files[1:]:
        for pos in range(len(data)):
            for value in (0x00, 0xFF, 0x80, (data[pos] + 1) & 0xFF):
                if value == data[pos]:
                    continue
                mutated = bytearray(data)
                mutated[pos] = value
                msg = _exercise(bytes(mutated))
                if msg:
                    messages.append(msg)
    text = "\n".join(messages)
    for expected in ("runs past end", "unknown KernelTypes type", "unknown InstructionArguments type",
                     "vtable", "not valid UTF-8", "file identifier", "out of range"):
        assert expected in text, expected
    assert "values[" in text and "instructions[" in text  # messages say where


def test_random_bit_flips_and_garbage(valid_files):
    rng = random.Random(1234)
    t0 = time.perf_counter()
    for _ in range(3000):
        data = bytearray(rng.choice(valid_files))
        for _ in range(rng.randint(1, 8)):
            pos = rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
        _exercise(bytes(data))
    for i in range(500):
        n = rng.randint(0, 600)
        garbage = rng.randbytes(n)
        if i % 2 and n >= 8:
            garbage = garbage[:4] + b"ET12" + (b"eh00" if i % 4 == 1 else b"") + garbage[8:]
        _exercise(garbage)
    assert time.perf_counter() - t0 < 8


def _with_header(fb: bytes, segment_data: bytes, *, program_size=None, base=None, data_size=None,
                 length=32) -> bytes:
    """Insert an extended header by hand (independent of pte.py) and append segment data at 128."""
    header = b"eh00" + struct.pack("<IQQQ", length, 0, 0, 0)
    size = len(fb) + 32
    base_ = (size + 127) // 128 * 128
    header = b"eh00" + struct.pack("<IQQQ", length, size if program_size is None else program_size,
                                   base_ if base is None else base,
                                   len(segment_data) if data_size is None else data_size)
    root = struct.unpack_from("<I", fb)[0] + 32
    out = struct.pack("<I", root) + fb[4:8] + header + fb[8:]
    return out + bytes(base_ - len(out)) + segment_data


def _seg_program(**changes) -> S.Program:
    t = S.Tensor(S.ScalarType.FLOAT, sizes=[4], dim_order=[0], data_buffer_idx=1)
    plan = S.ExecutionPlan("f", values=[S.EValue(t)], delegates=[
        S.BackendDelegate("b", S.BackendDelegateDataReference(S.DataLocation.SEGMENT, 1))])
    fields = dict(execution_plan=[plan], segments=[S.DataSegment(0, 16), S.DataSegment(128, 8)],
                  constant_segment=S.SubsegmentOffsets(0, [0, 0]))
    fields.update(changes)
    return S.Program(**fields)


def test_hand_made_header_and_segments_are_accepted():
    lp = load_pte(_with_header(program_to_flatbuffer(_seg_program()), bytes(range(16)) + bytes(112) + b"DELEGATE"))
    assert bytes(lp.delegate_data(0, 0)) == b"DELEGATE"
    assert bytes(lp.tensor_data(lp.program.execution_plan[0].values[0].val)) == bytes(range(16))


@pytest.mark.parametrize("changes,header,match", [
    ({}, dict(program_size=10**9), "program_size"),
    ({}, dict(base=10**9), "segment_base_offset"),
    ({}, dict(base=64), "segment_base_offset"),
    ({}, dict(data_size=10**6), "segment data"),
    ({}, dict(length=8), "length 8"),
    ({"segments": [S.DataSegment(0, 16), S.DataSegment(2**63, 8)]}, {}, r"segments\[1\]: .* runs past"),
    ({"segments": [S.DataSegment(0, 16), S.DataSegment(120, 100)]}, {}, r"segments\[1\]"),
    ({"segments": [S.DataSegment(0, 16)]}, {}, r"delegates\[0\]\.processed: segment index 1 out of range"),
    ({"constant_segment": S.SubsegmentOffsets(5, [0, 0])}, {}, "constant_segment: segment index 5"),
    ({"constant_segment": S.SubsegmentOffsets(0, [0, 99])}, {}, r"constant_segment.offsets\[1\]: 99 is past"),
    ({"constant_segment": S.SubsegmentOffsets(0, [0])}, {}, r"values\[0\]: data_buffer_idx 1 out of range"),
    ({"named_data": [S.NamedData("a", 7)]}, {}, r"named_data\[0\] \('a'\): segment index 7"),
    ({"mutable_data_segments": [S.SubsegmentOffsets(9, [])]}, {}, r"mutable_data_segments\[0\]: segment index 9"),
    ({"constant_buffer": [S.Buffer(b"")]}, {}, "both constant_buffer"),
])
def test_bad_header_and_indices(changes, header, match):
    data = _with_header(program_to_flatbuffer(_seg_program(**changes)), bytes(136), **header)
    with pytest.raises(ProgramError, match=match):
        load_pte(data)


def test_tensor_data_past_segment_end_is_caught():
    p = _seg_program()
    p.execution_plan[0].values[0].val.sizes = [1000]
    lp = load_pte(_with_header(program_to_flatbuffer(p), bytes(136)))
    with pytest.raises(ProgramError, match="run past the end"):
        lp.tensor_data(lp.program.execution_plan[0].values[0].val)


def test_segments_without_header_are_refused():
    with pytest.raises(ProgramError, match="no extended header"):
        load_pte(program_to_flatbuffer(_seg_program()))


def test_basic_rejections():
    with pytest.raises(ProgramError, match="too short"):
        load_pte(b"1234")
    with pytest.raises(ProgramError, match="file identifier"):
        load_pte(b"\x08\x00\x00\x00XX12" + bytes(32))
    with pytest.raises(ProgramError, match="root table offset"):
        load_pte(b"\xff\xff\x00\x00ET12" + bytes(32))
    with pytest.raises(ProgramError, match="cannot read"):
        load_pte(12345)


def test_string_defects_are_located():
    data = bytearray(program_to_flatbuffer(_valid_program()))
    pos = data.index(b"MARKER_STRING")
    bad_utf8 = bytearray(data)
    bad_utf8[pos] = 0xC3  # start of a two-byte sequence followed by ASCII
    with pytest.raises(ProgramError, match=r"values\[5\]\.val\.string_val: .*not valid UTF-8"):
        load_pte(bytes(bad_utf8))
    no_nul = bytearray(data)
    no_nul[pos + len(b"MARKER_STRING")] = ord("!")
    with pytest.raises(ProgramError, match=r"values\[5\]\.val\.string_val: .*NUL"):
        load_pte(bytes(no_nul))
    huge = bytearray(data)
    struct.pack_into("<I", huge, pos - 4, 0x7FFFFFFF)
    with pytest.raises(ProgramError, match=r"values\[5\]\.val\.string_val: vector of 2147483647"):
        load_pte(bytes(huge))


def test_shared_offsets_cannot_amplify():
    """100k value offsets all pointing at one EValue with a 10k-item IntList: refused quickly, not decoded."""
    b = flatbuffers.Builder(1 << 20)
    b.StartVector(8, 10_000, 8)
    for _ in range(10_000):
        b.PrependInt64(0)
    items = b.EndVector()
    b.StartObject(1)
    b.PrependUOffsetTRelativeSlot(0, items, 0)
    int_list = b.EndObject()
    b.StartObject(2)
    b.PrependUint8Slot(0, 7, 0)  # KernelTypes.IntList
    b.PrependUOffsetTRelativeSlot(1, int_list, 0)
    evalue = b.EndObject()
    b.StartVector(4, 100_000, 4)
    for _ in range(100_000):
        b.PrependUOffsetTRelative(evalue)
    values = b.EndVector()
    b.StartObject(10)
    b.PrependUOffsetTRelativeSlot(2, values, 0)
    plan = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(plan)
    plans = b.EndVector()
    b.StartObject(8)
    b.PrependUOffsetTRelativeSlot(1, plans, 0)
    b.Finish(b.EndObject(), file_identifier=b"ET12")
    t0 = time.perf_counter()
    with pytest.raises(ProgramError, match="refusing to amplify"):
        load_pte(bytes(b.Output()))
    assert time.perf_counter() - t0 < 2


def test_accepts_mmap_memoryview_bytearray(tmp_path, valid_files):
    path = tmp_path / "p.pte"
    path.write_bytes(valid_files[0])
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        with load_pte(mm) as lp:
            assert bytes(lp.delegate_data(0, 0)) == b"DELEGATE" * 8
    assert load_pte(memoryview(valid_files[0])).program == load_pte(bytearray(valid_files[0])).program


# ------------------------------------------------------------------------------------------ verify_program


def _plan_with(**changes) -> S.Program:
    p = _valid_program()
    for key, value in changes.items():
        setattr(p.execution_plan[0], key, value)
    return p


@pytest.mark.parametrize("mutate,match", [
    (lambda p: setattr(p.execution_plan[0], "inputs", [99]), r"execution_plan\[0\]\.inputs\[0\]: value index 99"),
    (lambda p: p.execution_plan[0].chains[0].instructions.__setitem__(0, S.Instruction(S.KernelCall(5, []))),
     r"instructions\[0\]: op_index 5 out of range"),
    (lambda p: p.execution_plan[0].chains[0].instructions.__setitem__(1, S.Instruction(S.DelegateCall(0, [12]))),
     r"instructions\[1\]\.args\[0\]: value index 12 out of range"),
    (lambda p: p.execution_plan[0].chains[0].instructions.__setitem__(3, S.Instruction(S.JumpFalseCall(2, 9))),
     r"instructions\[3\]: destination_instruction 9"),
    (lambda p: p.execution_plan[0].chains[0].instructions.__setitem__(3, S.Instruction(S.JumpFalseCall(1, 0))),
     r"cond_value_index: value 1 is Int, expected Bool/Tensor"),
    (lambda p: p.execution_plan[0].chains[0].instructions.__setitem__(4, S.Instruction(S.FreeCall(1))),
     r"instructions\[4\]\.value_index: value 1 is Int"),
    (lambda p: setattr(p.execution_plan[0].values[6].val, "items", [4]), r"values\[6\]\.items\[0\]: value 4 is Tensor"),
    (lambda p: setattr(p.execution_plan[0].values[9].val, "items", [1]), r"values\[9\]\.items\[0\]: value 1 is Int"),
    (lambda p: setattr(p.execution_plan[0].values[10].val, "items", [-2]), r"values\[10\]\.items\[0\]: value index -2"),
    (lambda p: setattr(p.execution_plan[0].values[4].val, "sizes", [2, -3]), r"values\[4\]: negative sizes"),
    (lambda p: setattr(p.execution_plan[0].values[4].val, "dim_order", [1, 1]), r"values\[4\]: dim_order \[1, 1\]"),
    (lambda p: setattr(p.execution_plan[0].values[4].val, "dim_order", [0]), r"not a permutation of range\(2\)"),
    (lambda p: setattr(p.execution_plan[0].values[4].val, "scalar_type", 99), r"values\[4\]: unknown scalar_type 99"),
    (lambda p: setattr(p.execution_plan[0].values[11].val, "allocation_info", S.AllocationDetails(2, 0, 0)),
     r"values\[11\]: allocation_info.memory_id 2 out of range"),
    (lambda p: setattr(p.execution_plan[0].values[11].val, "allocation_info", S.AllocationDetails(1, 60, 0)),
     r"values\[11\]: planned memory \[60, 76\) runs past arena 1 \(64 bytes\)"),
])
def test_verify_program_reports_location(mutate, match):
    p = _valid_program()
    verify_program(p)
    mutate(p)
    with pytest.raises(ProgramError, match=match):
        verify_program(p)


def test_unknown_enum_values_survive_loading_and_fail_verification():
    p = _valid_program()
    data = bytearray(program_to_flatbuffer(p))
    lp = load_pte(bytes(data))
    lp.program.execution_plan[0].values[4].val.scalar_type = 42
    fb = program_to_flatbuffer(lp.program)
    loaded = load_pte(fb).program
    assert loaded.execution_plan[0].values[4].val.scalar_type == 42
    with pytest.raises(ProgramError, match="unknown scalar_type 42"):
        verify_program(loaded)


def test_external_tensor_data_is_not_looked_up_in_the_file():
    p = _seg_program()
    t = p.execution_plan[0].values[0].val
    t.data_buffer_idx = 7  # ignored for external data
    t.extra_tensor_info = S.ExtraTensorInfo(fully_qualified_name="lin.weight", location=S.TensorDataLocation.EXTERNAL)
    lp = load_pte(_with_header(program_to_flatbuffer(p), bytes(136)))
    with pytest.raises(ProgramError, match="external.*lin.weight"):
        lp.tensor_data(lp.program.execution_plan[0].values[0].val)
