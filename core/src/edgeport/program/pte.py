"""Serialize a :class:`Program` into a complete ``.pte`` file: flatbuffer, extended header, aligned segments.

File layout (all integers little-endian)::

    [0, 4)      uoffset of the root table (shifted by the inserted header)
    [4, 8)      file identifier "ET12"
    [8, 8+H)    extended header, only when segment data follows (H = 32 rounded up to the largest force_align):
                  "eh00" | u32 header length (32) | u64 program_size | u64 segment_base_offset | u64 segment_data_size
                  then zero padding to H
    [8+H, program_size)          rest of the flatbuffer
    [program_size, base)         zero padding; base = program_size rounded up to segment_alignment
    [base, base + segment_data_size)  the segments; DataSegment.offset is relative to base and each segment starts
                                 at a multiple of lcm(segment_alignment, the segment's own alignment)

Segments are appended in this order: the constant segment, the mutable-data segment, delegate blobs (identical
blobs share one segment), named data. Inside the constant segment constant ``i`` starts at ``offsets[i]``; every
constant but the last is zero-padded to a multiple of the tensor alignment (default 16). Entry 0 is the empty
"no data" placeholder, so ``offsets`` begins ``[0, 0, ...]``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from edgeport.errors import SerializationError
from edgeport.program.flatbuffer_writer import DEFAULT_ALIGNMENT, is_power_of_two, program_to_flatbuffer
from edgeport.program.schema import (
    BackendDelegateDataReference,
    BackendDelegateInlineData,
    Buffer,
    DataLocation,
    DataSegment,
    NamedData,
    Program,
    SubsegmentOffsets,
)

__all__ = ["EXTENDED_HEADER_LENGTH", "EXTENDED_HEADER_MAGIC", "serialize_pte", "write_pte_file"]

EXTENDED_HEADER_MAGIC = b"eh00"
#: Length the writer puts in the header (magic, length, program_size, segment_base_offset, segment_data_size).
EXTENDED_HEADER_LENGTH = 32
#: Shortest header a reader accepts (files written before segment_data_size existed).
EXTENDED_HEADER_MIN_LENGTH = 24

_Bytes = bytes | bytearray | memoryview


def _pad(n: int, alignment: int) -> int:
    """Bytes of padding that bring ``n`` up to a multiple of ``alignment``."""
    return -n % alignment


def _check_alignment(name: str, value: Any, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not is_power_of_two(value):
        raise SerializationError(f"{name} must be a positive power of two, got {value!r}")


class _Segments:
    """Segment data collected during serialization: byte chunks with per-segment alignment."""

    def __init__(self, base_alignment: int) -> None:
        self.base_alignment = base_alignment
        self.entries: list[DataSegment] = []
        self.chunks: list[_Bytes] = []
        self.size = 0

    def add(self, parts: Iterable[_Bytes], alignment: int = 1) -> int:
        align = math.lcm(self.base_alignment, alignment)
        pad = _pad(self.size, align)
        if pad:
            self.chunks.append(bytes(pad))
            self.size += pad
        start = self.size
        for part in parts:
            self.chunks.append(part)
            self.size += memoryview(part).nbytes
        self.entries.append(DataSegment(offset=start, size=self.size - start))
        return len(self.entries) - 1


def _pack_subsegments(buffers: list[Any], alignment: int | None) -> tuple[list[_Bytes], list[int]]:
    """Concatenate buffers, padding all but the last to ``alignment``; return (parts, start offsets)."""
    parts: list[_Bytes] = []
    offsets: list[int] = []
    pos = 0
    last = len(buffers) - 1
    for i, data in enumerate(buffers):
        view = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else data
        offsets.append(pos)
        parts.append(view)
        pos += len(view)
        pad = _pad(len(view), alignment) if alignment else 0
        if pad and i < last:
            parts.append(bytes(pad))
            pos += pad
    return parts, offsets


def _extract_delegates(program: Program, segments: _Segments, delegate_alignment: int) -> None:
    """Move every non-empty inline delegate blob into a segment (in place on the copied program)."""
    blobs = program.backend_delegate_data
    seen: set[int] = set()
    kept: list[BackendDelegateInlineData] = []
    by_content: dict[bytes, int] = {}
    new_plans = []
    for p, plan in enumerate(program.execution_plan):
        new_delegates = []
        for d, delegate in enumerate(plan.delegates):
            ref = delegate.processed
            where = f"execution_plan[{p}].delegates[{d}] ({delegate.id!r})"
            if ref is None or ref.location != DataLocation.INLINE:
                raise SerializationError(f"{where}: delegate data must be INLINE before serialization, got {ref}")
            if not 0 <= ref.index < len(blobs):
                raise SerializationError(
                    f"{where}: processed.index {ref.index} is not in backend_delegate_data (size {len(blobs)})")
            seen.add(ref.index)
            data = blobs[ref.index].data
            if memoryview(data).nbytes:
                key = bytes(data)
                index = by_content.get(key)
                if index is None:
                    index = by_content[key] = segments.add([data], delegate_alignment)
                new_ref = BackendDelegateDataReference(DataLocation.SEGMENT, index)
            else:
                new_ref = BackendDelegateDataReference(DataLocation.INLINE, len(kept))
                kept.append(blobs[ref.index])
            new_delegates.append(dataclasses.replace(delegate, processed=new_ref))
        new_plans.append(dataclasses.replace(plan, delegates=new_delegates))
    unused = sorted(set(range(len(blobs))) - seen)
    if unused:
        raise SerializationError(f"backend_delegate_data entries {unused} are not referenced by any delegate")
    program.execution_plan = new_plans
    program.backend_delegate_data = kept


def _extract_named_data(program: Program, segments: _Segments,
                        named_data: Mapping[str, _Bytes | tuple[_Bytes, int]]) -> None:
    if program.named_data:
        raise SerializationError("program.named_data is already filled in; pass named data only as an argument")
    blobs: dict[bytes, list[Any]] = {}  # content -> [alignment, keys]
    for key, entry in named_data.items():
        data, alignment = entry if isinstance(entry, tuple) else (entry, 1)
        _check_alignment(f"named data {key!r} alignment", alignment, allow_none=False)
        slot = blobs.setdefault(bytes(data), [1, []])
        slot[0] = math.lcm(slot[0], alignment)
        slot[1].append(key)
    entries: list[NamedData] = []
    for content, (alignment, keys) in blobs.items():
        index = segments.add([content], alignment)
        entries.extend(NamedData(key, index) for key in keys)
    order = {key: i for i, key in enumerate(named_data)}
    program.named_data = sorted(entries, key=lambda e: order[e.key])


def serialize_pte(
    program: Program,
    *,
    extract_delegate_segments: bool = True,
    extract_constant_segment: bool = True,
    segment_alignment: int = 128,
    constant_tensor_alignment: int | None = None,
    delegate_alignment: int | None = None,
    mutable_data: list[Buffer] | None = None,
    named_data: Mapping[str, _Bytes | tuple[_Bytes, int]] | None = None,
) -> bytes:
    """Serialize ``program`` into ``.pte`` bytes the ExecuTorch runtime loads.

    ``program`` is not modified. Its constants are expected in ``constant_buffer`` (``[Buffer(b""), ...]``,
    entry 0 = no data) and its delegate blobs inline in ``backend_delegate_data``; ``segments`` must be empty.

    * ``extract_constant_segment``: constants move to the constant segment, each aligned to
      ``constant_tensor_alignment`` (default 16). An empty ``constant_buffer`` counts as ``[Buffer(b"")]``,
      which the runtime needs. Otherwise they stay inline, with that alignment.
    * ``extract_delegate_segments``: non-empty delegate blobs move to segments (identical blobs share one).
    * ``segment_alignment`` aligns the start of every segment.
    * ``delegate_alignment`` (default 16) aligns blobs left inline; when given it also aligns delegate segments
      (ExecuTorch aligns those to ``segment_alignment`` only: same layout whenever it is the larger one).
    * ``mutable_data`` (initial values of mutable tensors, entry 0 reserved) and ``named_data``
      (key -> bytes or (bytes, alignment)) become segments laid out as ExecuTorch does.

    All alignments must be powers of two, else ``SerializationError``.
    """
    _check_alignment("segment_alignment", segment_alignment, allow_none=False)
    _check_alignment("constant_tensor_alignment", constant_tensor_alignment)
    _check_alignment("delegate_alignment", delegate_alignment)
    if not isinstance(program, Program):
        raise SerializationError(f"serialize_pte expects a Program, got {type(program).__name__}")
    if program.segments:
        raise SerializationError("program.segments must be empty: segments are created by serialize_pte")
    tensor_alignment = constant_tensor_alignment or DEFAULT_ALIGNMENT
    blob_alignment = delegate_alignment or DEFAULT_ALIGNMENT

    program = dataclasses.replace(program, segments=[])  # shallow copy; rewritten fields get new objects
    segments = _Segments(segment_alignment)

    has_offsets = program.constant_segment is not None and bool(program.constant_segment.offsets)
    if extract_constant_segment and (program.constant_buffer or not has_offsets):
        if has_offsets:
            raise SerializationError("program has both constant_buffer and constant_segment.offsets")
        # The runtime needs at least the reserved entry 0 (without it, it looks for legacy inline constants).
        constants = program.constant_buffer or [Buffer(b"")]
        parts, offsets = _pack_subsegments([b.storage for b in constants], tensor_alignment)
        program.constant_segment = SubsegmentOffsets(segment_index=len(segments.entries), offsets=offsets)
        program.constant_buffer = []
        segments.add(parts)
    if mutable_data:
        parts, offsets = _pack_subsegments([b.storage for b in mutable_data], None)
        if sum(len(p) for p in parts):
            program.mutable_data_segments = [SubsegmentOffsets(len(segments.entries), offsets)]
            segments.add(parts)
    if extract_delegate_segments:
        _extract_delegates(program, segments, delegate_alignment or 1)
    if named_data:
        _extract_named_data(program, segments, named_data)
    program.segments = segments.entries

    flatbuffer = program_to_flatbuffer(program, tensor_alignment=tensor_alignment,
                                       delegate_alignment=blob_alignment)
    if segments.size == 0:
        return flatbuffer

    max_align = max(DEFAULT_ALIGNMENT, tensor_alignment, blob_alignment)
    header_size = EXTENDED_HEADER_LENGTH + _pad(EXTENDED_HEADER_LENGTH, max_align)
    program_size = len(flatbuffer) + header_size
    base = program_size + _pad(program_size, segment_alignment)
    (root,) = struct.unpack_from("<I", flatbuffer, 0)
    header = struct.pack("<4sIQQQ", EXTENDED_HEADER_MAGIC, EXTENDED_HEADER_LENGTH, program_size, base,
                         segments.size)
    fb = memoryview(flatbuffer)
    return b"".join([struct.pack("<I", root + header_size), fb[4:8], header, bytes(header_size - len(header)),
                     fb[8:], bytes(base - program_size), *segments.chunks])


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_pte_file(path: str | os.PathLike[str], data: _Bytes | Iterable[_Bytes]) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same directory, then ``os.replace``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        if hasattr(os, "fchmod"):  # mkstemp creates 0600; give the file the usual permissions
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
