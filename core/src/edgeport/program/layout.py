"""The wire layout of every table, read from our own ``program.fbs``/``scalar_type.fbs``.

The writer and the reader are both driven by this one description, so the schema text is the single source of
truth for slots, types, defaults and alignments; ``schema.py`` supplies the Python classes and is checked against
it here (same tables, same field names in the same order).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache
from importlib import resources
from typing import Any

from edgeport.program import schema

__all__ = ["FILE_IDENTIFIER", "SCALARS", "Field", "Layout", "Table", "build_layout", "layout", "parse_fbs",
           "read_schema_text"]

FILE_IDENTIFIER = b"ET12"

# canonical scalar name -> (struct code, size, min, max); bool and floats have no range.
SCALARS: dict[str, tuple[str, int, Any, Any]] = {
    "bool": ("?", 1, None, None),
    "int8": ("b", 1, -(1 << 7), (1 << 7) - 1),
    "uint8": ("B", 1, 0, (1 << 8) - 1),
    "int16": ("h", 2, -(1 << 15), (1 << 15) - 1),
    "uint16": ("H", 2, 0, (1 << 16) - 1),
    "int32": ("i", 4, -(1 << 31), (1 << 31) - 1),
    "uint32": ("I", 4, 0, (1 << 32) - 1),
    "int64": ("q", 8, -(1 << 63), (1 << 63) - 1),
    "uint64": ("Q", 8, 0, (1 << 64) - 1),
    "float32": ("f", 4, None, None),
    "float64": ("d", 8, None, None),
}
_ALIASES = {"byte": "int8", "ubyte": "uint8", "short": "int16", "ushort": "uint16", "int": "int32",
            "uint": "uint32", "long": "int64", "ulong": "uint64", "float": "float32", "double": "float64"}


@dataclass(frozen=True)
class Field:
    """One field of a table.

    ``kind`` is ``"scalar"``, ``"string"``, ``"table"``, ``"union"``, ``"vector"`` or ``"bytes"`` (a ``[ubyte]``
    held as ``bytes`` in Python). ``slot`` is the vtable slot of the field's value; a union's type byte sits in
    ``slot - 1``. For scalars and scalar vectors ``scalar`` names the element type; ``ref`` is the referenced
    table, union or enum name (vectors: element table). ``optional`` fields read back as ``None`` when absent.
    """

    name: str
    slot: int
    kind: str
    scalar: str | None = None
    ref: str | None = None
    elem: str | None = None  # vectors: "scalar" | "table" | "string"
    default: Any = 0
    force_align: int = 0
    optional: bool = False


@dataclass(frozen=True)
class Table:
    name: str
    cls: type
    fields: tuple[Field, ...]
    num_slots: int


@dataclass(frozen=True)
class Layout:
    tables: dict[str, Table]
    unions: dict[str, tuple[str, ...]]  # union name -> member table names (type byte = position + 1)
    enums: dict[str, tuple[str, type[IntEnum]]]  # enum name -> (underlying scalar, IntEnum class)
    file_identifier: bytes
    root: str


_COMMENT = re.compile(r"//[^\n]*")
_BLOCK = re.compile(r"\b(table|struct|enum|union)\s+(\w+)\s*(?::\s*(\w+))?\s*\{([^}]*)\}", re.S)
_FIELD = re.compile(r"(\w+)\s*:\s*(\[?\s*\w+\s*\]?)\s*(?:=\s*([\w.+-]+))?\s*(?:\(([^)]*)\))?\s*;")


def parse_fbs(text: str) -> dict[str, Any]:
    """Parse the subset of the flatbuffers schema language program.fbs uses into plain dicts."""
    text = _COMMENT.sub("", text)
    out: dict[str, Any] = {"tables": {}, "enums": {}, "unions": {}, "file_identifier": None, "root": None}
    m = re.search(r'file_identifier\s+"([^"]*)"\s*;', text)
    if m:
        out["file_identifier"] = m.group(1).encode()
    m = re.search(r"root_type\s+(\w+)\s*;", text)
    if m:
        out["root"] = m.group(1)
    for kind, name, underlying, body in _BLOCK.findall(text):
        if kind == "table":
            fields = []
            for fname, ftype, default, attrs in _FIELD.findall(body):
                align = re.search(r"force_align\s*:\s*(\d+)", attrs or "")
                fields.append((fname, ftype.replace(" ", ""), default or None, int(align.group(1)) if align else 0))
            out["tables"][name] = fields
        elif kind == "enum":
            members, value = {}, -1
            for item in filter(None, (s.strip() for s in body.split(","))):
                key, _, val = (p.strip() for p in item.partition("="))
                value = int(val, 0) if val else value + 1
                members[key] = value
            out["enums"][name] = (_ALIASES.get(underlying, underlying), members)
        elif kind == "union":
            out["unions"][name] = tuple(filter(None, (s.strip() for s in body.split(","))))
        else:  # pragma: no cover - program.fbs has no structs
            raise ValueError(f"structs are not supported ({name})")
    return out


def _build(parsed: dict[str, Any], classes: dict[str, type] | None = None, enum_ns: Any = None) -> Layout:
    """The layout of a parsed schema; ``classes`` maps its table names to dataclasses (default: program.fbs's
    ``schema.TABLES``) and ``enum_ns`` holds its IntEnum classes by name (default: ``schema``)."""
    classes = schema.TABLES if classes is None else classes
    enum_ns = schema if enum_ns is None else enum_ns
    enums: dict[str, tuple[str, type[IntEnum]]] = {}
    for name, (underlying, members) in parsed["enums"].items():
        cls = getattr(enum_ns, name)
        if {m.name: int(m) for m in cls} != members:
            raise RuntimeError(f"schema.{name} does not match enum {name} of program.fbs")
        enums[name] = (underlying, cls)
    tables: dict[str, Table] = {}
    for tname, raw_fields in parsed["tables"].items():
        cls = classes.get(tname)
        if cls is None:
            raise RuntimeError(f"no dataclass for table {tname} of program.fbs")
        py_fields = dataclasses.fields(cls)
        hints = typing.get_type_hints(cls)
        if [f.name for f in py_fields] != [f[0] for f in raw_fields]:
            raise RuntimeError(f"{tname}: dataclass fields {[f.name for f in py_fields]} != fbs fields")
        fields, slot = [], 0
        for (fname, ftype, default, align), pyf in zip(raw_fields, py_fields, strict=True):
            hint = hints[pyf.name]
            optional = type(None) in typing.get_args(hint)
            if ftype.startswith("["):
                inner = _ALIASES.get(ftype[1:-1], ftype[1:-1])
                if inner in SCALARS:
                    kind = "bytes" if inner == "uint8" and hint is bytes else "vector"
                    f = Field(fname, slot, kind, scalar=inner, elem="scalar", force_align=align, optional=optional)
                elif inner == "string":
                    f = Field(fname, slot, "vector", elem="string", optional=optional)
                else:
                    f = Field(fname, slot, "vector", ref=inner, elem="table", optional=optional)
            elif ftype == "string":
                f = Field(fname, slot, "string", default=None if optional else "", optional=optional)
            elif ftype in parsed["unions"]:
                slot += 1  # the hidden <name>_type byte takes the slot before the value
                f = Field(fname, slot, "union", ref=ftype)
            elif ftype in enums:
                underlying, ecls = enums[ftype]
                dval = 0 if default is None else (int(default) if default.lstrip("-").isdigit() else ecls[default])
                f = Field(fname, slot, "scalar", scalar=underlying, ref=ftype, default=int(dval))
            elif _ALIASES.get(ftype, ftype) in SCALARS:
                sc = _ALIASES.get(ftype, ftype)
                if sc in ("float32", "float64"):
                    dval: Any = float(default) if default else 0.0
                elif sc == "bool":
                    dval = default == "true"
                else:
                    dval = int(default, 0) if default else 0
                f = Field(fname, slot, "scalar", scalar=sc, default=dval)
            elif ftype in parsed["tables"]:
                f = Field(fname, slot, "table", ref=ftype, optional=True)
            else:
                raise RuntimeError(f"{tname}.{fname}: unknown type {ftype}")
            fields.append(f)
            slot += 1
        tables[tname] = Table(tname, cls, tuple(fields), slot)
    missing = set(classes) - set(tables)
    if missing:
        raise RuntimeError(f"dataclasses without a table in program.fbs: {sorted(missing)}")
    return Layout(tables, dict(parsed["unions"]), enums, parsed["file_identifier"], parsed["root"])


def build_layout(fbs_texts: list[str], classes: dict[str, type], enum_ns: Any) -> Layout:
    """The layout of another schema of the same flatbuffers subset (e.g. the FlatTensor ``.ptd`` schema)."""
    return _build(parse_fbs("\n".join(fbs_texts)), classes, enum_ns)


def read_schema_text(name: str) -> str:
    """The text of one of the ``.fbs`` files shipped in ``edgeport.program``."""
    return _read_fbs(name)


def _read_fbs(name: str) -> str:
    return resources.files("edgeport.program").joinpath(name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def layout() -> Layout:
    """The layout of program.fbs (with scalar_type.fbs), parsed once."""
    merged = parse_fbs(_read_fbs("scalar_type.fbs") + "\n" + _read_fbs("program.fbs"))
    lay = _build(merged)
    if lay.file_identifier != FILE_IDENTIFIER or lay.root != "Program":
        raise RuntimeError("program.fbs must declare file_identifier \"ET12\" and root_type Program")
    return lay
