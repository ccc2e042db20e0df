"""Read ``.pte`` bytes into the :class:`Program` dataclass tree, safely, with zero-copy views of the segments.

This is the base of the torch-free runtime loader, so every input is treated as hostile: each offset, vtable,
vector length, string, union type and segment range is checked against the buffer before it is used, and every
defect raises :class:`~edgeport.errors.ProgramError` naming what is wrong and where
(``execution_plan[0].values[12].val.sizes: vector of 1000000 x 4-byte elements runs past end of buffer``).

Why it cannot hang or blow up: flatbuffer offsets only point forward and decoding follows the schema, whose type
graph has no cycles, so recursion depth is bounded by the schema (at most 6 tables deep). Vector lengths are
bounded by the bytes left in the buffer before anything is allocated. Shared sub-objects (many offsets pointing
at one table) could still multiply the work, so the total bytes decoded are capped at a small multiple of the
buffer size.

``load_pte`` also checks the indices the file alone defines (segments, constant data, delegate data, named data).
Indices between values, instructions, operators and delegates are checked by :func:`verify_program`
(``edgeport.program.verify``).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import Any

from edgeport.errors import ProgramError
from edgeport.program.layout import SCALARS, Field, Layout, layout
from edgeport.program.loaded import ExtendedHeader, LoadedPte, check_file_indices
from edgeport.program.pte import EXTENDED_HEADER_MAGIC, EXTENDED_HEADER_MIN_LENGTH

__all__ = ["ExtendedHeader", "LoadedPte", "load_pte", "parse_extended_header"]

_u32 = struct.Struct("<I").unpack_from
_i32 = struct.Struct("<i").unpack_from
_u16 = struct.Struct("<H").unpack_from
_BUDGET_FACTOR = 4
_BUDGET_SLACK = 1 << 16


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _byte_view(data: Any) -> memoryview:
    """A flat unsigned-byte memoryview of ``data`` (bytes, bytearray, memoryview, mmap, numpy array)."""
    try:
        view = memoryview(data)
        return view if view.ndim == 1 and view.format == "B" else view.cast("B")
    except TypeError as exc:
        raise ProgramError(f"cannot read a program from {type(data).__name__}: {exc}") from None


def parse_extended_header(data: Any) -> ExtendedHeader | None:
    """Parse and check the extended header of ``data``; ``None`` when the file has none."""
    view = _byte_view(data)
    n = len(view)
    if n < 12 or bytes(view[8:12]) != EXTENDED_HEADER_MAGIC:
        return None
    if n < 8 + EXTENDED_HEADER_MIN_LENGTH:
        raise ProgramError(f"extended header: file is {n} bytes, too short for the header at offset 8")
    length, program_size, base = struct.unpack_from("<IQQ", view, 12)
    if length < EXTENDED_HEADER_MIN_LENGTH:
        raise ProgramError(f"extended header: length {length} < minimum {EXTENDED_HEADER_MIN_LENGTH}")
    data_size = 0
    if length >= 32:
        if n < 8 + 32:
            raise ProgramError(f"extended header: length {length} but file is only {n} bytes")
        (data_size,) = struct.unpack_from("<Q", view, 32)
    if not 8 + length <= program_size <= n:
        raise ProgramError(f"extended header: program_size {program_size} outside [{8 + length}, file size {n}]")
    if base == 0:
        if data_size:
            raise ProgramError(f"extended header: segment_data_size {data_size} without a segment base offset")
    elif not program_size <= base <= n:
        raise ProgramError(f"extended header: segment_base_offset {base} outside [{program_size}, file size {n}]")
    elif base + data_size > n:
        raise ProgramError(
            f"extended header: segment data [{base}, {base + data_size}) runs past end of file ({n} bytes)")
    return ExtendedHeader(length, program_size, base, data_size)


class _Decoder:
    """Schema-driven flatbuffer decoder over ``buf[:end]`` with bounds checks everywhere."""

    def __init__(self, lay: Layout) -> None:
        self.lay = lay
        self.buf: Any = None
        self.end = 0
        self.budget = 0
        self.byte_spans: dict[str, list[tuple[int, int]]] = {"Buffer": [], "BackendDelegateInlineData": []}
        self.decoders: dict[str, Callable[[int, str], Any]] = {}
        for name in lay.tables:
            self.decoders[name] = self._make_table_decoder(name)

    def start(self, buf: memoryview, end: int) -> None:
        """Prepare to decode ``buf[:end]`` (decoders are built once and reused)."""
        self.buf, self.end = buf, end
        self.budget = _BUDGET_FACTOR * end + _BUDGET_SLACK
        for spans in self.byte_spans.values():
            spans.clear()

    def finish(self) -> None:
        """Drop the reference to the buffer (an mmap can only close once no view of it is alive)."""
        self.buf = None

    # ------------------------------------------------------------------ primitives
    def _spend(self, nbytes: int, path: str) -> None:
        self.budget -= nbytes
        if self.budget < 0:
            raise ProgramError(f"{path}: decoding exceeds {_BUDGET_FACTOR}x the buffer size; the file shares "
                               "objects in a way no serializer does (refusing to amplify)")

    def _deref(self, at: int, path: str) -> int:
        """Follow the uoffset stored at ``at`` (already known in bounds)."""
        (off,) = _u32(self.buf, at)
        target = at + off
        if off == 0 or target >= self.end:
            raise ProgramError(f"{path}: offset {off} at byte {at} points outside the buffer ({self.end} bytes)")
        return target

    def _vector(self, pos: int, elem_size: int, path: str) -> tuple[int, int]:
        """Check the vector at ``pos``; return (start of elements, element count)."""
        if pos + 4 > self.end or pos & 3:
            raise ProgramError(f"{path}: vector length at byte {pos} " + (
                "is not 4-byte aligned" if pos & 3 else "runs past end of buffer"))
        (count,) = _u32(self.buf, pos)
        if count * elem_size > self.end - pos - 4:
            raise ProgramError(f"{path}: vector of {count} x {elem_size}-byte elements at byte {pos} "
                               f"runs past end of buffer ({self.end} bytes)")
        self._spend(4 + count * elem_size, path)
        return pos + 4, count

    def _string(self, pos: int, path: str) -> str:
        start, count = self._vector(pos, 1, path)
        if start + count >= self.end or self.buf[start + count] != 0:
            raise ProgramError(f"{path}: string at byte {pos} is not NUL-terminated inside the buffer")
        try:
            return bytes(self.buf[start:start + count]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProgramError(f"{path}: string at byte {pos} is not valid UTF-8 ({exc.reason})") from None

    def table(self, name: str, pos: int, path: str) -> Any:
        return self.decoders[name](pos, path)

    def _table_header(self, pos: int, path: str) -> tuple[int, ...]:
        """The vtable's field offsets of the table at ``pos``.

        The vtable's table-size entry is not checked and not used: no flatbuffers reader or verifier relies on it,
        and the Python ``flatbuffers`` releases before 25.12 write a too-small one when a vtable is shared by tables
        of different sizes. Each field is checked on its own against the buffer instead (see ``decode``).
        """
        end = self.end
        if pos & 3 or pos + 4 > end:
            raise ProgramError(f"{path}: table at byte {pos} " + (
                "is not 4-byte aligned" if pos & 3 else f"runs past end of buffer ({end} bytes)"))
        (soff,) = _i32(self.buf, pos)
        vt = pos - soff
        if vt < 0 or vt + 4 > end or vt & 1:
            raise ProgramError(f"{path}: vtable of table at byte {pos} is outside the buffer or misaligned "
                               f"(byte {vt})")
        (vsize,) = _u16(self.buf, vt)
        if vsize < 4 or vsize & 1 or vt + vsize > end:
            raise ProgramError(f"{path}: vtable at byte {vt} has bad size {vsize}")
        self._spend(4 + vsize, path)
        nslots = (vsize - 4) >> 1
        return struct.unpack_from(f"<{nslots}H", self.buf, vt + 4) if nslots else ()

    def _field_error(self, path: str, pos: int, voff: int, size: int) -> ProgramError:
        """Why a present field of ``size`` bytes at table offset ``voff`` of the table at ``pos`` is refused."""
        at = pos + voff
        if voff < 4:
            why = "overlaps the table's vtable offset"
        elif at + size > self.end:
            why = f"runs past end of buffer ({self.end} bytes)"
        else:
            why = f"is not {size}-byte aligned (flatbuffers aligns every scalar and offset to its size)"
        return ProgramError(f"{path}: {size}-byte field at table offset {voff} (byte {at}) of the table at byte "
                            f"{pos} {why}")

    # ------------------------------------------------------------------ per-table decoders
    def _make_field_reader(self, table: str, f: Field) -> Callable[[int, str], Any]:
        """Function (absolute position of the field, field path) -> Python value."""
        if f.kind == "scalar":
            unpack = struct.Struct("<" + SCALARS[f.scalar][0]).unpack_from
            if f.ref:  # enum: keep unknown values as plain ints (verify_program reports them)
                get = {int(m): m for m in self.lay.enums[f.ref][1]}.get

                def read_enum(at: int, path: str) -> Any:
                    (v,) = unpack(self.buf, at)
                    return get(v, v)
                return read_enum
            return lambda at, path: unpack(self.buf, at)[0]
        if f.kind == "string":
            return lambda at, path: self._string(self._deref(at, path), path)
        if f.kind == "table":
            ref = f.ref
            return lambda at, path: self.decoders[ref](self._deref(at, path), path)
        if f.kind == "bytes":
            spans = self.byte_spans.get(table)

            def read_bytes(at: int, path: str) -> bytes:
                start, count = self._vector(self._deref(at, path), 1, path)
                if spans is not None:
                    spans.append((start, count))
                return bytes(self.buf[start:start + count])
            return read_bytes
        if f.kind == "vector" and f.elem == "scalar":
            code, size = SCALARS[f.scalar][:2]

            def read_scalars(at: int, path: str) -> list[Any]:
                start, count = self._vector(self._deref(at, path), size, path)
                return list(struct.unpack_from(f"<{count}{code}", self.buf, start))
            return read_scalars
        if f.kind == "vector" and f.elem == "table":
            ref = f.ref

            def read_tables(at: int, path: str) -> list[Any]:
                start, count = self._vector(self._deref(at, path), 4, path)
                decode, end = self.decoders[ref], self.end
                out = []
                for i, off in enumerate(struct.unpack_from(f"<{count}I", self.buf, start)):
                    p = start + 4 * i
                    if off == 0 or p + off >= end:
                        raise ProgramError(f"{path}[{i}]: offset {off} at byte {p} points outside the buffer")
                    out.append(decode(p + off, f"{path}[{i}]"))
                return out
            return read_tables
        raise AssertionError(f"{table}.{f.name}: {f.kind}/{f.elem}")  # pragma: no cover

    def _make_table_decoder(self, name: str) -> Callable[[int, str], Any]:
        t = self.lay.tables[name]
        cls = t.cls
        plan = []
        for f in t.fields:
            if f.kind == "union":
                continue
            size = SCALARS[f.scalar][1] if f.kind == "scalar" else 4
            absent: Any
            if f.kind == "scalar":
                absent = self.lay.enums[f.ref][1](f.default) if f.ref else f.default
            elif f.kind == "string":
                absent = f.default
            elif f.kind == "bytes":
                absent = b""
            elif f.kind == "vector":
                absent = None if f.optional else []
            else:
                absent = None
            mutable_absent = f.kind == "vector" and not f.optional
            plan.append((f.name, f.slot, size, self._make_field_reader(name, f), absent, mutable_absent))
        unions = []
        for f in t.fields:
            if f.kind == "union":
                members = tuple(self.lay.unions[f.ref])
                unions.append((f.name, f.slot, f.ref, members))

        def decode(pos: int, path: str) -> Any:
            voffs = self._table_header(pos, path)
            nslots, end = len(voffs), self.end
            kwargs = {}
            for fname, slot, size, read, absent, mutable_absent in plan:
                voff = voffs[slot] if slot < nslots else 0
                if voff == 0:
                    kwargs[fname] = [] if mutable_absent else absent
                    continue
                at = pos + voff
                if voff < 4 or at + size > end or at & (size - 1):
                    raise self._field_error(_join(path, fname), pos, voff, size)
                kwargs[fname] = read(at, _join(path, fname))
            for fname, slot, uname, members in unions:
                fpath = _join(path, fname)
                tvoff = voffs[slot - 1] if slot - 1 < nslots else 0
                vvoff = voffs[slot] if slot < nslots else 0
                if tvoff == 0 or vvoff == 0:
                    raise ProgramError(f"{fpath}: {uname} value is missing")
                if tvoff < 4 or pos + tvoff >= end:
                    raise self._field_error(f"{fpath}_type", pos, tvoff, 1)
                if vvoff < 4 or pos + vvoff + 4 > end or (pos + vvoff) & 3:
                    raise self._field_error(fpath, pos, vvoff, 4)
                utype = self.buf[pos + tvoff]
                if not 1 <= utype <= len(members):
                    raise ProgramError(f"{fpath}: unknown {uname} type {utype} (known: 1..{len(members)})")
                member = members[utype - 1]
                kwargs[fname] = self.decoders[member](self._deref(pos + vvoff, fpath), fpath)
            return cls(**kwargs)

        spans = self.byte_spans.get(name)
        if spans is None:
            return decode

        def decode_recording_span(pos: int, path: str) -> Any:
            # keep one span per table, also when its byte vector is absent
            count = len(spans)
            obj = decode(pos, path)
            if len(spans) == count:
                spans.append((0, 0))
            return obj

        return decode_recording_span


_LOCAL = threading.local()


def _decoder() -> _Decoder:
    """This thread's decoder (building the per-table decoders takes longer than reading a small program)."""
    dec = getattr(_LOCAL, "decoder", None)
    if dec is None:
        dec = _LOCAL.decoder = _Decoder(layout())
    return dec


def load_pte(data: bytes | bytearray | memoryview | Any) -> LoadedPte:
    """Parse and check a ``.pte`` file held in ``data`` (bytes, memoryview, mmap); views keep ``data`` alive."""
    view = _byte_view(data)
    n = len(view)
    if n < 8:
        raise ProgramError(f"file is {n} bytes, too short for a program (at least 8)")
    lay = layout()
    ident = bytes(view[4:8])
    if ident != lay.file_identifier:
        raise ProgramError(f"file identifier is {ident!r}, expected {lay.file_identifier!r} (not a .pte program)")
    header = parse_extended_header(view)
    program_size = header.program_size if header else n
    (root,) = _u32(view, 0)
    if root < 8 or root >= program_size:
        raise ProgramError(f"root table offset {root} is outside the program ({program_size} bytes)")
    dec = _decoder()
    dec.start(view, program_size)
    try:
        program = dec.table("Program", root, "")
        spans = {name: list(found) for name, found in dec.byte_spans.items()}
    finally:
        dec.finish()

    base = header.segment_base_offset if header else 0
    limit = (base + header.segment_data_size) if header and header.segment_data_size else n
    segments = []
    for i, seg in enumerate(program.segments):
        if seg.size == 0:
            segments.append(view[0:0])
            continue
        if base == 0:
            raise ProgramError(f"segments[{i}]: {seg.size} bytes of segment data but the file has no "
                               "extended header with a segment base offset")
        start = base + seg.offset
        if start + seg.size > limit:
            raise ProgramError(f"segments[{i}]: [{start}, {start + seg.size}) runs past the end of the segment data "
                               f"({limit} bytes)")
        segments.append(view[start:start + seg.size])
    lp = LoadedPte(program, view, program_size, header, segments,
                   [view[s:s + c] for s, c in spans["Buffer"]],
                   [view[s:s + c] for s, c in spans["BackendDelegateInlineData"]])
    check_file_indices(lp)
    return lp
