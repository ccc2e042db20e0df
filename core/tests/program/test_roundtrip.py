"""Program -> serialize_pte -> load_pte round trips, layout rules, and ExecuTorch's deserializer as oracle."""

from __future__ import annotations

import copy
import dataclasses
import math
import struct

import numpy as np
import pytest

from edgeport.errors import SerializationError
from edgeport.program import (
    DataLocation,
    load_pte,
    program_to_flatbuffer,
    serialize_pte,
    write_pte_file,
)
from edgeport.program import schema as S


def _offset_in(view: memoryview, whole: memoryview) -> int:
    addr = lambda v: np.frombuffer(v, np.uint8).__array_interface__["data"][0] if len(v) else None  # noqa: E731
    return addr(view) - addr(whole)


def _strip_refs(plan: S.ExecutionPlan) -> S.ExecutionPlan:
    return dataclasses.replace(plan, delegates=[dataclasses.replace(d, processed=None) for d in plan.delegates])


def _check_roundtrip(p: S.Program, data: bytes, *, seg_align: int, tensor_align: int, extract_constants: bool,
                     extract_delegates: bool) -> None:
    lp = load_pte(data)
    q = lp.program
    assert q.version == p.version
    assert [_strip_refs(x) for x in q.execution_plan] == [_strip_refs(x) for x in p.execution_plan]
    # every delegate sees its own blob, wherever it went
    for pi, plan in enumerate(p.execution_plan):
        for di, d in enumerate(plan.delegates):
            blob = p.backend_delegate_data[d.processed.index].data
            assert bytes(lp.delegate_data(pi, di)) == blob
            ref = q.execution_plan[pi].delegates[di].processed
            want = DataLocation.SEGMENT if extract_delegates and blob else DataLocation.INLINE
            assert ref.location == want
    # constants: same bytes, zero padding, aligned offsets
    assert lp.num_constants == max(len(p.constant_buffer), 1)
    for i, buf in enumerate(p.constant_buffer):
        got = lp.constant(i)
        assert bytes(got[:len(buf.storage)]) == buf.storage
        assert not any(got[len(buf.storage):])
    if extract_constants:
        assert q.constant_buffer == []
        assert all(off % tensor_align == 0 for off in q.constant_segment.offsets)
    else:
        assert q.constant_buffer == p.constant_buffer
        for view in lp.inline_constants:
            if len(view):
                assert _offset_in(view, lp.data) % tensor_align == 0
    # header and segment placement
    has_segment_data = any(s.size for s in q.segments)
    assert (lp.header is not None) == has_segment_data
    if lp.header:
        h = lp.header
        assert h.length == 32 and h.segment_base_offset % seg_align == 0
        assert h.segment_base_offset >= h.program_size and h.segment_base_offset + h.segment_data_size == len(data)
        for s in q.segments:
            assert s.offset % seg_align == 0
        assert struct.unpack_from("<I", data, 0)[0] < h.program_size
        # the header sits between identifier and flatbuffer, padded to the largest alignment in use
        fb = program_to_flatbuffer(q, tensor_alignment=tensor_align)
        pad = h.program_size - len(fb)
        assert pad == max(32, tensor_align)
        assert data[:8 + pad][4:8] == fb[4:8] and data[8 + pad:h.program_size] == fb[8:]
        assert not any(data[40:8 + pad])


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("seg_align,tensor_align,extract_constants,extract_delegates", [
    (128, 16, True, True), (128, 16, False, False), (4096, 64, True, False), (1, 1, True, True),
    (16, 256, False, True),
])
def test_roundtrip_random(rand_program, seed, seg_align, tensor_align, extract_constants, extract_delegates):
    p = rand_program(seed)
    before = copy.deepcopy(p)
    data = serialize_pte(p, segment_alignment=seg_align, constant_tensor_alignment=tensor_align,
                         extract_constant_segment=extract_constants, extract_delegate_segments=extract_delegates)
    assert p == before, "serialize_pte must not modify its argument"
    _check_roundtrip(p, data, seg_align=seg_align, tensor_align=tensor_align, extract_constants=extract_constants,
                     extract_delegates=extract_delegates)


@pytest.mark.parametrize("seed", range(6))
def test_flatbuffer_roundtrip_is_exact(rand_program, seed):
    """Without segments, reading gives back exactly the dataclasses that were written."""
    p = rand_program(seed)
    assert load_pte(program_to_flatbuffer(p)).program == p
    q = dataclasses.replace(p, constant_segment=None, mutable_data_segments=[],
                            named_data=[S.NamedData("k", 0)], segments=[S.DataSegment(0, 0)])
    assert load_pte(program_to_flatbuffer(q)).program == q


def test_special_doubles_and_limits():
    vals = [S.EValue(S.Double(x)) for x in (math.inf, -math.inf, math.nan, 5e-324)]
    vals += [S.EValue(S.Int(2**63 - 1)), S.EValue(S.Int(-(2**63)))]
    p = S.Program(execution_plan=[S.ExecutionPlan("f", values=vals)])
    q = load_pte(serialize_pte(p)).program.execution_plan[0].values
    assert q[0].val.double_val == math.inf and q[1].val.double_val == -math.inf
    assert math.isnan(q[2].val.double_val) and q[3].val.double_val == 5e-324
    assert q[4].val.int_val == 2**63 - 1 and q[5].val.int_val == -(2**63)


def test_mutable_and_named_data():
    t = S.Tensor(S.ScalarType.FLOAT, sizes=[2], dim_order=[0], data_buffer_idx=1,
                 allocation_info=S.AllocationDetails(1, 0, 0))
    p = S.Program(execution_plan=[S.ExecutionPlan("f", values=[S.EValue(t)], non_const_buffer_sizes=[0, 8])])
    state = np.array([1.5, 2.5], np.float32).tobytes()
    data = serialize_pte(p, mutable_data=[S.Buffer(b""), S.Buffer(state)],
                         named_data={"w": (b"W" * 10, 256), "alias": b"W" * 10, "b": b"bias"})
    lp = load_pte(data)
    assert bytes(lp.tensor_data(lp.program.execution_plan[0].values[0].val)) == state
    assert bytes(lp.named_data("w")) == bytes(lp.named_data("alias")) == b"W" * 10
    assert bytes(lp.named_data("b")) == b"bias"
    nd = {e.key: e.segment_index for e in lp.program.named_data}
    assert nd["w"] == nd["alias"] != nd["b"]
    assert lp.program.segments[nd["w"]].offset % 256 == 0


@pytest.mark.parametrize("kwargs", [
    {"segment_alignment": 0}, {"segment_alignment": 100}, {"segment_alignment": -128},
    {"constant_tensor_alignment": 3}, {"delegate_alignment": 48}, {"segment_alignment": 2.0},
    {"segment_alignment": True},
])
def test_bad_alignment_raises(kwargs):
    with pytest.raises(SerializationError, match="power of two"):
        serialize_pte(S.Program(), **kwargs)


def test_bad_field_reports_path():
    t = S.Tensor(S.ScalarType.FLOAT, sizes=[2, 2**40])
    p = S.Program(execution_plan=[S.ExecutionPlan("f", values=[S.EValue(S.Int(1)), S.EValue(t)])])
    with pytest.raises(SerializationError, match=r"execution_plan\[0\]\.values\[1\]\.val\.sizes\[1\]"):
        serialize_pte(p)
    p.execution_plan[0].values[1] = S.EValue(S.Int(-(2**63) - 1))
    with pytest.raises(SerializationError, match=r"values\[1\]\.val\.int_val: .* out of range"):
        serialize_pte(p)
    p.execution_plan[0].values[1] = S.EValue(S.Operator("x", "y"))  # not a KernelTypes member
    with pytest.raises(SerializationError, match="not a member of union KernelTypes"):
        serialize_pte(p)
    with pytest.raises(SerializationError, match="unreferenced|not referenced"):
        serialize_pte(S.Program(backend_delegate_data=[S.BackendDelegateInlineData(b"x")]))
    with pytest.raises(SerializationError, match="segments must be empty"):
        serialize_pte(S.Program(segments=[S.DataSegment(0, 1)]))


def test_identical_delegate_blobs_share_a_segment():
    blob = b"B" * 1000
    plan = S.ExecutionPlan("f", delegates=[
        S.BackendDelegate("a", S.BackendDelegateDataReference(DataLocation.INLINE, 0)),
        S.BackendDelegate("b", S.BackendDelegateDataReference(DataLocation.INLINE, 1)),
        S.BackendDelegate("c", S.BackendDelegateDataReference(DataLocation.INLINE, 2))])
    p = S.Program(execution_plan=[plan], backend_delegate_data=[
        S.BackendDelegateInlineData(blob), S.BackendDelegateInlineData(b""), S.BackendDelegateInlineData(blob)])
    lp = load_pte(serialize_pte(p))
    refs = [d.processed for d in lp.program.execution_plan[0].delegates]
    assert refs[0] == refs[2] == S.BackendDelegateDataReference(DataLocation.SEGMENT, 1)
    assert refs[1] == S.BackendDelegateDataReference(DataLocation.INLINE, 0)
    assert bytes(lp.delegate_data("f", 1)) == b""


def test_write_pte_file_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "m.pte"
    write_pte_file(path, b"old")
    write_pte_file(path, serialize_pte(S.Program()))
    assert load_pte(path.read_bytes()).program.version == 0

    class Boom(Exception):
        pass

    def chunks():
        yield b"partial"
        raise Boom

    with pytest.raises(Boom):
        write_pte_file(path, chunks())
    assert load_pte(path.read_bytes()).program.version == 0
    assert [p.name for p in tmp_path.iterdir()] == ["m.pte"]


@pytest.mark.executorch
@pytest.mark.parametrize("seed", range(8))
def test_executorch_deserializer_reads_our_files(et, rand_program, seed):
    """ExecuTorch's own deserializer (which restores segments) sees the program we wrote."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    p = rand_program(seed)
    restored = deserialize_pte_binary(serialize_pte(p)).program
    for pi, plan in enumerate(p.execution_plan):
        et.assert_same(_strip_refs(plan), dataclasses.replace(
            restored.execution_plan[pi], delegates=[dataclasses.replace(d, processed=None)
                                                   for d in restored.execution_plan[pi].delegates]),
            f"execution_plan[{pi}]")
        for di, d in enumerate(plan.delegates):
            ref = restored.execution_plan[pi].delegates[di].processed
            assert restored.backend_delegate_data[ref.index].data == p.backend_delegate_data[d.processed.index].data
    if not any(b.storage for b in p.constant_buffer):  # nothing but empty entries: no segment data, no header
        assert restored.constant_segment.offsets == [0] * len(p.constant_buffer)
        return
    assert len(restored.constant_buffer) == len(p.constant_buffer)
    for mine, theirs in zip(p.constant_buffer, restored.constant_buffer, strict=True):
        assert theirs.storage[:len(mine.storage)] == mine.storage and not any(theirs.storage[len(mine.storage):])


@pytest.mark.executorch
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("seg_align,tensor_align", [(128, None), (4096, 64), (32, 8)])
def test_segment_layout_matches_executorch_serializer(et, rand_program, seed, seg_align, tensor_align):
    """Same program through ExecuTorch's serializer: same segments, same offsets, same segment bytes."""
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import PTEFile, _get_extended_header, serialize_pte_binary

    p = rand_program(seed)
    ours = serialize_pte(p, segment_alignment=seg_align, constant_tensor_alignment=tensor_align)
    theirs = bytes(serialize_pte_binary(PTEFile(et.to_executorch(p)), extract_delegate_segments=True,
                                        segment_alignment=seg_align, constant_tensor_alignment=tensor_align))
    h_ours, h_theirs = _get_extended_header(ours), _get_extended_header(theirs)
    assert (h_ours is None) == (h_theirs is None)
    if h_ours is not None:
        assert h_ours.segment_data_size == h_theirs.segment_data_size
        assert ours[h_ours.segment_base_offset:] == theirs[h_theirs.segment_base_offset:]
    a = load_pte(ours).program
    b = _flatbuffer_to_program(theirs[:h_theirs.program_size] if h_theirs else theirs)
    et.assert_same(a, b)
