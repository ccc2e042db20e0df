"""The Vulkan delegate blob (torch-free): ``VH00`` header + ``VkGraph`` flatbuffer + constant bytes.

Layout of a blob, as ExecuTorch's Vulkan delegate reads it (all integers little-endian)::

    [0:4]   zero padding (so the magic sits where a flatbuffer's file identifier would)
    [4:8]   b"VH00"
    [8:10]  header length (30)
    [10:14] flatbuffer offset      [14:18] flatbuffer size
    [18:22] constant-bytes offset  [22:30] constant-bytes size

The header is padded to 16 bytes, the flatbuffer (``schema/vkgraph.fbs``, edgeport's own text of the wire format)
follows, then the constant bytes (each constant 16-byte aligned). The flatbuffer is written and read with
edgeport's generic flatbuffers layout machinery (:mod:`edgeport.program.layout`).
"""

from __future__ import annotations

import struct
import types
from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache
from importlib import resources
from typing import Any

from edgeport.errors import ProgramError

__all__ = [
    "HEADER_LENGTH", "MAGIC", "NAMED_DATA_OFFSET", "Bool", "BoolList", "Double", "DoubleList", "Int", "IntList",
    "Null", "OperatorCall", "String", "SymInt", "ValueList", "VkBytes", "VkDataType", "VkGraph", "VkMemoryLayout",
    "VkStorageType", "VkTensor", "VkValue", "VulkanBlob", "parse_blob", "serialize_blob",
]

MAGIC = b"VH00"
FILE_IDENTIFIER = b"VK00"
HEADER_LENGTH = 30
NAMED_DATA_OFFSET = 2**64 - 1  # VkBytes.offset of a constant kept in the program's named data
_ALIGN = 16


class VkDataType(IntEnum):
    BOOL = 0
    UINT8 = 1
    INT8 = 2
    INT32 = 3
    FLOAT16 = 4
    FLOAT32 = 5
    FLOAT64 = 6
    INT64 = 7
    UNSET = 127


class VkStorageType(IntEnum):
    BUFFER = 0
    TEXTURE_3D = 1
    TEXTURE_2D = 2
    DEFAULT_STORAGE = 255


class VkMemoryLayout(IntEnum):
    TENSOR_WIDTH_PACKED = 0
    TENSOR_HEIGHT_PACKED = 1
    TENSOR_CHANNELS_PACKED = 2
    PACKED_INT8_4W4C = 3
    PACKED_INT8_4H4W = 4
    PACKED_INT8_4W = 5
    PACKED_INT8_4C = 6
    PACKED_INT8_4C1W = 8
    PACKED_INT8_CONV2D = 9
    DEFAULT_LAYOUT = 255


@dataclass
class OperatorCall:
    node_id: int = 0
    name: str = ""
    args: list[int] = field(default_factory=list)


@dataclass
class VkTensor:
    datatype: int = VkDataType.FLOAT32
    dims: list[int] = field(default_factory=list)
    constant_id: int = -1
    mem_obj_id: int = -1
    storage_type: int = VkStorageType.DEFAULT_STORAGE
    memory_layout: int = VkMemoryLayout.DEFAULT_LAYOUT
    staging_datatype: int = VkDataType.UNSET


@dataclass
class Null:
    pass


@dataclass
class Int:
    int_val: int = 0


@dataclass
class Bool:
    bool_val: bool = False


@dataclass
class Double:
    double_val: float = 0.0


@dataclass
class String:
    string_val: str = ""


@dataclass
class IntList:
    items: list[int] = field(default_factory=list)


@dataclass
class DoubleList:
    items: list[float] = field(default_factory=list)


@dataclass
class BoolList:
    items: list[bool] = field(default_factory=list)


@dataclass
class ValueList:
    items: list[int] = field(default_factory=list)


@dataclass
class SymInt:
    value: int = 0


GraphValue = Null | Int | Double | Bool | VkTensor | IntList | DoubleList | BoolList | ValueList | String | SymInt


@dataclass
class VkValue:
    value: GraphValue = field(default_factory=Null)


@dataclass
class VkBytes:
    offset: int = 0
    length: int = 0
    named_key: str = ""


@dataclass
class VkGraph:
    version: str = "0"
    chain: list[OperatorCall] = field(default_factory=list)
    values: list[VkValue] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    constants: list[VkBytes] = field(default_factory=list)
    shaders: list[VkBytes] = field(default_factory=list)
    storage_type_override: int = VkStorageType.DEFAULT_STORAGE
    memory_layout_override: int = VkMemoryLayout.DEFAULT_LAYOUT


_CLASSES: dict[str, type] = {
    "OperatorCall": OperatorCall, "VkTensor": VkTensor, "Null": Null, "Int": Int, "Bool": Bool, "Double": Double,
    "String": String, "IntList": IntList, "DoubleList": DoubleList, "BoolList": BoolList, "ValueList": ValueList,
    "SymInt": SymInt, "VkValue": VkValue, "VkBytes": VkBytes, "VkGraph": VkGraph,
}


def schema_text() -> str:
    return resources.files(__package__).joinpath("vkgraph.fbs").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _layout() -> Any:
    from edgeport.program.layout import build_layout

    lay = build_layout([schema_text()], _CLASSES, types.SimpleNamespace(
        VkDataType=VkDataType, VkStorageType=VkStorageType, VkMemoryLayout=VkMemoryLayout))
    if lay.file_identifier != FILE_IDENTIFIER or lay.root != "VkGraph":
        raise RuntimeError('vkgraph.fbs must declare file_identifier "VK00" and root_type VkGraph')
    return lay


def serialize_graph(graph: VkGraph) -> bytes:
    """The ``VkGraph`` flatbuffer (file identifier ``VK00``)."""
    import flatbuffers

    from edgeport.program.flatbuffer_writer import _Writer

    builder = flatbuffers.Builder(1024)
    root = _Writer(_layout(), 16, 16).packers["VkGraph"](builder, graph)
    builder.Finish(root, file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def read_graph(data: bytes | memoryview, name: str = "VkGraph") -> VkGraph:
    """Parses a ``VkGraph`` flatbuffer; every offset is bounds-checked (``ProgramError`` names the problem)."""
    from edgeport.program.reader import _Decoder

    view = memoryview(bytes(data))
    n = len(view)
    if n < 8:
        raise ProgramError(f"{name}: flatbuffer of {n} bytes is too short")
    if bytes(view[4:8]) != FILE_IDENTIFIER:
        raise ProgramError(f"{name}: file identifier {bytes(view[4:8])!r}, expected {FILE_IDENTIFIER!r}")
    (root,) = struct.unpack_from("<I", view, 0)
    if not 8 <= root < n:
        raise ProgramError(f"{name}: root table offset {root} is outside the flatbuffer ({n} bytes)")
    dec = _Decoder(_layout())
    dec.start(view, n)
    try:
        return dec.table("VkGraph", root, "vkgraph")
    except ProgramError as exc:
        raise ProgramError(f"{name}: {exc}") from None
    except (struct.error, ValueError, IndexError, KeyError, TypeError, OverflowError) as exc:
        raise ProgramError(f"{name}: malformed flatbuffer ({type(exc).__name__}: {exc})") from None
    finally:
        dec.finish()


def _pad(n: int) -> int:
    return -n % _ALIGN


def serialize_blob(graph: VkGraph, constant_bytes: bytes) -> bytes:
    """Header + flatbuffer + constant bytes, each part padded to 16 bytes (ExecuTorch's layout)."""
    fb = serialize_graph(graph)
    header_len = HEADER_LENGTH + _pad(HEADER_LENGTH)
    fb_len = len(fb) + _pad(len(fb))
    header = (b"\x00" * 4 + MAGIC + struct.pack("<HIIIQ", HEADER_LENGTH, header_len, len(fb), header_len + fb_len,
                                                 len(constant_bytes)))
    return b"".join([header, b"\x00" * _pad(HEADER_LENGTH), fb, b"\x00" * _pad(len(fb)), constant_bytes,
                     b"\x00" * _pad(len(constant_bytes))])


@dataclass
class VulkanBlob:
    graph: VkGraph
    constant_bytes: memoryview  # the data section


def parse_blob(data: bytes | memoryview, name: str = "Vulkan delegate") -> VulkanBlob:
    """Checks the header and parses the flatbuffer; ``ProgramError`` on anything malformed."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    n = len(view)
    if n < HEADER_LENGTH:
        raise ProgramError(f"{name}: {n} bytes is too short for the {HEADER_LENGTH}-byte VH00 header")
    if bytes(view[0:4]) != b"\x00" * 4:
        raise ProgramError(f"{name}: the 4 bytes before the VH00 magic must be zero, got {bytes(view[0:4])!r}")
    if bytes(view[4:8]) != MAGIC:
        raise ProgramError(f"{name}: magic {bytes(view[4:8])!r}, expected {MAGIC!r} (not a Vulkan delegate blob)")
    length, fb_off, fb_size, bytes_off, bytes_size = struct.unpack_from("<HIIIQ", view, 8)
    if length != HEADER_LENGTH:
        raise ProgramError(f"{name}: header length {length}, expected {HEADER_LENGTH}")
    if fb_size <= 0 or fb_off < HEADER_LENGTH or fb_off + fb_size > n:
        raise ProgramError(f"{name}: flatbuffer range [{fb_off}, {fb_off + fb_size}) is outside the blob ({n} bytes)")
    if bytes_off < fb_off + fb_size or bytes_off + bytes_size > n:
        raise ProgramError(f"{name}: constant bytes [{bytes_off}, {bytes_off + bytes_size}) overlap the flatbuffer "
                           f"or exceed the blob ({n} bytes)")
    graph = read_graph(view[fb_off:fb_off + fb_size], f"{name} VkGraph")
    return VulkanBlob(graph, view[bytes_off:bytes_off + bytes_size])
