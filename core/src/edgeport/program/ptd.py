"""``.ptd`` data files (ExecuTorch's FlatTensor format): named tensors and blobs stored beside a ``.pte``.

File layout (little-endian), as ExecuTorch 1.5.1 writes and reads it::

    [0, 4)     uoffset of the root FlatTensor table (shifted by the inserted header)
    [4, 8)     file identifier "FT01"
    [8, 48)    header: "FH01" | u32 length (40) | u64 flatbuffer_offset (48) | u64 flatbuffer_size
               | u64 segment_base_offset | u64 segment_data_size, zero-padded to 16 bytes
    [48, ...)  rest of the flatbuffer; then zero padding up to segment_base_offset (a multiple of 128)
    [base, base + segment_data_size)   the segments, each starting at a multiple of lcm(128, its alignment)

``NamedData.key`` is a constant's fully qualified name (with its ``TensorLayout``) or a backend's named-data key
(no layout). The reader checks every offset and size against the file before giving out views.
"""

from __future__ import annotations

import math
import struct
import types
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from edgeport.errors import ProgramError, SerializationError
from edgeport.program import schema as S
from edgeport.program.flatbuffer_writer import _Writer, is_power_of_two
from edgeport.program.layout import Layout, build_layout, read_schema_text
from edgeport.program.reader import _byte_view, _Decoder

__all__ = ["FLAT_TENSOR_VERSION", "DataEntry", "ExternalData", "LoadedPtd", "TensorLayout", "load_ptd", "serialize_ptd"]

FLAT_TENSOR_VERSION = 0
FILE_IDENTIFIER = b"FT01"
HEADER_MAGIC = b"FH01"
HEADER_LENGTH = 40
_HEADER_PADDED = 48  # the header rounded up to the flatbuffer's 16-byte alignment
DEFAULT_SEGMENT_ALIGNMENT = 128


@dataclass
class TensorLayout:
    scalar_type: S.ScalarType = S.ScalarType.BYTE
    sizes: list[int] = field(default_factory=list)
    dim_order: list[int] = field(default_factory=list)


@dataclass
class DataSegment:
    offset: int = 0
    size: int = 0


@dataclass
class NamedData:
    key: str = ""
    segment_index: int = 0
    tensor_layout: TensorLayout | None = None


@dataclass
class FlatTensor:
    version: int = 0
    segments: list[DataSegment] = field(default_factory=list)
    named_data: list[NamedData] = field(default_factory=list)


_CLASSES: dict[str, type] = {"TensorLayout": TensorLayout, "DataSegment": DataSegment, "NamedData": NamedData,
                             "FlatTensor": FlatTensor}


@lru_cache(maxsize=1)
def _layout() -> Layout:
    lay = build_layout([read_schema_text("scalar_type.fbs"), read_schema_text("flat_tensor.fbs")], _CLASSES,
                       types.SimpleNamespace(ScalarType=S.ScalarType))
    if lay.file_identifier != FILE_IDENTIFIER or lay.root != "FlatTensor":
        raise RuntimeError('flat_tensor.fbs must declare file_identifier "FT01" and root_type FlatTensor')
    return lay


@dataclass(frozen=True)
class DataEntry:
    """What a ``.ptd`` holds under one key: bytes, their alignment, and a tensor layout for tensors."""

    data: bytes | memoryview
    alignment: int = 16
    layout: TensorLayout | None = None


def serialize_ptd(entries: dict[str, DataEntry], segment_alignment: int = DEFAULT_SEGMENT_ALIGNMENT) -> bytes:
    """The ``.ptd`` bytes of ``entries`` (key -> :class:`DataEntry`); identical bytes share one segment."""
    if not is_power_of_two(segment_alignment):
        raise SerializationError(f"segment_alignment must be a power of two, got {segment_alignment!r}")
    segments: list[DataSegment] = []
    chunks: list[Any] = []
    size = 0
    by_content: dict[bytes, int] = {}
    named: list[NamedData] = []
    for key, entry in entries.items():
        if not isinstance(key, str) or not key:
            raise SerializationError(f".ptd keys must be non-empty strings, got {key!r}")
        if not is_power_of_two(entry.alignment):
            raise SerializationError(f".ptd entry {key!r}: alignment must be a power of two, got {entry.alignment}")
        data = bytes(entry.data)
        index = by_content.get(data)
        if index is None:
            align = math.lcm(segment_alignment, entry.alignment)
            pad = -size % align
            if pad:
                chunks.append(bytes(pad))
                size += pad
            segments.append(DataSegment(size, len(data)))
            chunks.append(data)
            size += len(data)
            index = by_content[data] = len(segments) - 1
        named.append(NamedData(key, index, entry.layout))
    lay = _layout()
    import flatbuffers

    builder = flatbuffers.Builder(1024 + 64 * len(named))
    root = _Writer(lay, 16, 16).packers["FlatTensor"](builder, FlatTensor(FLAT_TENSOR_VERSION, segments, named))
    builder.Finish(root, file_identifier=FILE_IDENTIFIER)
    fb = bytes(builder.Output())
    flatbuffer_size = len(fb)  # the flatbuffer as built; it ends at _HEADER_PADDED + len(fb) once the header is in
    end = _HEADER_PADDED + flatbuffer_size
    base = end + (-end % segment_alignment)
    (root_offset,) = struct.unpack_from("<I", fb, 0)
    header = struct.pack("<4sIQQQQ", HEADER_MAGIC, HEADER_LENGTH, _HEADER_PADDED, flatbuffer_size, base, size)
    return b"".join([struct.pack("<I", root_offset + _HEADER_PADDED), fb[4:8], header,
                     bytes(_HEADER_PADDED - len(header)), fb[8:], bytes(base - end), *chunks])


@dataclass
class LoadedPtd:
    """A parsed ``.ptd``: ``entries`` maps each key to (a view of its bytes, its tensor layout or None)."""

    name: str
    entries: dict[str, tuple[memoryview, TensorLayout | None]]
    source: Any = None  # keeps the mmap / bytes alive while views exist


def load_ptd(data: Any, name: str = "<bytes>") -> LoadedPtd:
    """Parse and check a ``.ptd`` held in ``data`` (bytes, memoryview, mmap); errors name ``name``."""
    view = _byte_view(data)
    n = len(view)
    if n < 8 + HEADER_LENGTH:
        raise ProgramError(f"data file {name}: {n} bytes, too short for a .ptd (at least {8 + HEADER_LENGTH})")
    if bytes(view[4:8]) != FILE_IDENTIFIER:
        raise ProgramError(f"data file {name}: file identifier is {bytes(view[4:8])!r}, expected {FILE_IDENTIFIER!r} "
                           "(not a .ptd data file)")
    magic, length, fb_offset, fb_size, base, seg_size = struct.unpack_from("<4sIQQQQ", view, 8)
    if magic != HEADER_MAGIC or length < HEADER_LENGTH:
        raise ProgramError(f"data file {name}: bad header (magic {magic!r}, length {length}); the file is corrupt")
    program_end = fb_offset + fb_size
    if fb_offset < 8 + HEADER_LENGTH or fb_size < 8 or program_end > n:
        raise ProgramError(f"data file {name}: the flatbuffer ({fb_size} bytes) runs past the end of the file "
                           f"({n} bytes): truncated")
    if seg_size and (base < program_end or base + seg_size > n):
        raise ProgramError(f"data file {name}: segment data [{base}, {base + seg_size}) lies outside the file "
                           f"({n} bytes): truncated or corrupt")
    (root,) = struct.unpack_from("<I", view, 0)
    if root < 8 + HEADER_LENGTH or root >= program_end:
        raise ProgramError(f"data file {name}: root table offset {root} is outside the flatbuffer")
    dec = _Decoder(_layout())
    dec.start(view, program_end)
    try:
        ft = dec.table("FlatTensor", root, name)
    except ProgramError as exc:
        raise ProgramError(f"data file {name}: {exc}") from None
    finally:
        dec.finish()
    if ft.version > FLAT_TENSOR_VERSION:
        raise ProgramError(f"data file {name}: FlatTensor version {ft.version} is newer than this reader "
                           f"({FLAT_TENSOR_VERSION}); upgrade edgeport")
    segments = []
    for i, seg in enumerate(ft.segments or []):
        if seg.offset + seg.size > seg_size:
            raise ProgramError(f"data file {name}: segments[{i}] [{seg.offset}, {seg.offset + seg.size}) runs past "
                               f"the segment data ({seg_size} bytes)")
        segments.append(view[base + seg.offset: base + seg.offset + seg.size])
    entries: dict[str, tuple[memoryview, TensorLayout | None]] = {}
    for nd in ft.named_data or []:
        if nd.key in entries:
            raise ProgramError(f"data file {name}: key {nd.key!r} appears twice")
        if not 0 <= nd.segment_index < len(segments):
            raise ProgramError(f"data file {name}: key {nd.key!r} names segment {nd.segment_index}, the file has "
                               f"{len(segments)}")
        entries[nd.key] = (segments[nd.segment_index], nd.tensor_layout)
    return LoadedPtd(name, entries, data)


class ExternalData:
    """The data files given with a program (``load_program(pte, data_path=...)``), searched by key."""

    def __init__(self, files: list[LoadedPtd]) -> None:
        self.files = files
        self._index: dict[str, LoadedPtd] = {}
        for ptd in files:
            for key in ptd.entries:
                other = self._index.get(key)
                if other is not None and bytes(other.entries[key][0]) != bytes(ptd.entries[key][0]):
                    raise ProgramError(f"key {key!r} is in data files {other.name} and {ptd.name} with different "
                                       "bytes; pass only one of them")
                self._index.setdefault(key, ptd)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.files]

    def find(self, key: str) -> tuple[memoryview, TensorLayout | None, str] | None:
        """``(bytes, tensor layout or None, file name)`` stored under ``key``, or None."""
        ptd = self._index.get(key)
        if ptd is None:
            return None
        view, layout = ptd.entries[key]
        return view, layout, ptd.name
