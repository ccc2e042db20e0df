"""The ``quantized_decomposed`` portable kernels against torch's reference ops, bit for bit.

The oracle is torch's own implementation (``torch.ops.quantized_decomposed.*``, defined in
``torch.ao.quantization.fx._decomposed``) called with the same arguments; our kernels write into out arrays of
the shape and dtype torch returned. Inputs include exact rounding ties, saturation and infinities.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.ao.quantization.fx._decomposed")  # defines torch.ops.quantized_decomposed

from edgeport.errors import RuntimeExecutionError  # noqa: E402
from edgeport.program.schema import scalar_type_from_name  # noqa: E402
from edgeport.runtime.portable import KERNELS  # noqa: E402

Q = torch.ops.quantized_decomposed
g = torch.Generator().manual_seed(0)
RANGES = {torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-32768, 32767),
          torch.uint16: (0, 65535), torch.int32: (-(2 ** 20), 2 ** 20)}


def code(dt: torch.dtype | None) -> int | None:
    return None if dt is None else int(scalar_type_from_name(str(dt)))


def np_(a: object) -> object:
    return a.numpy() if isinstance(a, torch.Tensor) else a


def run(name: str, args: list, expected: torch.Tensor | tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    """Our kernel on ``args`` (torch dtypes become ScalarType codes) into outs shaped like ``expected``."""
    refs = expected if isinstance(expected, tuple) else (expected,)
    outs = [np.empty(tuple(r.shape), r.numpy().dtype) for r in refs]
    np_args = [code(a) if isinstance(a, torch.dtype) else np_(a) for a in args]
    got = KERNELS[f"quantized_decomposed::{name}"](*np_args, *outs)
    got = list(got) if isinstance(got, tuple) else [got]
    for a, r in zip(got, refs):
        assert a.shape == tuple(r.shape) and a.dtype == r.numpy().dtype, (a.shape, a.dtype, r.shape, r.dtype)
        np.testing.assert_array_equal(a, r.numpy())  # bit-exact (NaN == NaN)
    return got


def floats(*shape: int, scale: float, spread: float = 1.5) -> torch.Tensor:
    """Random floats spanning ``spread`` times the int8 range at ``scale``, with exact ties, saturation, inf."""
    x = torch.randn(*shape, generator=g) * (128 * scale * spread / 3)
    flat = x.view(-1)
    n = flat.numel()
    k = torch.randint(-140, 140, (n // 3,), generator=g).float()
    flat[: n // 3] = (k + 0.5) * scale  # ties when scale is a power of two
    flat[n // 3] = float("inf")
    flat[n // 3 + 1] = -float("inf")
    flat[n // 3 + 2] = 1e30
    return x


@pytest.mark.parametrize("dtype", list(RANGES))
@pytest.mark.parametrize("scale,zp", [(0.25, 0), (0.5, 3), (0.0123, -7), (1 / 3, 100), (2.0 ** -10, 1)])
def test_quantize_dequantize_per_tensor(dtype, scale, zp):
    lo, hi = RANGES[dtype]
    zp = min(max(zp, lo), hi)
    x = floats(4, 37, scale=scale)
    q = Q.quantize_per_tensor(x, scale, zp, lo, hi, dtype)
    (ours,) = run("quantize_per_tensor.out", [x, scale, zp, lo, hi, dtype], q)
    assert (ours == lo).any() and (ours == hi).any()  # saturated both ways
    deq = Q.dequantize_per_tensor(q, scale, zp, lo, hi, dtype)
    run("dequantize_per_tensor.out", [q, scale, zp, lo, hi, dtype, None], deq)


def test_round_half_to_even():
    x = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 126.5, 127.5, -128.5])
    q = Q.quantize_per_tensor(x, 1.0, 0, -128, 127, torch.int8)
    assert q.tolist() == [-2, -2, 0, 0, 2, 2, 4, 126, 127, -128]
    run("quantize_per_tensor.out", [x, 1.0, 0, -128, 127, torch.int8], q)


def test_narrow_range_and_float16_input():
    x = floats(64, scale=0.05).half().clamp(-6e4, 6e4)
    q = Q.quantize_per_tensor(x, 0.05, 0, -127, 127, torch.int8)
    run("quantize_per_tensor.out", [x, 0.05, 0, -127, 127, torch.int8], q)


@pytest.mark.parametrize("out_dtype", [None, torch.float16, torch.float64])
def test_dequantize_out_dtype(out_dtype):
    q = torch.randint(-128, 128, (5, 9), generator=g, dtype=torch.int8)
    ref = Q.dequantize_per_tensor(q, 0.0731, -5, -128, 127, torch.int8, out_dtype=out_dtype)
    run("dequantize_per_tensor.out", [q, 0.0731, -5, -128, 127, torch.int8, out_dtype], ref)


@pytest.mark.parametrize("sdtype,zdtype", [(torch.float32, torch.int64), (torch.float64, torch.int32)])
def test_tensor_overloads(sdtype, zdtype):
    scale, zp = torch.tensor([0.0371], dtype=sdtype), torch.tensor([12], dtype=zdtype)
    x = floats(3, 50, scale=0.0371)
    q = Q.quantize_per_tensor.tensor(x, scale, zp, 0, 255, torch.uint8)
    run("quantize_per_tensor.Tensor_out", [x, scale, zp, 0, 255, torch.uint8], q)
    ref = Q.dequantize_per_tensor.tensor(q, scale, zp, 0, 255, torch.uint8)
    run("dequantize_per_tensor.Tensor_out", [q, scale, zp, 0, 255, torch.uint8, None], ref)


@pytest.mark.parametrize("shape,axis", [((8, 3, 3, 3), 0), ((2, 6, 5), 1), ((4, 7), -1), ((5,), 0)])
@pytest.mark.parametrize("sdtype,zdtype", [(torch.float32, torch.int64), (torch.float64, torch.int32),
                                           (torch.float32, torch.float64)])
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
def test_per_channel(shape, axis, sdtype, zdtype, dtype):
    lo, hi = RANGES[dtype]
    c = shape[axis]
    scales = (2.0 ** -torch.randint(2, 8, (c,), generator=g).to(sdtype))  # powers of two: exact ties
    scales[::2] = torch.rand(len(scales[::2]), generator=g, dtype=sdtype) * 0.1 + 0.001
    zps = torch.randint(lo // 4, hi // 4 + 1, (c,), generator=g).to(zdtype)
    x = floats(*shape, scale=float(scales.max()), spread=3.0)
    q = Q.quantize_per_channel(x, scales, zps, axis, lo, hi, dtype)
    run("quantize_per_channel.out", [x, scales, zps, axis, lo, hi, dtype], q)
    for zero_points in (zps, None):
        for out_dtype in (None, torch.float64):
            ref = Q.dequantize_per_channel(q, scales, zero_points, axis, lo, hi, dtype, out_dtype=out_dtype)
            run("dequantize_per_channel.out", [q, scales, zero_points, axis, lo, hi, dtype, out_dtype], ref)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("kind", ["mixed", "positive", "negative", "zeros", "tiny", "wide"])
def test_choose_qparams_then_quantize(dtype, kind):
    lo, hi = RANGES[dtype]
    x = torch.randn(6, 33, generator=g)
    x = {"mixed": x * 3, "positive": x.abs() + 0.5, "negative": -x.abs() - 0.1, "zeros": x * 0,
         "tiny": x * 1e-9, "wide": x * 1e4}[kind]
    eps = torch.finfo(torch.float32).eps
    scale, zp = Q.choose_qparams.tensor(x, lo, hi, eps, dtype)
    run("choose_qparams.Tensor_out", [x, lo, hi, eps, dtype], (scale, zp))
    # the dynamic-quantization chain: choose_qparams -> quantize.tensor -> dequantize.tensor
    q = Q.quantize_per_tensor.tensor(x, scale, zp, lo, hi, dtype)
    run("quantize_per_tensor.Tensor_out", [x, scale, zp, lo, hi, dtype], q)
    run("dequantize_per_tensor.Tensor_out", [q, scale, zp, lo, hi, dtype, None],
        Q.dequantize_per_tensor.tensor(q, scale, zp, lo, hi, dtype))


def test_dynamic_shape_out_is_resized():
    """A planned (upper-bound) out buffer larger than the result is viewed with the result's shape."""
    x = floats(3, 4, scale=0.1)
    out = np.empty((5, 4), np.int8)
    got = KERNELS["quantized_decomposed::quantize_per_tensor.out"](x.numpy(), 0.1, 0, -128, 127, code(torch.int8),
                                                                   out)
    np.testing.assert_array_equal(got, Q.quantize_per_tensor(x, 0.1, 0, -128, 127, torch.int8).numpy())


def _f(*shape):
    return np.zeros(shape, np.float32)


def _i8(*shape):
    return np.zeros(shape, np.int8)


I8, U8, F32 = code(torch.int8), code(torch.uint8), code(torch.float32)
BAD = [
    ("quantize_per_tensor.out", [_f(3), 0.1, 0, -200, 127, I8, _i8(3)], "range"),
    ("quantize_per_tensor.out", [_f(3), 0.1, 0, 10, -10, I8, _i8(3)], "range"),
    ("quantize_per_tensor.out", [_f(3), 0.0, 0, -128, 127, I8, _i8(3)], "scale is zero"),
    ("quantize_per_tensor.out", [_f(3), 0.1, 0, -128, 127, F32, _f(3)], "unsupported quantized dtype"),
    ("quantize_per_tensor.out", [_f(3), 0.1, 0, -128, 127, 999, _i8(3)], "ScalarType"),
    ("quantize_per_tensor.out", [_i8(3), 0.1, 0, -128, 127, I8, _i8(3)], "float32 input"),
    ("quantize_per_tensor.out", [_f(3), 0.1, 0, 0, 255, U8, _i8(3)], "out tensor has dtype"),
    ("quantize_per_tensor.out", [_f(9), 0.1, 0, -128, 127, I8, _i8(3)], "planned buffer"),
    ("quantize_per_tensor.Tensor_out", [_f(3), _f(2), np.zeros(1, np.int64), -128, 127, I8, _i8(3)], "one element"),
    ("dequantize_per_tensor.out", [np.zeros(3, np.uint8), 0.1, 0, -128, 127, I8, None, _f(3)], "dtype int8"),
    ("dequantize_per_tensor.out", [_i8(3), 0.1, 0, -128, 127, I8, I8, _i8(3)], "floating dtype"),
    ("quantize_per_channel.out", [_f(4, 3), np.ones(3, np.float32), np.zeros(3, np.int64), 0, -128, 127, I8,
                                  _i8(4, 3)], "4 elements"),
    ("quantize_per_channel.out", [_f(4, 3), np.ones(4, np.float32), np.zeros(4, np.int64), 2, -128, 127, I8,
                                  _i8(4, 3)], "out of range"),
    ("quantize_per_channel.out", [_f(4), np.zeros(4, np.float32), np.zeros(4, np.int64), 0, -128, 127, I8,
                                  _i8(4)], "scale is zero"),
    ("dequantize_per_channel.out", [_i8(4, 3), np.ones(3, np.float32), np.zeros(2, np.int64), 1, -128, 127, I8,
                                    None, _f(4, 3)], "zero_points"),
    ("dequantize_per_channel.out", [_i8(4, 3), np.ones(3, np.float32), None, 1, -128, 127, U8, None, _f(4, 3)],
     "dtype uint8"),
    ("choose_qparams.Tensor_out", [_f(0), -128, 127, 1e-7, I8, np.zeros(1), np.zeros(1, np.int64)], "empty"),
    ("choose_qparams.Tensor_out", [_f(3), 1, 127, 1e-7, I8, np.zeros(1), np.zeros(1, np.int64)], "include 0"),
]


@pytest.mark.parametrize("name,args,match", BAD, ids=[f"{b[0]}-{b[2]}" for b in BAD])
def test_bad_arguments_raise(name, args, match):
    with pytest.raises(RuntimeExecutionError, match=match):
        KERNELS[f"quantized_decomposed::{name}"](*args)
