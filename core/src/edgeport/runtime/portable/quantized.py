"""Quantize/dequantize portable kernels: ExecuTorch's ``quantized_decomposed`` out variants (torch-free).

They run the quantization ops of a pt2e-quantized program (torchao ``convert_pt2e``) that stay outside any
delegate. Results are bit-exact with torch's reference implementation (``torch.ao.quantization.fx._decomposed``),
whose arithmetic they repeat step by step in the same dtypes:

* quantize: ``clamp(round_half_even(x * float32(1 / scale)) + zero_point, quant_min, quant_max)`` in float32
  (per channel: in the dtype torch promotes ``x`` and ``scales`` to), then cast to the quantized dtype;
* dequantize: ``(q.to(out_dtype) - zero_point) * scale`` per tensor, ``(q - zero_points) * scales`` per channel;
* choose_qparams: torch's per-tensor affine ``determine_qparams`` over the input's min and max.

Bad arguments (dtype mismatches, quantization ranges outside the dtype, per-channel parameter counts, zero
scales) raise :class:`~edgeport.errors.RuntimeExecutionError`.
"""

from __future__ import annotations

import numpy as np

from edgeport.errors import RuntimeExecutionError
from edgeport.runtime.portable._common import dtype_arg, kernel, normalize_dim, resize

# quantized dtype -> the range of its values (torch's _DTYPE_TO_QVALUE_BOUNDS; numpy has no float8)
_BOUNDS = {np.dtype(t): (int(np.iinfo(t).min), int(np.iinfo(t).max))
           for t in (np.uint8, np.int8, np.uint16, np.int16, np.int32)}


def _qdtype(code: int, op: str) -> np.dtype:
    try:
        dt = dtype_arg(code)
    except ValueError as exc:
        raise RuntimeExecutionError(f"{op}: {exc}") from None
    if dt is None or dt.newbyteorder("=") not in _BOUNDS:
        raise RuntimeExecutionError(f"{op}: unsupported quantized dtype {dt} (expected one of uint8, int8, uint16, "
                                    "int16, int32)")
    return dt.newbyteorder("=")


def _check_range(quant_min: int, quant_max: int, dt: np.dtype, op: str) -> None:
    lo, hi = _BOUNDS[dt]
    if quant_min < lo or quant_max > hi or quant_min > quant_max:
        raise RuntimeExecutionError(f"{op}: quantization range [{quant_min}, {quant_max}] is not a range of {dt} "
                                    f"values [{lo}, {hi}]")


def _float_input(x: np.ndarray, op: str) -> np.ndarray:
    """torch quantizes float32 (float16 is converted to float32 first)."""
    if x.dtype == np.float16:
        return x.astype(np.float32)
    if x.dtype != np.float32:
        raise RuntimeExecutionError(f"{op}: expected a float32 input, got {x.dtype}")
    return x


def _check_out(out: np.ndarray, dt: np.dtype, shape: tuple[int, ...], op: str) -> np.ndarray:
    if out.dtype.newbyteorder("=") != dt.newbyteorder("="):
        raise RuntimeExecutionError(f"{op}: the out tensor has dtype {out.dtype}, expected {dt}")
    return out if out.shape == shape else resize(out, shape)


def _promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """torch's type promotion of two dimensioned tensors (a float beats any integer, keeping its width)."""
    fa, fb = a.kind == "f", b.kind == "f"
    if fa != fb:
        return a if fa else b
    return np.promote_types(a, b)


def _opmath(dt: np.dtype) -> np.dtype:
    """The dtype torch computes elementwise ops of ``dt`` tensors in (float16 in float32)."""
    return np.dtype(np.float32) if dt == np.float16 else dt


def _scalar_param(t: np.ndarray, name: str, op: str) -> np.ndarray:
    if not isinstance(t, np.ndarray) or t.size != 1:
        raise RuntimeExecutionError(f"{op}: {name} must be a tensor of one element, got shape {np.shape(t)}")
    return t.reshape(-1)[0]


def _quantize(scaled: np.ndarray, zero_point: object, quant_min: int, quant_max: int,
              out: np.ndarray) -> np.ndarray:
    """``out = clamp(rint(scaled) + zero_point, quant_min, quant_max)`` (``scaled`` is a fresh float array,
    ``zero_point`` of its dtype)."""
    with np.errstate(all="ignore"):
        np.rint(scaled, out=scaled)
        t = np.add(scaled, zero_point, dtype=np.result_type(scaled, zero_point))
        np.clip(t, quant_min, quant_max, out=t)
        np.copyto(out, t, casting="unsafe")
    return out


def _out_float_dtype(code: int | None, op: str) -> np.dtype:
    try:
        odt = np.dtype(np.float32) if code is None else dtype_arg(code)
    except ValueError as exc:
        raise RuntimeExecutionError(f"{op}: {exc}") from None
    if odt.kind != "f":
        raise RuntimeExecutionError(f"{op}: out_dtype must be a floating dtype, got {odt}")
    return odt


def _quantize_per_tensor(op: str, x: np.ndarray, scale: float, zero_point: int, quant_min: int, quant_max: int,
                         dtype: int, out: np.ndarray) -> np.ndarray:
    dt = _qdtype(dtype, op)
    x = _float_input(x, op)
    _check_range(quant_min, quant_max, dt, op)
    if scale == 0:
        raise RuntimeExecutionError(f"{op}: scale is zero")
    out = _check_out(out, dt, x.shape, op)
    with np.errstate(all="ignore"):
        scaled = np.multiply(x, np.float32(1.0 / float(scale)))
    return _quantize(scaled, np.float32(int(zero_point)), quant_min, quant_max, out)


@kernel("quantized_decomposed::quantize_per_tensor.out")
def quantize_per_tensor_out(input: np.ndarray, scale: float, zero_point: int, quant_min: int, quant_max: int,
                            dtype: int, out: np.ndarray) -> np.ndarray:
    return _quantize_per_tensor("quantize_per_tensor", input, scale, zero_point, quant_min, quant_max, dtype, out)


@kernel("quantized_decomposed::quantize_per_tensor.Tensor_out")
def quantize_per_tensor_tensor_out(input: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, quant_min: int,
                                   quant_max: int, dtype: int, out: np.ndarray) -> np.ndarray:
    op = "quantize_per_tensor.Tensor"
    s, z = _scalar_param(scale, "scale", op), _scalar_param(zero_point, "zero_point", op)
    return _quantize_per_tensor(op, input, float(s), int(z), quant_min, quant_max, dtype, out)


def _dequantize_per_tensor(op: str, q: np.ndarray, scale: float, zero_point: int, quant_min: int, quant_max: int,
                           dtype: int, out_dtype: int | None, out: np.ndarray) -> np.ndarray:
    dt = _qdtype(dtype, op)
    if q.dtype.newbyteorder("=") != dt:
        raise RuntimeExecutionError(f"{op}: expected an input of dtype {dt}, got {q.dtype}")
    odt = _out_float_dtype(out_dtype, op)
    out = _check_out(out, odt, q.shape, op)
    math = _opmath(odt)
    # torch: (q.to(out_dtype) - zero_point) * scale, each op computed in math and rounded to out_dtype
    t = q.astype(odt)
    t = np.subtract(t, math.type(int(zero_point)), dtype=math).astype(odt, copy=False)
    np.multiply(t, math.type(float(scale)), out=out, dtype=math, casting="unsafe")
    return out


@kernel("quantized_decomposed::dequantize_per_tensor.out")
def dequantize_per_tensor_out(input: np.ndarray, scale: float, zero_point: int, quant_min: int, quant_max: int,
                              dtype: int, out_dtype: int | None, out: np.ndarray) -> np.ndarray:
    return _dequantize_per_tensor("dequantize_per_tensor", input, scale, zero_point, quant_min, quant_max, dtype,
                                  out_dtype, out)


@kernel("quantized_decomposed::dequantize_per_tensor.Tensor_out")
def dequantize_per_tensor_tensor_out(input: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, quant_min: int,
                                     quant_max: int, dtype: int, out_dtype: int | None,
                                     out: np.ndarray) -> np.ndarray:
    op = "dequantize_per_tensor.Tensor"
    s, z = _scalar_param(scale, "scale", op), _scalar_param(zero_point, "zero_point", op)
    return _dequantize_per_tensor(op, input, float(s), int(z), quant_min, quant_max, dtype, out_dtype, out)


def _channel_param(t: np.ndarray, name: str, ndim: int, axis: int, channels: int, op: str) -> np.ndarray:
    """A per-channel parameter reshaped to broadcast along ``axis`` (one value per channel, or one in all)."""
    if not isinstance(t, np.ndarray) or t.ndim > 1 or t.size not in (1, channels):
        raise RuntimeExecutionError(f"{op}: {name} must be a 1-d tensor of {channels} elements (the size of "
                                    f"dimension {axis}), got shape {np.shape(t)}")
    shape = [1] * ndim
    shape[axis] = t.size
    return t.reshape(shape)


def _channel_axis(x: np.ndarray, axis: int, op: str) -> int:
    if x.ndim == 0:
        raise RuntimeExecutionError(f"{op}: per-channel quantization needs a tensor of rank >= 1")
    return normalize_dim(axis, x.ndim)


@kernel("quantized_decomposed::quantize_per_channel.out")
def quantize_per_channel_out(input: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, axis: int,
                             quant_min: int, quant_max: int, dtype: int, out: np.ndarray) -> np.ndarray:
    op = "quantize_per_channel"
    dt = _qdtype(dtype, op)
    x = _float_input(input, op)
    axis = _channel_axis(x, axis, op)
    _check_range(quant_min, quant_max, dt, op)
    s = _channel_param(scales, "scales", x.ndim, axis, x.shape[axis], op)
    zp = _channel_param(zero_points, "zero_points", x.ndim, axis, x.shape[axis], op)
    if s.size != zp.size:
        raise RuntimeExecutionError(f"{op}: {s.size} scales but {zp.size} zero_points")
    if s.dtype.kind != "f":
        s = s.astype(np.float32)  # torch: 1.0 / scales is a float tensor
    if not np.all(s):
        raise RuntimeExecutionError(f"{op}: a scale is zero")
    out = _check_out(out, dt, x.shape, op)
    # torch: clamp(round(x * (1.0 / scales)) + zero_points, ...), each op in torch's promoted dtype
    inv = np.reciprocal(s)
    ct = _promote(x.dtype, inv.dtype)
    with np.errstate(all="ignore"):
        scaled = np.multiply(x.astype(ct, copy=False), inv.astype(ct, copy=False))
    return _quantize(scaled, zp.astype(_promote(ct, zp.dtype)), quant_min, quant_max, out)


@kernel("quantized_decomposed::dequantize_per_channel.out")
def dequantize_per_channel_out(input: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, axis: int,
                               quant_min: int, quant_max: int, dtype: int, out_dtype: int | None,
                               out: np.ndarray) -> np.ndarray:
    op = "dequantize_per_channel"
    dt = _qdtype(dtype, op)
    q = input
    if q.dtype.newbyteorder("=") != dt:
        raise RuntimeExecutionError(f"{op}: expected an input of dtype {dt}, got {q.dtype}")
    axis = _channel_axis(q, axis, op)
    _check_range(quant_min, quant_max, dt, op)
    odt = _out_float_dtype(out_dtype, op)
    s = _channel_param(scales, "scales", q.ndim, axis, q.shape[axis], op)
    out = _check_out(out, odt, q.shape, op)
    # torch: ((q - zero_points) * scales).to(out_dtype), each op in torch's promoted dtype
    if zero_points is not None:
        zp = _channel_param(zero_points, "zero_points", q.ndim, axis, q.shape[axis], op)
        if zp.size != s.size:
            raise RuntimeExecutionError(f"{op}: {s.size} scales but {zp.size} zero_points")
        dt_diff = _promote(q.dtype, zp.dtype)
        with np.errstate(all="ignore"):
            q = np.subtract(q.astype(dt_diff), zp.astype(dt_diff), dtype=dt_diff)
    ct = _promote(q.dtype, s.dtype)
    math = _opmath(ct)
    with np.errstate(all="ignore"):
        res = np.multiply(q.astype(math), s.astype(math), dtype=math)
        if math != ct:
            res = res.astype(ct)
        np.copyto(out, res, casting="unsafe")
    return out


@kernel("quantized_decomposed::choose_qparams.Tensor_out")
def choose_qparams_tensor_out(input: np.ndarray, quant_min: int, quant_max: int, eps: float, dtype: int,
                              scale_out: np.ndarray, zero_point_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """torch's per-tensor affine ``determine_qparams`` over ``input``'s min and max (float32 inputs)."""
    op = "choose_qparams.Tensor"
    _qdtype(dtype, op)
    if input.dtype != np.float32:
        raise RuntimeExecutionError(f"{op}: expected a float32 input, got {input.dtype}")
    if not quant_min <= 0 <= quant_max or quant_min >= quant_max:
        raise RuntimeExecutionError(f"{op}: quantization range [{quant_min}, {quant_max}] must include 0 and be "
                                    "non-empty")
    if input.size == 0:
        raise RuntimeExecutionError(f"{op}: cannot choose quantization parameters of an empty tensor")
    f32 = np.float32
    with np.errstate(all="ignore"):
        min_neg = np.minimum(input.min(), f32(0))
        max_pos = np.maximum(input.max(), f32(0))
        scale = np.divide(max_pos - min_neg, f32(float(quant_max - quant_min)), dtype=f32)
        scale = np.maximum(scale, f32(eps))
        zp = np.int32(quant_min) - np.rint(np.divide(min_neg, scale, dtype=f32)).astype(np.int32)
        zp = np.clip(zp, quant_min, quant_max)
    scale_out = scale_out if scale_out.shape == (1,) else resize(scale_out, (1,))
    zero_point_out = zero_point_out if zero_point_out.shape == (1,) else resize(zero_point_out, (1,))
    scale_out[0] = np.float64(scale)
    zero_point_out[0] = int(zp)
    return scale_out, zero_point_out
