"""Python dataclasses of the program schema (``program.fbs``): one class per table, fields in vtable order.

Class and field names are exactly the schema's. Scalars are ``int``/``float``/``bool`` (enums are ``IntEnum``),
strings ``str``, byte vectors ``bytes``, other vectors ``list``; a sub-table is ``Optional`` (``None`` = absent).
A few vectors that the format treats as optional (``Chain.stacktrace``, ``ExecutionPlan.non_const_buffer_device``,
``Program.mutable_data_segments``, ``Program.named_data``) are ``Optional[list]``: ``None`` is written as "absent",
``[]`` as an empty vector; every other list is always written. Every field has a default so callers can omit it.

Conventions of programs the ExecuTorch runtime executes (what ExecuTorch's own emitter writes; an emitter must
follow them):

* ``ExecutionPlan.values`` holds every value of the method: tensors, scalars, lists, ``Null``. Everything else
  refers to values by index: ``inputs``/``outputs`` of the plan, instruction arguments, list items.
* ``KernelCall(op_index, args)``: ``operators[op_index]`` is ``Operator(name="aten::add", overload="out")``, i.e.
  the *out variant*. ``args`` lists value indices of **all** arguments of the out-variant schema in order, defaults
  included (``alpha`` as an ``Int``/``Double`` value, absent optionals as a ``Null`` value), then the ``out``
  tensor(s), and finally the returned value(s) again (for ``add.out``: ``[self, other, alpha, out, out]``).
* ``IntList.items`` (and ``TensorList``/``OptionalTensorList.items``) are indices of values, not the integers
  themselves; an ``IntList`` points at ``Int`` values. ``OptionalTensorList`` uses ``-1`` for None.
  ``DoubleList``/``BoolList`` hold their elements directly.
* Tensors: ``dim_order`` is ``list(range(rank))`` for contiguous tensors; 0-d tensors have empty ``sizes``.
  A constant has ``data_buffer_idx >= 1`` and no ``allocation_info``; index 0 of the constant data is reserved
  ("no data"). A memory-planned tensor has ``data_buffer_idx == 0`` and ``AllocationDetails(memory_id >= 1,
  memory_offset_low, memory_offset_high)``: ``memory_id`` indexes ``non_const_buffer_sizes`` (entry 0 is unused,
  so a program with one arena has ``non_const_buffer_sizes == [0, arena_bytes]`` and uses ``memory_id=1``). A
  tensor with neither gets its memory at input time or from a kernel.
* Inputs may be memory planned (the runtime copies the caller's tensor in) or unplanned (the caller's memory
  is used). Outputs are planned tensors.
* ``Program.version`` is 0; the program's constants go to ``Program.constant_buffer`` as
  ``[Buffer(b""), Buffer(data1), ...]`` before serialization; ``serialize_pte`` moves them into the constant
  segment. Delegates reference ``backend_delegate_data`` inline; the serializer may move blobs to segments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Union

import numpy as np

from edgeport.backend import CompileSpec

__all__ = [
    "AllocationDetails", "BackendDelegate", "BackendDelegateDataReference", "BackendDelegateInlineData", "Bool",
    "BoolList", "Buffer", "Chain", "CompileSpec", "ContainerMetadata", "DataLocation", "DataSegment",
    "DelegateCall", "DeviceType", "Double", "DoubleList", "EValue", "ExecutionPlan", "ExtraTensorInfo", "Frame",
    "FrameList", "FreeCall", "Instruction", "InstructionArguments", "Int", "IntList", "JumpFalseCall",
    "KernelCall", "KernelTypes", "MoveCall", "NamedData", "NonConstBufferDevice", "Null", "Operator",
    "OptionalTensorList", "Program", "ScalarType", "String", "SubsegmentOffsets", "Tensor", "TensorDataLocation",
    "TensorList", "TensorShapeDynamism", "TABLES", "element_size", "numpy_dtype", "scalar_type_from_name",
    "scalar_type_from_numpy", "scalar_type_name",
]


# --------------------------------------------------------------------------------------------------- enums


class ScalarType(IntEnum):
    """Element type of a tensor (values are c10::ScalarType's)."""

    BYTE = 0
    CHAR = 1
    SHORT = 2
    INT = 3
    LONG = 4
    HALF = 5
    FLOAT = 6
    DOUBLE = 7
    BOOL = 11
    QINT8 = 12
    QUINT8 = 13
    QINT32 = 14
    BFLOAT16 = 15
    QUINT4X2 = 16
    QUINT2X4 = 17
    BITS16 = 22
    FLOAT8E5M2 = 23
    FLOAT8E4M3FN = 24
    FLOAT8E5M2FNUZ = 25
    FLOAT8E4M3FNUZ = 26
    UINT16 = 27
    UINT32 = 28
    UINT64 = 29


class TensorShapeDynamism(IntEnum):
    STATIC = 0
    DYNAMIC_BOUND = 1
    DYNAMIC_UNBOUND = 2


class TensorDataLocation(IntEnum):
    SEGMENT = 0
    EXTERNAL = 1


class DeviceType(IntEnum):
    CPU = 0
    CUDA = 1


class DataLocation(IntEnum):
    INLINE = 0
    SEGMENT = 1


# --------------------------------------------------------------------------------------------------- tables


@dataclass
class ContainerMetadata:
    encoded_inp_str: str = ""
    encoded_out_str: str = ""


@dataclass
class Null:
    pass


@dataclass
class AllocationDetails:
    memory_id: int = 0
    memory_offset_low: int = 0
    memory_offset_high: int = 0

    @property
    def memory_offset(self) -> int:
        """The full 64-bit byte offset."""
        return self.memory_offset_low | (self.memory_offset_high << 32)

    @classmethod
    def at(cls, memory_id: int, offset: int) -> AllocationDetails:
        """Details for a 64-bit ``offset`` in arena ``memory_id``."""
        return cls(memory_id, offset & 0xFFFFFFFF, offset >> 32)


@dataclass
class ExtraTensorInfo:
    mutable_data_segments_idx: int = 0
    fully_qualified_name: str | None = None
    location: TensorDataLocation = TensorDataLocation.SEGMENT
    device_type: DeviceType = DeviceType.CPU
    device_index: int = 0


@dataclass
class Tensor:
    scalar_type: ScalarType = ScalarType.BYTE
    storage_offset: int = 0
    sizes: list[int] = field(default_factory=list)
    dim_order: list[int] = field(default_factory=list)
    requires_grad: bool = False
    data_buffer_idx: int = 0
    allocation_info: AllocationDetails | None = None
    layout: int = 0
    shape_dynamism: TensorShapeDynamism = TensorShapeDynamism.STATIC
    extra_tensor_info: ExtraTensorInfo | None = None


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
class TensorList:
    items: list[int] = field(default_factory=list)


@dataclass
class OptionalTensorList:
    items: list[int] = field(default_factory=list)


KernelTypes = Union[  # noqa: UP007 - a typing.Union, as callers expect
    Null, Int, Bool, Double, Tensor, String, IntList, DoubleList, BoolList, TensorList, OptionalTensorList]


@dataclass
class EValue:
    val: KernelTypes = field(default_factory=Null)


@dataclass
class Operator:
    name: str = ""
    overload: str = ""


@dataclass
class KernelCall:
    op_index: int = 0
    args: list[int] = field(default_factory=list)


@dataclass
class DelegateCall:
    delegate_index: int = 0
    args: list[int] = field(default_factory=list)


@dataclass
class MoveCall:
    move_from: int = 0
    move_to: int = 0


@dataclass
class JumpFalseCall:
    cond_value_index: int = 0
    destination_instruction: int = 0


@dataclass
class FreeCall:
    value_index: int = 0


InstructionArguments = Union[KernelCall, DelegateCall, MoveCall, JumpFalseCall, FreeCall]  # noqa: UP007


@dataclass
class Instruction:
    instr_args: InstructionArguments


@dataclass
class Frame:
    filename: str = ""
    lineno: int = 0
    name: str = ""
    context: str = ""


@dataclass
class FrameList:
    items: list[Frame] = field(default_factory=list)


@dataclass
class BackendDelegateDataReference:
    location: DataLocation = DataLocation.INLINE
    index: int = 0


@dataclass
class BackendDelegate:
    id: str = ""
    processed: BackendDelegateDataReference | None = field(default_factory=BackendDelegateDataReference)
    compile_specs: list[CompileSpec] = field(default_factory=list)


@dataclass
class Chain:
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    instructions: list[Instruction] = field(default_factory=list)
    stacktrace: list[FrameList] | None = None


@dataclass
class NonConstBufferDevice:
    buffer_idx: int = 0
    device_type: DeviceType = DeviceType.CPU
    device_index: int = 0


@dataclass
class ExecutionPlan:
    name: str = ""
    container_meta_type: ContainerMetadata | None = field(default_factory=ContainerMetadata)
    values: list[EValue] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    chains: list[Chain] = field(default_factory=list)
    operators: list[Operator] = field(default_factory=list)
    delegates: list[BackendDelegate] = field(default_factory=list)
    non_const_buffer_sizes: list[int] = field(default_factory=list)
    non_const_buffer_device: list[NonConstBufferDevice] | None = None


@dataclass
class Buffer:
    storage: bytes = b""


@dataclass
class BackendDelegateInlineData:
    data: bytes = b""


@dataclass
class DataSegment:
    offset: int = 0
    size: int = 0


@dataclass
class SubsegmentOffsets:
    segment_index: int = 0
    offsets: list[int] = field(default_factory=list)


@dataclass
class NamedData:
    key: str = ""
    segment_index: int = 0


@dataclass
class Program:
    version: int = 0
    execution_plan: list[ExecutionPlan] = field(default_factory=list)
    constant_buffer: list[Buffer] = field(default_factory=list)
    backend_delegate_data: list[BackendDelegateInlineData] = field(default_factory=list)
    segments: list[DataSegment] = field(default_factory=list)
    constant_segment: SubsegmentOffsets | None = field(default_factory=SubsegmentOffsets)
    mutable_data_segments: list[SubsegmentOffsets] | None = None
    named_data: list[NamedData] | None = None


#: Table name -> dataclass, for every table of program.fbs.
TABLES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        ContainerMetadata, Null, AllocationDetails, ExtraTensorInfo, Tensor, Int, Bool, Double, String, IntList,
        DoubleList, BoolList, TensorList, OptionalTensorList, EValue, Operator, KernelCall, DelegateCall, MoveCall,
        JumpFalseCall, FreeCall, Instruction, Frame, FrameList, BackendDelegateDataReference, CompileSpec,
        BackendDelegate, Chain, ExecutionPlan, NonConstBufferDevice, Buffer, BackendDelegateInlineData,
        DataSegment, SubsegmentOffsets, NamedData, Program,
    )
}
assert all(dataclasses.is_dataclass(c) for c in TABLES.values())

# ---------------------------------------------------------------------------------------- dtype helpers

# ScalarType -> (torch-style dtype name, element size in bytes, numpy dtype name or None)
_DTYPES: dict[ScalarType, tuple[str, int, str | None]] = {
    ScalarType.BYTE: ("uint8", 1, "uint8"),
    ScalarType.CHAR: ("int8", 1, "int8"),
    ScalarType.SHORT: ("int16", 2, "int16"),
    ScalarType.INT: ("int32", 4, "int32"),
    ScalarType.LONG: ("int64", 8, "int64"),
    ScalarType.HALF: ("float16", 2, "float16"),
    ScalarType.FLOAT: ("float32", 4, "float32"),
    ScalarType.DOUBLE: ("float64", 8, "float64"),
    ScalarType.BOOL: ("bool", 1, "bool"),
    ScalarType.QINT8: ("qint8", 1, None),
    ScalarType.QUINT8: ("quint8", 1, None),
    ScalarType.QINT32: ("qint32", 4, None),
    ScalarType.BFLOAT16: ("bfloat16", 2, None),
    ScalarType.QUINT4X2: ("quint4x2", 1, None),
    ScalarType.QUINT2X4: ("quint2x4", 1, None),
    ScalarType.BITS16: ("bits16", 2, None),
    ScalarType.FLOAT8E5M2: ("float8_e5m2", 1, None),
    ScalarType.FLOAT8E4M3FN: ("float8_e4m3fn", 1, None),
    ScalarType.FLOAT8E5M2FNUZ: ("float8_e5m2fnuz", 1, None),
    ScalarType.FLOAT8E4M3FNUZ: ("float8_e4m3fnuz", 1, None),
    ScalarType.UINT16: ("uint16", 2, "uint16"),
    ScalarType.UINT32: ("uint32", 4, "uint32"),
    ScalarType.UINT64: ("uint64", 8, "uint64"),
}
_BY_NAME: dict[str, ScalarType] = {name: st for st, (name, _, _) in _DTYPES.items()}
# Raw storage of element types numpy has no native dtype for (same width, reinterpretable).
_STORAGE = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}
_SIGNED_STORAGE = {ScalarType.QINT8: "int8", ScalarType.QINT32: "int32"}


def element_size(scalar_type: int) -> int:
    """Bytes per element of ``scalar_type``; raises ``ValueError`` for an unknown value."""
    try:
        return _DTYPES[ScalarType(scalar_type)][1]
    except (ValueError, KeyError):
        raise ValueError(f"unknown ScalarType value {scalar_type!r}") from None


def scalar_type_name(scalar_type: int) -> str:
    """Torch-style dtype name of ``scalar_type`` (``ScalarType.FLOAT`` -> ``"float32"``)."""
    try:
        return _DTYPES[ScalarType(scalar_type)][0]
    except (ValueError, KeyError):
        raise ValueError(f"unknown ScalarType value {scalar_type!r}") from None


def scalar_type_from_name(name: str) -> ScalarType:
    """``ScalarType`` of a torch-style dtype name (``"float32"``, ``"torch.bfloat16"``, ``"bool"``)."""
    key = name.removeprefix("torch.")
    aliases = {"float": "float32", "double": "float64", "half": "float16", "int": "int32", "long": "int64",
               "short": "int16", "bool_": "bool"}
    key = aliases.get(key, key)
    if key not in _BY_NAME:
        raise ValueError(f"no ScalarType for dtype name {name!r}; known: {sorted(_BY_NAME)}")
    return _BY_NAME[key]


def scalar_type_from_numpy(dtype: np.dtype | type | str) -> ScalarType:
    """``ScalarType`` of a numpy dtype (also ``ml_dtypes`` ones such as bfloat16, matched by name)."""
    dt = np.dtype(dtype)
    return scalar_type_from_name(dt.name)


def numpy_dtype(scalar_type: int, *, storage: bool = False) -> np.dtype:
    """numpy dtype (little-endian) for ``scalar_type``.

    Types numpy lacks (bfloat16, float8, quantized, packed) raise ``ValueError`` unless ``storage=True``, which
    returns an integer dtype of the same width to view the raw bytes with.
    """
    try:
        st = ScalarType(scalar_type)
    except ValueError:
        raise ValueError(f"unknown ScalarType value {scalar_type!r}") from None
    name, size, np_name = _DTYPES[st]
    if np_name is None:
        if not storage:
            raise ValueError(f"numpy has no dtype for ScalarType.{st.name} ({name}); pass storage=True for raw bytes")
        np_name = _SIGNED_STORAGE.get(st, _STORAGE[size])
    return np.dtype(np_name).newbyteorder("<")
