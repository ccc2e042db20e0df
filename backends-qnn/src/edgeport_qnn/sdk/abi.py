"""Our own ctypes declarations of the public QNN C ABI (QAIRT 2.x, 64-bit Linux).

Written for edgeport from the ABI's public description; no Qualcomm header text is reproduced. Only what
edgeport calls is declared. Every layout here was checked against the running libraries (see the tests).
"""

from __future__ import annotations

import ctypes as C
from enum import IntEnum

ErrorHandle = C.c_uint64  #: every QNN call returns one; the low 16 bits are the error code
Handle = C.c_void_p  #: backend, device, context, graph, log, profile and signal handles
ContextBinarySize = C.c_uint64

SUCCESS = 0
API_MAJOR = 2  #: QNN core API major version these declarations follow

PACKAGE_NAME = b"qti.aisw"  #: Qualcomm's built-in op package


def error_code(handle: int) -> int:
    """The error code of an error handle (its low 16 bits)."""
    return int(handle) & 0xFFFF


class DataType(IntEnum):
    """Tensor and scalar element types (``0xKKBB``: kind, then bit width written in decimal digits)."""

    INT_8 = 0x0008
    INT_16 = 0x0016
    INT_32 = 0x0032
    INT_64 = 0x0064
    UINT_8 = 0x0108
    UINT_16 = 0x0116
    UINT_32 = 0x0132
    UINT_64 = 0x0164
    FLOAT_16 = 0x0216
    FLOAT_32 = 0x0232
    FLOAT_64 = 0x0264
    SFIXED_POINT_8 = 0x0308
    SFIXED_POINT_16 = 0x0316
    SFIXED_POINT_32 = 0x0332
    UFIXED_POINT_8 = 0x0408
    UFIXED_POINT_16 = 0x0416
    UFIXED_POINT_32 = 0x0432
    BOOL_8 = 0x0508
    STRING = 0x0608
    UNDEFINED = 0x7FFFFFFF


class TensorType(IntEnum):
    APP_WRITE = 0  #: graph input
    APP_READ = 1  #: graph output
    APP_READWRITE = 2
    NATIVE = 3  #: intermediate
    STATIC = 4  #: constant, data given at creation
    NULL = 5  #: absent optional input


class TensorMemType(IntEnum):
    RAW = 0
    MEMHANDLE = 1
    UNDEFINED = 0x7FFFFFFF


class Definition(IntEnum):
    IMPL_GENERATED = 0
    DEFINED = 1
    UNDEFINED = 0x7FFFFFFF


class QuantEncoding(IntEnum):
    SCALE_OFFSET = 0  #: real = (q + offset) * scale; note offset = -zero_point
    AXIS_SCALE_OFFSET = 1
    BW_SCALE_OFFSET = 2
    BW_AXIS_SCALE_OFFSET = 3
    UNDEFINED = 0x7FFFFFFF


class ParamType(IntEnum):
    SCALAR = 0
    TENSOR = 1


class LogLevel(IntEnum):
    ERROR = 1
    WARN = 2
    INFO = 3
    VERBOSE = 4
    DEBUG = 5


TENSOR_VERSION_1 = 1
TENSOR_VERSION_2 = 2
OPCONFIG_VERSION_1 = 1
DATA_FORMAT_FLAT_BUFFER = 0
BACKEND_ID_HTP = 6
BACKEND_ID_GPU = 4


# ----------------------------------------------------------------------------------------------- basic types
class Version(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32), ("patch", C.c_uint32)]

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


class ApiVersion(C.Structure):
    _fields_ = [("core", Version), ("backend", Version)]


# ----------------------------------------------------------------------------------------------- quantization
class ScaleOffset(C.Structure):
    _fields_ = [("scale", C.c_float), ("offset", C.c_int32)]


class AxisScaleOffset(C.Structure):
    _fields_ = [("axis", C.c_int32), ("num_scale_offsets", C.c_uint32), ("scale_offset", C.POINTER(ScaleOffset))]


class BwScaleOffset(C.Structure):
    _fields_ = [("bitwidth", C.c_uint32), ("scale", C.c_float), ("offset", C.c_int32)]


class BwAxisScaleOffset(C.Structure):
    _fields_ = [("bitwidth", C.c_uint32), ("axis", C.c_int32), ("num_elements", C.c_uint32),
                ("scales", C.POINTER(C.c_float)), ("offsets", C.POINTER(C.c_int32))]


class _QuantUnion(C.Union):
    # The two trailing members (block encodings) are pointer-sized or two pointers: never larger than these.
    _fields_ = [("scale_offset", ScaleOffset), ("axis_scale_offset", AxisScaleOffset),
                ("bw_scale_offset", BwScaleOffset), ("bw_axis_scale_offset", BwAxisScaleOffset),
                ("_block", C.c_void_p * 2)]


class QuantizeParams(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("definition", C.c_uint32), ("encoding", C.c_uint32), ("u", _QuantUnion)]


# ----------------------------------------------------------------------------------------------- tensors
class ClientBuffer(C.Structure):
    _fields_ = [("data", C.c_void_p), ("data_size", C.c_uint32)]


class _MemUnion(C.Union):
    _fields_ = [("client_buf", ClientBuffer), ("mem_handle", C.c_void_p)]


class TensorV1(C.Structure):
    _anonymous_ = ("mem",)
    _fields_ = [
        ("id", C.c_uint32),
        ("name", C.c_char_p),
        ("type", C.c_uint32),
        ("data_format", C.c_uint32),
        ("data_type", C.c_uint32),
        ("quantize_params", QuantizeParams),
        ("rank", C.c_uint32),
        ("dimensions", C.POINTER(C.c_uint32)),
        ("mem_type", C.c_uint32),
        ("mem", _MemUnion),
    ]


class SparseParams(C.Structure):
    _fields_ = [("layout", C.c_uint32), ("num_specified_elements", C.c_uint32), ("num_sparse_dimensions", C.c_uint32)]


class TensorV2(C.Structure):
    """Version 2: version 1's fields in the same places, then three more."""

    _anonymous_ = ("mem",)
    _fields_ = TensorV1._fields_ + [
        ("is_dynamic_dimensions", C.POINTER(C.c_uint8)),
        ("sparse_params", SparseParams),
        ("is_produced", C.c_uint8),
    ]


class _TensorUnion(C.Union):
    _fields_ = [("v1", TensorV1), ("v2", TensorV2)]


class Tensor(C.Structure):
    """A versioned tensor description; arrays of these are passed to graphExecute and in op configs."""

    _anonymous_ = ("u",)
    _fields_ = [("version", C.c_uint32), ("u", _TensorUnion)]


# ----------------------------------------------------------------------------------------------- ops
class _ScalarUnion(C.Union):
    _fields_ = [("f32", C.c_float), ("f64", C.c_double), ("u64", C.c_uint64), ("i64", C.c_int64),
                ("u32", C.c_uint32), ("i32", C.c_int32), ("u16", C.c_uint16), ("i16", C.c_int16),
                ("u8", C.c_uint8), ("i8", C.c_int8), ("string", C.c_char_p)]


class Scalar(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("data_type", C.c_uint32), ("u", _ScalarUnion)]


class _ParamUnion(C.Union):
    _fields_ = [("scalar", Scalar), ("tensor", Tensor)]


class Param(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("param_type", C.c_uint32), ("name", C.c_char_p), ("u", _ParamUnion)]


class OpConfigV1(C.Structure):
    _fields_ = [
        ("name", C.c_char_p),
        ("package_name", C.c_char_p),
        ("type_name", C.c_char_p),
        ("num_params", C.c_uint32),
        ("params", C.POINTER(Param)),
        ("num_inputs", C.c_uint32),
        ("inputs", C.POINTER(Tensor)),
        ("num_outputs", C.c_uint32),
        ("outputs", C.POINTER(Tensor)),
    ]


class OpConfig(C.Structure):
    """Passed BY VALUE. The ABI wraps ``v1`` in a one-member union; a plain field has the same layout and keeps
    unions out of a by-value ctypes argument."""

    _fields_ = [("version", C.c_uint32), ("v1", OpConfigV1)]
