"""Serialize a :class:`~edgeport_xnnpack.schema.graph.Graph` to an ExecuTorch-compatible XNNPACK blob.

Blob layout (all integers little-endian), as ExecuTorch's XNNPACK runtime reads it::

    0   4 bytes   zero
    4   4 bytes   magic b"XH00"
    8   uint16    header length (30)
    10  uint32    flatbuffer offset        (header padded to 16 -> 32)
    14  uint32    flatbuffer size
    18  uint32    constant data offset     (flatbuffer padded to 16)
    22  uint64    constant data size
    ... flatbuffer (identifier "XN01"), zero padding, constant data (each constant 16-byte aligned)

A constant is referenced by ``XNNTensorValue.constant_buffer_idx`` -> ``XNNGraph.constant_data[idx]``, a
``(offset, size)`` pair relative to the constant data region, or a ``named_key`` (offset ``UINT64_MAX``) into
the program's named data. edgeport's preprocess uses named keys only (see ``preprocess/named_constants.py``: the
stock runtime frees the blob after init); offsets remain readable and writable for hand-built blobs.
"""

from __future__ import annotations

import struct

import flatbuffers
import numpy as np

from edgeport_xnnpack.schema.graph import (
    FILE_IDENTIFIER,
    NODE_TYPE,
    ConstantDataOffset,
    Graph,
    PerChannelGroupQuant,
    PerChannelQuant,
    PerTensorQuant,
    PerTokenDynamicQuant,
    TensorValue,
    XNode,
    node_layout,
)

HEADER_MAGIC = b"XH00"
HEADER = struct.Struct("<4s4sHIIIQ")
HEADER_LENGTH = 30
ALIGNMENT = 16


def _align(n: int, a: int = ALIGNMENT) -> int:
    return (n + a - 1) // a * a


def _u32_vector(b: flatbuffers.Builder, values: list[int]) -> int:
    return b.CreateNumpyVector(np.asarray(values, dtype="<u4").reshape(-1))


def _f32_vector(b: flatbuffers.Builder, values: list[float]) -> int:
    return b.CreateNumpyVector(np.asarray(values, dtype="<f4").reshape(-1))


def _tables_vector(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _tensor_value(b: flatbuffers.Builder, v: TensorValue) -> int:
    dims = _u32_vector(b, list(v.dims))
    b.StartObject(8)
    b.PrependInt16Slot(0, v.datatype, 0)
    b.PrependUint32Slot(1, len(v.dims), 0)
    b.PrependUOffsetTRelativeSlot(2, dims, 0)
    b.PrependUint32Slot(3, v.constant_buffer_idx, 0)
    b.PrependUint32Slot(4, v.external_id, 0)
    b.PrependUint32Slot(5, v.flags, 0)
    b.PrependUint32Slot(6, v.id_out, 0)
    b.PrependInt16Slot(7, v.dq_datatype, 0)
    return b.EndObject()


def _quant(b: flatbuffers.Builder,
           q: PerTensorQuant | PerChannelQuant | PerChannelGroupQuant | PerTokenDynamicQuant) -> tuple[int, int]:
    if isinstance(q, PerChannelGroupQuant):  # slot 3 (scale_bf16) is deprecated: never written
        scale = _f32_vector(b, list(q.scale)) if q.scale else 0
        b.StartObject(6)
        if scale:
            b.PrependUOffsetTRelativeSlot(0, scale, 0)
        b.PrependInt32Slot(1, q.channel_dim, 0)
        b.PrependInt32Slot(2, q.group_size, 0)
        b.PrependUint32Slot(4, q.scale_buffer_idx, 0)
        b.PrependUint32Slot(5, q.num_scales, 0)
        return 4, b.EndObject()
    if isinstance(q, PerTokenDynamicQuant):
        b.StartObject(1)
        b.PrependInt32Slot(0, q.num_nonbatch_dims, 0)
        return 3, b.EndObject()
    if isinstance(q, PerTensorQuant):
        b.StartObject(2)
        b.PrependFloat32Slot(0, q.scale, 0.0)
        b.PrependInt32Slot(1, q.zero_point, 0)
        return 2, b.EndObject()
    scale = _f32_vector(b, list(q.scale))
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(0, scale, 0)
    b.PrependInt32Slot(1, q.channel_dim, 0)
    b.PrependUint32Slot(2, q.scale_buffer_idx, 0)
    b.PrependUint32Slot(3, q.num_scales, 0)
    return 1, b.EndObject()


def _value(b: flatbuffers.Builder, v: TensorValue) -> int:
    if v.quant is None:
        kind, off = 1, _tensor_value(b, v)
    else:
        tv = _tensor_value(b, v)
        qkind, qoff = _quant(b, v.quant)
        b.StartObject(3)
        b.PrependUOffsetTRelativeSlot(0, tv, 0)
        b.PrependUint8Slot(1, qkind, 0)
        b.PrependUOffsetTRelativeSlot(2, qoff, 0)
        kind, off = 2, b.EndObject()
    b.StartObject(2)
    b.PrependUint8Slot(0, kind, 0)
    b.PrependUOffsetTRelativeSlot(1, off, 0)
    return b.EndObject()


def _node(b: flatbuffers.Builder, n: XNode) -> int:
    layout = node_layout(n.kind)
    refs = {}
    for name, kind in layout:
        if kind == "[u32]":
            refs[name] = _u32_vector(b, list(n.get(name)))
    b.StartObject(len(layout))
    for slot, (name, kind) in enumerate(layout):
        value = n.get(name)
        if kind == "u32":
            b.PrependUint32Slot(slot, int(value), 0)
        elif kind == "f32":
            b.PrependFloat32Slot(slot, float(value), 0.0)
        else:
            b.PrependUOffsetTRelativeSlot(slot, refs[name], 0)
    body = b.EndObject()
    minmax = 0
    if n.output_min_max is not None:
        b.StartObject(2)
        b.PrependFloat32Slot(0, float(n.output_min_max[0]), 0.0)
        b.PrependFloat32Slot(1, float(n.output_min_max[1]), 0.0)
        minmax = b.EndObject()
    b.StartObject(4)
    b.PrependUint8Slot(0, NODE_TYPE[n.kind], 0)
    b.PrependUOffsetTRelativeSlot(1, body, 0)
    b.PrependUint32Slot(2, n.debug_handle, 0)
    if minmax:
        b.PrependUOffsetTRelativeSlot(3, minmax, 0)
    return b.EndObject()


def _constant(b: flatbuffers.Builder, c: ConstantDataOffset) -> int:
    key = b.CreateString(c.named_key) if c.named_key is not None else 0
    b.StartObject(3)
    b.PrependUint64Slot(0, c.offset, 0)
    b.PrependUint64Slot(1, c.size, 0)
    if key:
        b.PrependUOffsetTRelativeSlot(2, key, 0)
    return b.EndObject()


def graph_to_flatbuffer(g: Graph) -> bytes:
    """The ``XNNGraph`` flatbuffer (identifier ``XN01``)."""
    b = flatbuffers.Builder(4096)
    values = _tables_vector(b, [_value(b, v) for v in g.values])
    nodes = _tables_vector(b, [_node(b, n) for n in g.nodes])
    constants = _tables_vector(b, [_constant(b, c) for c in g.constant_data])
    inputs = _u32_vector(b, g.input_ids)
    outputs = _u32_vector(b, g.output_ids)
    version = b.CreateString(g.version)
    b.StartObject(9)
    b.PrependUOffsetTRelativeSlot(0, version, 0)
    b.PrependUOffsetTRelativeSlot(1, nodes, 0)
    b.PrependUOffsetTRelativeSlot(2, values, 0)
    b.PrependUint32Slot(3, g.num_externs, 0)
    b.PrependUOffsetTRelativeSlot(4, inputs, 0)
    b.PrependUOffsetTRelativeSlot(5, outputs, 0)
    b.PrependUOffsetTRelativeSlot(8, constants, 0)
    b.Finish(b.EndObject(), file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())


def pack_blob(flatbuffer: bytes, constant_data: bytes | bytearray | memoryview) -> bytes:
    """Header + flatbuffer + constant data, each section 16-byte aligned."""
    fb_offset = _align(HEADER_LENGTH)
    const_offset = fb_offset + _align(len(flatbuffer))
    if const_offset > 0xFFFFFFFF:
        raise ValueError("the XNNPACK graph flatbuffer is too large for the blob header")
    header = HEADER.pack(b"\0\0\0\0", HEADER_MAGIC, HEADER_LENGTH, fb_offset, len(flatbuffer), const_offset,
                         len(constant_data))
    return b"".join([
        header, bytes(fb_offset - HEADER_LENGTH),
        flatbuffer, bytes(const_offset - fb_offset - len(flatbuffer)),
        bytes(constant_data),
    ])


def serialize(g: Graph, constant_data: bytes | bytearray | memoryview) -> bytes:
    """The complete blob for ``g`` whose ``constant_data`` offsets point into ``constant_data``."""
    return pack_blob(graph_to_flatbuffer(g), constant_data)
