"""Read an XNNPACK delegate blob (edgeport's or ExecuTorch's) into a :class:`Graph`, checking every offset.

Torch-free. Any malformation raises :class:`BlobError` (a ``ValueError``) with the position of the problem;
no flatbuffer library accessor is used, so hostile bytes can't raise anything else.
"""

from __future__ import annotations

import struct
from typing import Any

from edgeport_xnnpack.schema.graph import (
    ACCEPTED_IDENTIFIERS,
    NODE_KINDS,
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
from edgeport_xnnpack.schema.writer import HEADER, HEADER_MAGIC

_MAX_ITEMS = 1 << 24


class BlobError(ValueError):
    """The bytes are not a well-formed XNNPACK delegate blob."""


def split_blob(blob: Any) -> tuple[memoryview, memoryview]:
    """``(flatbuffer, constant data)`` views of a blob; a blob without the ``XH00`` header is all flatbuffer."""
    mv = memoryview(blob)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    if len(mv) >= HEADER.size and bytes(mv[4:8]) == HEADER_MAGIC:
        reserved, _, length, fb_off, fb_size, c_off, c_size = HEADER.unpack_from(mv, 0)
        if reserved != b"\0\0\0\0":
            raise BlobError("the 4 reserved bytes before the XH00 magic are not zero (corrupted header)")
        if length < HEADER.size:
            raise BlobError(f"header length {length} is shorter than {HEADER.size}")
        if fb_size < 8 or fb_off > len(mv) or fb_size > len(mv) - fb_off:
            raise BlobError(f"flatbuffer [{fb_off}, +{fb_size}) lies outside the {len(mv)}-byte blob")
        if c_off > len(mv) or c_size > len(mv) - c_off:
            raise BlobError(f"constant data [{c_off}, +{c_size}) lies outside the {len(mv)}-byte blob")
        if c_off < fb_off + fb_size:
            raise BlobError("constant data overlaps the flatbuffer")
        return mv[fb_off:fb_off + fb_size], mv[c_off:c_off + c_size]
    return mv, mv[0:0]


class _Buf:
    def __init__(self, mv: memoryview) -> None:
        self.mv = mv
        self.n = len(mv)

    def scalar(self, fmt: str, pos: int) -> Any:
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > self.n:
            raise BlobError(f"read of {size} bytes at {pos} past the end of the {self.n}-byte flatbuffer")
        return struct.unpack_from("<" + fmt, self.mv, pos)[0]

    def ref(self, pos: int) -> int:
        return pos + self.scalar("I", pos)


class _Table:
    """A table at ``pos``. Like flatbuffers' own verifier, each field is checked against the buffer and its
    alignment; the vtable's table-size entry is ignored (Python flatbuffers < 25.12 writes a too-small one when
    tables of different sizes share a vtable), so is any padding between fields."""

    def __init__(self, buf: _Buf, pos: int, what: str) -> None:
        self.buf, self.pos, self.what = buf, pos, what
        if pos & 3:
            raise BlobError(f"{what}: table at {pos} is not 4-byte aligned")
        vt = pos - buf.scalar("i", pos)
        if vt & 1:
            raise BlobError(f"{what}: vtable at {vt} is not 2-byte aligned")
        self.vt_len = buf.scalar("H", vt)
        if self.vt_len < 4 or self.vt_len % 2 or vt + self.vt_len > buf.n:
            raise BlobError(f"{what}: corrupt vtable at {vt}")
        self.vt = vt

    def _off(self, slot: int, size: int = 1) -> int:
        """Table offset of field ``slot`` (0: absent), checked to hold ``size`` aligned bytes inside the buffer."""
        o = 4 + 2 * slot
        if o >= self.vt_len:
            return 0
        off = self.buf.scalar("H", self.vt + o)
        if off:
            at = self.pos + off
            if off < 4 or at + size > self.buf.n:
                raise BlobError(f"{self.what}: field {slot} at table offset {off} lies outside the flatbuffer "
                                "or overlaps the table's vtable offset")
            if at % size:
                raise BlobError(f"{self.what}: field {slot} at byte {at} is not {size}-byte aligned")
        return off

    def scalar(self, slot: int, fmt: str, default: Any = 0) -> Any:
        off = self._off(slot, struct.calcsize(fmt))
        return self.buf.scalar(fmt, self.pos + off) if off else default

    def present(self, slot: int) -> bool:
        return self._off(slot) != 0

    def table(self, slot: int, what: str) -> _Table | None:
        off = self._off(slot, 4)
        return _Table(self.buf, self.buf.ref(self.pos + off), what) if off else None

    def vector(self, slot: int, elem: int, what: str) -> tuple[int, int] | None:
        off = self._off(slot, 4)
        if not off:
            return None
        start = self.buf.ref(self.pos + off)
        if start & 3:
            raise BlobError(f"{what}: vector length at {start} is not 4-byte aligned")
        count = self.buf.scalar("I", start)
        if count > _MAX_ITEMS or start + 4 + count * elem > self.buf.n:
            raise BlobError(f"{what}: vector of {count} items runs past the end of the flatbuffer")
        return start + 4, count

    def scalars(self, slot: int, fmt: str, what: str) -> list[Any] | None:
        vec = self.vector(slot, struct.calcsize(fmt), what)
        if vec is None:
            return None
        start, count = vec
        return list(struct.unpack_from(f"<{count}{fmt}", self.buf.mv, start))

    def tables(self, slot: int, what: str) -> list[_Table]:
        vec = self.vector(slot, 4, what)
        if vec is None:
            return []
        start, count = vec
        return [_Table(self.buf, self.buf.ref(start + 4 * i), f"{what}[{i}]") for i in range(count)]

    def string(self, slot: int, what: str) -> str | None:
        vec = self.vector(slot, 1, what)
        if vec is None:
            return None
        start, count = vec
        try:
            return bytes(self.buf.mv[start:start + count]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BlobError(f"{what}: not UTF-8") from exc


def _tensor_value(t: _Table, what: str) -> TensorValue:
    dims = t.scalars(2, "I", f"{what}.dims") or []
    return TensorValue(
        datatype=t.scalar(0, "h"), dims=dims, constant_buffer_idx=t.scalar(3, "I"),
        external_id=t.scalar(4, "I"), flags=t.scalar(5, "I"), id_out=t.scalar(6, "I"),
        dq_datatype=t.scalar(7, "h"),
    )


def _value(t: _Table, what: str) -> TensorValue:
    kind = t.scalar(0, "B")
    body = t.table(1, what)
    if body is None or kind not in (1, 2):
        raise BlobError(f"{what}: value union type {kind} is not a tensor value")
    if kind == 1:
        return _tensor_value(body, what)
    inner = body.table(0, f"{what}.tensor_value")
    if inner is None:
        raise BlobError(f"{what}: quantized value without tensor_value")
    value = _tensor_value(inner, what)
    qkind = body.scalar(1, "B")
    q = body.table(2, f"{what}.quant_params")
    if q is not None and qkind == 2:
        value.quant = PerTensorQuant(q.scalar(0, "f", 0.0), q.scalar(1, "i"))
    elif q is not None and qkind == 3:
        value.quant = PerTokenDynamicQuant(q.scalar(0, "i"))
    elif q is not None and qkind == 1:
        value.quant = PerChannelQuant(q.scalars(0, "f", f"{what}.scale") or [], q.scalar(1, "i"),
                                      q.scalar(2, "I"), q.scalar(3, "I"))
    elif q is not None and qkind == 4:
        value.quant = PerChannelGroupQuant(q.scalars(0, "f", f"{what}.scale") or [], q.scalar(1, "i"),
                                           q.scalar(2, "i"), q.scalar(4, "I"), q.scalar(5, "I"))
    else:
        value.quant_kind = qkind or -1
    return value


def _node(t: _Table, what: str) -> XNode:
    kind_index = t.scalar(0, "B")
    if not 1 <= kind_index <= len(NODE_KINDS):
        raise BlobError(f"{what}: unknown node type {kind_index}")
    kind = NODE_KINDS[kind_index - 1][0]
    body = t.table(1, f"{what} ({kind})")
    if body is None:
        raise BlobError(f"{what} ({kind}): missing node table")
    fields: dict[str, Any] = {}
    for slot, (name, fk) in enumerate(node_layout(kind)):
        if fk == "u32":
            fields[name] = body.scalar(slot, "I")
        elif fk == "f32":
            fields[name] = body.scalar(slot, "f", 0.0)
        else:
            fields[name] = body.scalars(slot, "I", f"{what}.{name}")
    mm = t.table(3, f"{what}.output_min_max")
    minmax = None if mm is None else (mm.scalar(0, "f", 0.0), mm.scalar(1, "f", 0.0))
    return XNode(kind, fields, t.scalar(2, "I"), minmax)


def read_graph(flatbuffer: memoryview) -> Graph:
    """Decode the ``XNNGraph`` flatbuffer (identifier ``XN00`` or ``XN01``)."""
    buf = _Buf(flatbuffer)
    if buf.n < 8:
        raise BlobError(f"flatbuffer of {buf.n} bytes is too short")
    ident = bytes(flatbuffer[4:8])
    if ident not in ACCEPTED_IDENTIFIERS:
        raise BlobError(f"file identifier {ident!r} is not an XNNPACK graph (XN00/XN01)")
    root = _Table(buf, buf.ref(0), "XNNGraph")
    g = Graph(constant_data=[])
    g.version = root.string(0, "version") or ""
    g.nodes = [_node(t, f"xnodes[{i}]") for i, t in enumerate(root.tables(1, "xnodes"))]
    g.values = [_value(t, f"xvalues[{i}]") for i, t in enumerate(root.tables(2, "xvalues"))]
    g.num_externs = root.scalar(3, "I")
    g.input_ids = root.scalars(4, "I", "input_ids") or []
    g.output_ids = root.scalars(5, "I", "output_ids") or []
    legacy = root.tables(6, "constant_buffer")
    if legacy:
        g.legacy_buffers = []
        for i, t in enumerate(legacy):
            vec = t.vector(0, 1, f"constant_buffer[{i}].storage")
            g.legacy_buffers.append(flatbuffer[vec[0]:vec[0] + vec[1]] if vec else flatbuffer[0:0])
    for i, t in enumerate(root.tables(8, "constant_data")):
        key = t.string(2, f"constant_data[{i}].named_key") if t.present(2) else None
        g.constant_data.append(ConstantDataOffset(t.scalar(0, "Q"), t.scalar(1, "Q"), key))
    return g


def read_blob(blob: Any) -> tuple[Graph, memoryview]:
    """``(graph, constant data view)`` of a whole delegate blob."""
    fb, constants = split_blob(blob)
    return read_graph(fb), constants
