"""Reads and checks a TOSA 1.0 flatbuffer before anything else (the reference model, Vela) sees it.

The flatbuffer is walked with the Python reader ``tosa-tools`` generates from its ``tosa.fbs`` (the ``tosa``
package): every table, vector and string is touched, so a truncated or corrupted buffer raises here (as a
:class:`~edgeport.errors.ProgramError` saying what is wrong) instead of reaching native code. On top of that:
the file identifier, TOSA 1.0, one region with one basic block, every operator input/output and graph
input/output naming a tensor of the block, known operator and type codes, shapes that are non-negative and
small enough, and constant data of exactly the size its shape and type need.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

from edgeport.errors import ProgramError

_ELEMENT_BITS = {1: 8, 2: 4, 3: 8, 4: 16, 5: 32, 6: 48, 7: 32, 8: 16, 9: 16, 10: 64, 11: 8, 12: 8, 17: 64}
DTYPE_NAMES = {1: "bool", 2: "int4", 3: "int8", 4: "int16", 5: "int32", 6: "int48", 7: "float32", 8: "float16",
               9: "bfloat16", 10: "shape", 11: "fp8e4m3", 12: "fp8e5m2", 17: "int64"}
MAX_ELEMENTS = 1 << 31


@dataclass(frozen=True)
class TosaTensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: int

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES.get(self.dtype, str(self.dtype))


@dataclass
class TosaGraphInfo:
    """What :func:`read_tosa` found: the version, the graph's inputs and outputs, operator counts, constants."""

    version: tuple[int, int, int, bool]
    inputs: list[TosaTensorInfo]
    outputs: list[TosaTensorInfo]
    op_counts: dict[str, int] = field(default_factory=dict)
    constant_bytes: int = 0
    num_tensors: int = 0


def _op_names() -> dict[int, str]:
    from tosa.Op import Op

    return {v: k for k, v in vars(Op).items() if not k.startswith("_") and isinstance(v, int)}


def read_tosa(data: bytes | memoryview, what: str = "TOSA graph") -> TosaGraphInfo:
    """Parse and check ``data``; raises :class:`ProgramError` on anything malformed."""
    buf = bytes(data)
    if len(buf) < 16:
        raise ProgramError(f"{what}: {len(buf)} bytes, too short for a TOSA flatbuffer")
    if buf[4:8] != b"TOSA":
        raise ProgramError(f"{what}: file identifier {buf[4:8]!r}, expected b'TOSA' (not a TOSA flatbuffer)")
    try:
        return _walk(buf, what)
    except ProgramError:
        raise
    except (IndexError, struct.error, ValueError, TypeError, OverflowError, UnicodeDecodeError,
            MemoryError) as exc:
        raise ProgramError(f"{what}: corrupt flatbuffer ({type(exc).__name__}: {exc})") from None


def _attribute_names() -> dict[int, str]:
    from tosa.Attribute import Attribute

    return {v: k for k, v in vars(Attribute).items() if not k.startswith("_") and isinstance(v, int)}


def _enum_values(module: str, name: str) -> set[int]:
    import importlib

    cls = getattr(importlib.import_module(f"tosa.{module}"), name)
    return {v for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


def _check_attribute(op: Any, op_name: str, where: str, tensors: dict[str, TosaTensorInfo]) -> None:
    """The attribute is the one the operator takes, every field of it reads, and its enums are in range."""
    import importlib

    attr_name = _attribute_names().get(int(op.AttributeType()), "NONE")
    if attr_name.lower() != op_name.replace("_", "").lower() + "attribute":
        raise ProgramError(f"{where}: carries attribute {attr_name}, the operator needs its own attribute table")
    table = op.Attribute()
    if table is None:
        raise ProgramError(f"{where}: attribute table missing")
    cls = getattr(importlib.import_module(f"tosa.{attr_name}"), attr_name)
    attr = cls()
    attr.Init(table.Bytes, table.Pos)
    enums = {"NanMode": ("NanPropagationMode", "NanPropagationMode"), "RoundingMode": ("RoundingMode", "RoundingMode"),
             "AccType": ("DType", "DType"), "Mode": ("ResizeMode", "ResizeMode")}
    for method in dir(cls):
        if method.startswith("_") or method in ("Init", "GetRootAs") or method.startswith("GetRootAs") or \
                method.endswith(("BufferHasIdentifier", "IsNone")) or (method + "Length") in dir(cls):
            continue
        value = getattr(attr, method)()
        if method in enums and int(value) not in _enum_values(*enums[method]):
            raise ProgramError(f"{where}: attribute field {method} = {value} is not a valid value")
    if op_name == "CLAMP" and op.InputsLength() >= 1:
        src = tensors.get(op.Inputs(0).decode("utf-8"))
        size = (_ELEMENT_BITS.get(src.dtype, 8) + 7) // 8 if src else 0
        if attr.MinValLength() != size or attr.MaxValLength() != size:
            raise ProgramError(f"{where}: clamp bounds of {attr.MinValLength()}/{attr.MaxValLength()} bytes for a "
                               f"{size}-byte element type")


def _check_offset(buf: bytes, pos: int, what: str) -> None:
    if not 0 <= pos < len(buf):
        raise ProgramError(f"{what}: offset {pos} lies outside the {len(buf)}-byte buffer")


def _walk(buf: bytes, what: str) -> TosaGraphInfo:
    from tosa.TosaGraph import TosaGraph

    (root,) = struct.unpack_from("<I", buf, 0)
    _check_offset(buf, root, what)
    graph = TosaGraph.GetRootAs(buf, 0)
    v = graph.Version()
    if v is None:
        raise ProgramError(f"{what}: no version table")
    version = (v._Major(), v._Minor(), v._Patch(), bool(v._Draft()))
    if version[:2] != (1, 0):
        raise ProgramError(f"{what}: TOSA {version[0]}.{version[1]}; edgeport-arm runs TOSA 1.0 graphs (re-lower the "
                           "model with this edgeport-arm)")
    if graph.RegionsLength() != 1:
        raise ProgramError(f"{what}: {graph.RegionsLength()} regions; expected one (control flow is not supported)")
    region = graph.Regions(0)
    if region.BlocksLength() != 1:
        raise ProgramError(f"{what}: {region.BlocksLength()} basic blocks; expected one")
    block = region.Blocks(0)
    tensors: dict[str, TosaTensorInfo] = {}
    constant_bytes = 0
    for i in range(block.TensorsLength()):
        t = block.Tensors(i)
        name = (t.Name() or b"").decode("utf-8")
        shape = tuple(int(t.Shape(j)) for j in range(t.ShapeLength()))
        dtype = int(t.Type())
        where = f"{what}: tensor {name!r}"
        if not name or name in tensors:
            raise ProgramError(f"{where}: empty or duplicated tensor name")
        if dtype not in _ELEMENT_BITS:
            raise ProgramError(f"{where}: unknown or unsupported type code {dtype}")
        if any(d < 0 for d in shape) or len(shape) > 8 or math.prod(shape) > MAX_ELEMENTS:
            raise ProgramError(f"{where}: bad shape {shape}")
        n = t.DataLength()
        if n:
            need = math.ceil(math.prod(shape or (1,)) * _ELEMENT_BITS[dtype] / 8)
            if dtype == 10:  # shape constants: int64 per element
                need = 8 * math.prod(shape or (1,))
            if n < need:  # writers may pad (ExecuTorch writes some 1-element int8 constants as 8 bytes)
                raise ProgramError(f"{where}: {n} bytes of constant data, its shape {shape} and type need {need}")
            pos = t._tab.Vector(t._tab.Offset(10)) if hasattr(t, "_tab") else 0
            _check_offset(buf, pos + n - 1, where)
            constant_bytes += n
        tensors[name] = TosaTensorInfo(name, shape, dtype)
    shapes: set[str] = set()
    for i in range(block.ShapesLength()):
        sh = block.Shapes(i)
        name = (sh.Name() or b"").decode("utf-8")
        if not name or name in tensors or name in shapes:
            raise ProgramError(f"{what}: shape {i}: empty or duplicated name {name!r}")
        if sh.Rank() < 0 or sh.DataLength() < 0:
            raise ProgramError(f"{what}: shape {name!r}: bad rank or data")
        shapes.add(name)
    names = _op_names()
    op_counts: dict[str, int] = {}
    for i in range(block.OperatorsLength()):
        op = block.Operators(i)
        code = int(op.Op())
        if code not in names or code == 0:
            raise ProgramError(f"{what}: operator {i} has unknown operator code {code}")
        for kind, count, get in (("input", op.InputsLength(), op.Inputs), ("output", op.OutputsLength(), op.Outputs)):
            for j in range(count):
                ref = get(j).decode("utf-8")
                if ref not in tensors and ref not in shapes:
                    raise ProgramError(f"{what}: operator {i} ({names[code]}) {kind} {ref!r} is not a tensor of the "
                                       "graph")
        _check_attribute(op, names[code], f"{what}: operator {i} ({names[code]})", tensors)
        op_counts[names[code]] = op_counts.get(names[code], 0) + 1

    def io(count: int, get: Any, kind: str) -> list[TosaTensorInfo]:
        out = []
        for j in range(count):
            ref = get(j).decode("utf-8")
            if ref not in tensors:
                raise ProgramError(f"{what}: graph {kind} {ref!r} is not a tensor of the graph")
            out.append(tensors[ref])
        return out

    inputs = io(block.InputsLength(), block.Inputs, "input")
    outputs = io(block.OutputsLength(), block.Outputs, "output")
    if not outputs:
        raise ProgramError(f"{what}: the graph has no outputs")
    return TosaGraphInfo(version, inputs, outputs, op_counts, constant_bytes, len(tensors))
