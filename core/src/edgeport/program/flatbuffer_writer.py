"""Write a :class:`~edgeport.program.schema.Program` as flatbuffer bytes (file identifier ``ET12``).

One packing function per table is generated from :mod:`edgeport.program.layout` and cached. Scalar vectors go
through one ``struct.pack`` call; byte vectors are copied into the builder in one slice assignment, aligned to
their ``force_align`` (which callers may raise for constant tensors and delegate blobs). Errors carry the path
of the offending field (``execution_plan[0].values[3].val.sizes``) and are raised as ``SerializationError``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import flatbuffers

from edgeport.errors import SerializationError
from edgeport.program import schema
from edgeport.program.layout import SCALARS, Field, Layout, layout

__all__ = ["DEFAULT_ALIGNMENT", "program_to_flatbuffer", "is_power_of_two"]

#: force_align of Buffer.storage and BackendDelegateInlineData.data in program.fbs.
DEFAULT_ALIGNMENT = 16

_Packer = Callable[[flatbuffers.Builder, Any], int]


def is_power_of_two(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0 and value & (value - 1) == 0


def _as_bytes(data: Any) -> memoryview:
    view = memoryview(data)
    if not view.c_contiguous:
        raise TypeError("byte data must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _write_raw_vector(b: flatbuffers.Builder, payload: Any, elem_size: int, count: int, align: int) -> int:
    b.StartVector(elem_size, count, align)
    n = len(payload)
    b.head = b.head - n
    b.Bytes[b.head:b.head + n] = payload
    return b.EndVector()


class _Writer:
    """Packers for one (tensor alignment, delegate alignment) pair."""

    def __init__(self, lay: Layout, tensor_alignment: int, delegate_alignment: int) -> None:
        self.lay = lay
        self.align_override = {("Buffer", "storage"): tensor_alignment,
                               ("BackendDelegateInlineData", "data"): delegate_alignment}
        self.packers: dict[str, _Packer] = {}
        for name in lay.tables:
            self.packers[name] = self._make_packer(name)

    # ------------------------------------------------------------------ per-field value creators
    def _creator(self, table: str, f: Field) -> Callable[[flatbuffers.Builder, Any], int]:
        """Function creating the out-of-line object of a reference field; returns its offset (0 = absent)."""
        if f.kind == "string":
            def create_string(b: flatbuffers.Builder, v: Any) -> int:
                return 0 if v is None else b.CreateString(v)
            return create_string
        if f.kind == "bytes":
            align = self.align_override.get((table, f.name), f.force_align) or 1

            def create_bytes(b: flatbuffers.Builder, v: Any) -> int:
                if v is None:
                    return 0
                view = _as_bytes(v)
                return _write_raw_vector(b, view, 1, view.nbytes, align)
            return create_bytes
        if f.kind == "vector" and f.elem == "scalar":
            code, size, _, _ = SCALARS[f.scalar]
            align = max(size, f.force_align)

            def create_scalars(b: flatbuffers.Builder, v: Any) -> int:
                if v is None:
                    return 0
                n = len(v)
                return _write_raw_vector(b, struct.pack(f"<{n}{code}", *v), size, n, align)
            return create_scalars
        if f.kind == "vector" and f.elem == "string":  # pragma: no cover - not used by program.fbs
            def create_strings(b: flatbuffers.Builder, v: Any) -> int:
                if v is None:
                    return 0
                offs = [b.CreateString(s) for s in v]
                return self._offset_vector(b, offs)
            return create_strings
        if f.kind == "vector":
            packers, ref = self.packers, f.ref

            def create_tables(b: flatbuffers.Builder, v: Any) -> int:
                if v is None:
                    return 0
                pack = packers[ref]
                return self._offset_vector(b, [pack(b, item) for item in v])
            return create_tables
        if f.kind == "table":
            packers, ref = self.packers, f.ref

            def create_table(b: flatbuffers.Builder, v: Any) -> int:
                return 0 if v is None else packers[ref](b, v)
            return create_table
        if f.kind == "union":
            packers = self.packers
            members = {self.lay.tables[m].cls: (i + 1, m) for i, m in enumerate(self.lay.unions[f.ref])}

            def create_union(b: flatbuffers.Builder, v: Any) -> int:
                _, member = members[type(v)]
                return packers[member](b, v)
            create_union.members = members  # type: ignore[attr-defined]
            return create_union
        raise AssertionError(f.kind)

    @staticmethod
    def _offset_vector(b: flatbuffers.Builder, offsets: list[int]) -> int:
        b.StartVector(4, len(offsets), 4)
        for off in reversed(offsets):
            b.PrependUOffsetTRelative(off)
        return b.EndVector()

    def _make_packer(self, name: str) -> _Packer:
        table = self.lay.tables[name]
        refs = [(f.name, f.slot, self._creator(name, f)) for f in table.fields if f.kind != "scalar"]
        unions = [(f.name, f.slot - 1, self._creator(name, f).members)  # type: ignore[attr-defined]
                  for f in table.fields if f.kind == "union"]
        # Scalars: biggest first keeps padding inside the table small.
        scalar_fields = sorted((f for f in table.fields if f.kind == "scalar"), key=lambda f: -SCALARS[f.scalar][1])
        scalars = []
        for f in scalar_fields:
            code, size, lo, hi = SCALARS[f.scalar]
            flags = {"?": flatbuffers.number_types.BoolFlags, "f": flatbuffers.number_types.Float32Flags,
                     "d": flatbuffers.number_types.Float64Flags}.get(code)
            if flags is None:
                flags = getattr(flatbuffers.number_types, f"{f.scalar.capitalize()}Flags")
            scalars.append((f.name, f.slot, flags, f.default, code))
        num_slots = table.num_slots

        def pack(b: flatbuffers.Builder, obj: Any) -> int:
            offs = [(slot, create(b, getattr(obj, fname))) for fname, slot, create in refs]
            b.StartObject(num_slots)
            for fname, slot, flags, default, code in scalars:
                v = getattr(obj, fname)
                if v != default:
                    if code == "?":
                        v = bool(v)
                    elif code in "fd":
                        v = float(v)
                    else:
                        v = v.__index__()
                    b.Prepend(flags, v)
                    b.Slot(slot)
            for fname, slot, members in unions:
                b.PrependUint8Slot(slot, members[type(getattr(obj, fname))][0], 0)
            for slot, off in offs:
                if off:
                    b.PrependUOffsetTRelativeSlot(slot, off, 0)
            return b.EndObject()

        return pack


_WRITERS: dict[tuple[int, int], _Writer] = {}


def _writer(tensor_alignment: int, delegate_alignment: int) -> _Writer:
    key = (tensor_alignment, delegate_alignment)
    w = _WRITERS.get(key)
    if w is None:
        w = _WRITERS[key] = _Writer(layout(), tensor_alignment, delegate_alignment)
    return w


def _estimate_size(program: schema.Program) -> int:
    size = 1 << 16
    for buf in program.constant_buffer:
        size += len(buf.storage) + 64
    for blob in program.backend_delegate_data:
        size += len(blob.data) + 64
    for plan in program.execution_plan:
        size += 96 * len(plan.values) + 48 * sum(len(c.instructions) for c in plan.chains)
    return min(size, flatbuffers.Builder.MAX_BUFFER_SIZE)


def program_to_flatbuffer(program: schema.Program, *, tensor_alignment: int = DEFAULT_ALIGNMENT,
                          delegate_alignment: int = DEFAULT_ALIGNMENT) -> bytes:
    """Serialize ``program`` to flatbuffer bytes, without extended header or segments.

    ``tensor_alignment``/``delegate_alignment`` replace the schema's ``force_align`` of ``Buffer.storage`` and
    ``BackendDelegateInlineData.data`` (powers of two).
    """
    for name, value in (("tensor_alignment", tensor_alignment), ("delegate_alignment", delegate_alignment)):
        if not is_power_of_two(value):
            raise SerializationError(f"{name} must be a power of two, got {value!r}")
    if not isinstance(program, schema.Program):
        raise SerializationError(f"expected a Program, got {type(program).__name__}")
    w = _writer(tensor_alignment, delegate_alignment)
    try:
        builder = flatbuffers.Builder(_estimate_size(program))
        root = w.packers["Program"](builder, program)
        builder.Finish(root, file_identifier=layout().file_identifier)
        return bytes(builder.Output())
    except SerializationError:
        raise
    except Exception as exc:  # locate the bad field with a slow, explicit walk
        where = find_invalid_field(program)
        raise SerializationError(f"cannot serialize program: {where or exc}") from exc


# ------------------------------------------------------------------------------------- error location


def find_invalid_field(obj: Any, table: str = "Program", path: str = "program") -> str | None:
    """Return ``"<path>: <problem>"`` for the first field of ``obj`` the writer cannot encode, else ``None``."""
    lay = layout()
    t = lay.tables[table]
    if not isinstance(obj, t.cls):
        return f"{path}: expected {table}, got {type(obj).__name__}"
    for f in t.fields:
        v = getattr(obj, f.name)
        where = f"{path}.{f.name}"
        if f.kind == "scalar":
            problem = _scalar_problem(f.scalar, v)
            if problem:
                return f"{where}: {problem}"
        elif v is None:
            if f.kind == "union":
                return f"{where}: a union member is required, got None"
            continue
        elif f.kind == "string":
            if not isinstance(v, str):
                return f"{where}: expected str, got {type(v).__name__}"
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"{where}: not encodable as UTF-8 ({exc.reason})"
        elif f.kind == "bytes":
            try:
                _as_bytes(v)
            except TypeError as exc:
                return f"{where}: expected bytes, got {type(v).__name__} ({exc})"
        elif f.kind == "vector":
            if not isinstance(v, (list, tuple)):
                return f"{where}: expected a list, got {type(v).__name__}"
            for i, item in enumerate(v):
                if f.elem == "scalar":
                    problem = _scalar_problem(f.scalar, item)
                    if problem:
                        return f"{where}[{i}]: {problem}"
                else:
                    found = find_invalid_field(item, f.ref, f"{where}[{i}]")
                    if found:
                        return found
        elif f.kind == "table":
            found = find_invalid_field(v, f.ref, where)
            if found:
                return found
        elif f.kind == "union":
            members = {lay.tables[m].cls: m for m in lay.unions[f.ref]}
            member = members.get(type(v))
            if member is None:
                return f"{where}: {type(v).__name__} is not a member of union {f.ref} ({', '.join(members.values())})"
            found = find_invalid_field(v, member, where)
            if found:
                return found
    return None


def _scalar_problem(scalar: str, v: Any) -> str | None:
    _, _, lo, hi = SCALARS[scalar]
    if scalar == "bool":
        return None if isinstance(v, (bool, int)) else f"expected bool, got {type(v).__name__}"
    if scalar.startswith("float"):
        return None if isinstance(v, (float, int)) and not isinstance(v, bool) else \
            f"expected float, got {type(v).__name__}"
    if not hasattr(v, "__index__") or isinstance(v, float):
        return f"expected int, got {type(v).__name__}"
    if not lo <= v.__index__() <= hi:
        return f"{v} is out of range for {scalar} [{lo}, {hi}]"
    return None
