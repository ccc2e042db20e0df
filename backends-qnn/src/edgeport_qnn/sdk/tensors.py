"""Tensor descriptions (numpy side) and their translation to QNN's C structs (ctypes side)."""

from __future__ import annotations

import ctypes as C
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeport_qnn.sdk import abi
from edgeport_qnn.sdk.abi import DataType

MAX_RANK = 8
MAX_TENSOR_BYTES = 2**32 - 1  # QNN's client buffers carry a 32-bit size

#: numpy dtype -> (QNN type without quantization, QNN type with quantization or None)
_NUMPY_TO_QNN: dict[np.dtype, tuple[DataType, DataType | None]] = {
    np.dtype(np.float32): (DataType.FLOAT_32, None),
    np.dtype(np.float16): (DataType.FLOAT_16, None),
    np.dtype(np.int8): (DataType.INT_8, DataType.SFIXED_POINT_8),
    np.dtype(np.int16): (DataType.INT_16, DataType.SFIXED_POINT_16),
    np.dtype(np.int32): (DataType.INT_32, DataType.SFIXED_POINT_32),
    np.dtype(np.int64): (DataType.INT_64, None),
    np.dtype(np.uint8): (DataType.UINT_8, DataType.UFIXED_POINT_8),
    np.dtype(np.uint16): (DataType.UINT_16, DataType.UFIXED_POINT_16),
    np.dtype(np.uint32): (DataType.UINT_32, DataType.UFIXED_POINT_32),
    np.dtype(np.uint64): (DataType.UINT_64, None),
    np.dtype(np.bool_): (DataType.BOOL_8, None),
}
_QNN_TO_NUMPY: dict[int, np.dtype] = {}
for _np, (_plain, _quant) in _NUMPY_TO_QNN.items():
    _QNN_TO_NUMPY[_plain] = _np
    if _quant is not None:
        _QNN_TO_NUMPY[_quant] = _np


@dataclass(frozen=True)
class QuantParams:
    """Affine quantization, ``real = (q - zero_point) * scale`` (QNN stores ``offset = -zero_point``).

    Per-tensor when ``axis`` is None; per-axis (e.g. per output channel) when ``axis`` is set, with one scale and
    zero point per index along that axis.
    """

    scale: float | tuple[float, ...]
    zero_point: int | tuple[int, ...] = 0
    axis: int | None = None

    def __post_init__(self) -> None:
        # QNN stores float32 scales: keep exactly what QNN will hold, so specs compare equal after a round trip
        rounded = tuple(float(np.float32(s)) for s in np.atleast_1d(np.asarray(self.scale, dtype=np.float64)))
        object.__setattr__(self, "scale", rounded[0] if self.axis is None and len(rounded) == 1 else rounded)
        if self.axis is not None:
            object.__setattr__(self, "zero_point", tuple(int(z) for z in np.atleast_1d(self.zero_point)))
        scales = self.scales
        zero_points = self.zero_points
        if self.axis is None and (len(scales) != 1 or len(zero_points) != 1):
            raise ValueError("per-tensor QuantParams take one scale and one zero point; set axis for per-axis")
        if len(scales) != len(zero_points):
            raise ValueError(f"{len(scales)} scales but {len(zero_points)} zero points")
        for s in scales:
            if not (math.isfinite(s) and s > 0):
                raise ValueError(f"quantization scale must be finite and > 0, got {s}")
        for z in zero_points:
            if not -(2**31) < z < 2**31:
                raise ValueError(f"zero point {z} out of int32 range")

    @property
    def scales(self) -> tuple[float, ...]:
        return tuple(float(s) for s in np.atleast_1d(np.asarray(self.scale, dtype=np.float64)))

    @property
    def zero_points(self) -> tuple[int, ...]:
        return tuple(int(z) for z in np.atleast_1d(np.asarray(self.zero_point, dtype=np.int64)))


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape, element type and optional quantization of a graph tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    quant: QuantParams | None = None

    @property
    def qnn_type(self) -> DataType:
        return qnn_data_type(self.dtype, self.quant is not None)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def qnn_data_type(dtype: Any, quantized: bool) -> DataType:
    """The QNN data type of a numpy dtype (fixed-point when ``quantized``)."""
    entry = _NUMPY_TO_QNN.get(np.dtype(dtype))
    if entry is None:
        raise ValueError(f"dtype {np.dtype(dtype)} has no QNN equivalent; supported: "
                         f"{sorted(str(d) for d in _NUMPY_TO_QNN)}")
    plain, quant = entry
    if quantized:
        if quant is None:
            raise ValueError(f"dtype {np.dtype(dtype)} cannot carry quantization parameters")
        return quant
    return plain


def numpy_dtype(qnn_type: int) -> np.dtype:
    """The numpy dtype holding a QNN data type's elements."""
    try:
        return _QNN_TO_NUMPY[int(qnn_type)]
    except KeyError:
        raise ValueError(f"QNN data type 0x{int(qnn_type):04x} is not supported by edgeport") from None


def make_spec(name: str, shape: Sequence[int], dtype: Any, quant: QuantParams | None) -> TensorSpec:
    """Validate and build a :class:`TensorSpec`."""
    check_name(name, "tensor")
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise ValueError(f"tensor {name!r}: shape must be a sequence of ints, got {shape!r}") from None
    if not 1 <= len(dims) <= MAX_RANK:
        raise ValueError(f"tensor {name!r}: rank must be 1..{MAX_RANK}, got {len(dims)}")
    if any(d <= 0 or d >= 2**32 for d in dims):
        raise ValueError(f"tensor {name!r}: dimensions must be positive 32-bit ints, got {dims}")
    if quant is not None and not isinstance(quant, QuantParams):
        raise ValueError(f"tensor {name!r}: quant must be QuantParams or None")
    spec = TensorSpec(name, dims, np.dtype(dtype), quant)
    spec.qnn_type  # noqa: B018 (validates the dtype/quantization pair)
    if quant is not None and quant.axis is not None:
        if not 0 <= quant.axis < len(dims):
            raise ValueError(f"tensor {name!r}: quantization axis {quant.axis} out of range for rank {len(dims)}")
        if len(quant.scales) != dims[quant.axis]:
            raise ValueError(f"tensor {name!r}: {len(quant.scales)} scales for axis of size {dims[quant.axis]}")
    if spec.nbytes > MAX_TENSOR_BYTES:
        raise ValueError(f"tensor {name!r}: {spec.nbytes} bytes exceeds QNN's 32-bit buffer size")
    return spec


def check_name(name: object, what: str) -> bytes:
    """A QNN name as bytes: a non-empty str, ASCII-printable (QNN hashes and stores names as C strings)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name must be a non-empty str, got {name!r}")
    if not name.isascii() or not name.isprintable():
        raise ValueError(f"{what} name must be printable ASCII, got {name!r}")
    return name.encode()


class Keep:
    """Owns every buffer a ctypes struct points into, for as long as QNN may read it."""

    def __init__(self) -> None:
        self._objects: list[Any] = []

    def __call__(self, obj: Any) -> Any:
        self._objects.append(obj)
        return obj


def fill_quant(params: abi.QuantizeParams, quant: QuantParams | None, keep: Keep) -> None:
    if quant is None:
        params.definition = abi.Definition.UNDEFINED
        params.encoding = abi.QuantEncoding.UNDEFINED
        return
    params.definition = abi.Definition.DEFINED
    if quant.axis is None:
        params.encoding = abi.QuantEncoding.SCALE_OFFSET
        params.scale_offset.scale = quant.scales[0]
        params.scale_offset.offset = -quant.zero_points[0]
        return
    n = len(quant.scales)
    pairs = keep((abi.ScaleOffset * n)(*[abi.ScaleOffset(s, -z) for s, z in zip(quant.scales, quant.zero_points)]))
    params.encoding = abi.QuantEncoding.AXIS_SCALE_OFFSET
    params.axis_scale_offset.axis = quant.axis
    params.axis_scale_offset.num_scale_offsets = n
    params.axis_scale_offset.scale_offset = C.cast(pairs, C.POINTER(abi.ScaleOffset))


def make_tensor(spec: TensorSpec, tensor_type: abi.TensorType, keep: Keep,
                data: np.ndarray | None = None, tensor_id: int = 0) -> abi.Tensor:
    """A version-1 ``Tensor`` struct for ``spec``; every pointer it holds is owned by ``keep``."""
    tensor = abi.Tensor()
    tensor.version = abi.TENSOR_VERSION_1
    t = tensor.v1
    t.id = tensor_id
    t.name = keep(spec.name.encode())
    t.type = tensor_type
    t.data_format = abi.DATA_FORMAT_FLAT_BUFFER
    t.data_type = spec.qnn_type
    fill_quant(t.quantize_params, spec.quant, keep)
    dims = keep((C.c_uint32 * len(spec.shape))(*spec.shape))
    t.rank = len(spec.shape)
    t.dimensions = C.cast(dims, C.POINTER(C.c_uint32))
    t.mem_type = abi.TensorMemType.RAW
    if data is not None:
        keep(data)
        t.client_buf.data = data.ctypes.data
        t.client_buf.data_size = data.nbytes
    return tensor


def spec_from_tensor(tensor: abi.Tensor) -> TensorSpec:
    """Read a tensor description handed out by QNN (version 1 or 2) back into a :class:`TensorSpec`."""
    if tensor.version not in (abi.TENSOR_VERSION_1, abi.TENSOR_VERSION_2):
        raise ValueError(f"unsupported QNN tensor version {tensor.version}")
    t = tensor.v1  # version 2 keeps version 1's fields in the same places
    if not t.name:
        raise ValueError("QNN tensor without a name")
    name = t.name.decode("ascii", errors="replace")
    if not 1 <= t.rank <= MAX_RANK or not t.dimensions:
        raise ValueError(f"tensor {name!r}: unsupported rank {t.rank}")
    shape = tuple(int(t.dimensions[i]) for i in range(t.rank))
    q = t.quantize_params
    quant = None
    if q.definition == abi.Definition.DEFINED and q.encoding == abi.QuantEncoding.SCALE_OFFSET:
        quant = QuantParams(float(q.scale_offset.scale), -int(q.scale_offset.offset))
    elif q.definition == abi.Definition.DEFINED and q.encoding == abi.QuantEncoding.AXIS_SCALE_OFFSET:
        a = q.axis_scale_offset
        if not a.scale_offset or a.num_scale_offsets == 0 or a.num_scale_offsets > 2**20:
            raise ValueError(f"tensor {name!r}: malformed per-axis quantization")
        pairs = [a.scale_offset[i] for i in range(a.num_scale_offsets)]
        quant = QuantParams(tuple(p.scale for p in pairs), tuple(-p.offset for p in pairs), int(a.axis))
    elif q.definition == abi.Definition.DEFINED and q.encoding != abi.QuantEncoding.UNDEFINED:
        raise ValueError(f"tensor {name!r}: quantization encoding {q.encoding} not supported by edgeport")
    dtype = numpy_dtype(t.data_type)
    if quant is None and int(t.data_type) in {int(v[1]) for v in _NUMPY_TO_QNN.values() if v[1] is not None}:
        raise ValueError(f"tensor {name!r}: fixed-point type without quantization parameters")
    return make_spec(name, shape, dtype, quant)


def make_scalar_param(name: str, value: Any, keep: Keep) -> abi.Param:
    """A scalar op parameter: bool -> BOOL_8, int -> UINT_32 (INT_32 if negative), float -> FLOAT_32, a numpy
    scalar keeps its own type."""
    param = abi.Param()
    param.param_type = abi.ParamType.SCALAR
    param.name = keep(check_name(name, "parameter"))
    s = param.scalar
    if isinstance(value, np.generic):
        dtype = value.dtype
    elif isinstance(value, bool):
        dtype = np.dtype(np.bool_)
    elif isinstance(value, int):
        dtype = np.dtype(np.uint32 if value >= 0 else np.int32)
    elif isinstance(value, float):
        dtype = np.dtype(np.float32)
    else:
        raise ValueError(f"parameter {name!r}: unsupported value {value!r} (use bool, int, float, numpy scalar or "
                         "numpy array)")
    qtype = qnn_data_type(dtype, False)
    field = {DataType.BOOL_8: "u8", DataType.FLOAT_32: "f32", DataType.FLOAT_64: "f64", DataType.INT_8: "i8",
             DataType.INT_16: "i16", DataType.INT_32: "i32", DataType.INT_64: "i64", DataType.UINT_8: "u8",
             DataType.UINT_16: "u16", DataType.UINT_32: "u32", DataType.UINT_64: "u64"}.get(qtype)
    if field is None:
        raise ValueError(f"parameter {name!r}: scalar type {dtype} not supported")
    try:
        checked = np.array(value).astype(dtype, casting="safe" if isinstance(value, np.generic) else "unsafe")
        if not isinstance(value, (np.generic, float)) and checked.item() != value:
            raise OverflowError
    except (OverflowError, TypeError, ValueError):
        raise ValueError(f"parameter {name!r}: {value!r} does not fit {dtype}") from None
    s.data_type = qtype
    setattr(s, field, checked.item())
    return param
