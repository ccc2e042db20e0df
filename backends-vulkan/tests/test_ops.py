"""Every op of ``run_op`` against numpy / torch.nn.functional, on small (odd, broadcasting) shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from edgeport_vulkan import OPS, run_op

pytestmark = pytest.mark.usefixtures("device")
RNG = np.random.default_rng(0)


def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape) * scale, dtype=np.float32)


def close(got: np.ndarray, want, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    assert got.dtype == np.float32 and got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


T = torch.from_numpy


@pytest.mark.parametrize("op,ref", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                                    ("div", np.divide), ("maximum", np.maximum), ("minimum", np.minimum)])
@pytest.mark.parametrize("sa,sb", [((7,), (7,)), ((3, 1, 5), (4, 1)), ((2, 3, 4, 5), (5,)), ((1,), (2, 3)),
                                   ((), (3, 3)), ((2, 1, 3, 1, 2), (1, 4, 1, 5, 1))])
def test_binary_broadcast(op, ref, sa, sb):
    a, b = rand(*sa), rand(*sb)
    if op == "div":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    close(run_op(op, [a, b]), ref(a, b))


def test_pow():
    a, b = np.abs(rand(3, 4)) + 0.1, rand(4)
    close(run_op("pow", [a, b]), np.power(a, b), rtol=1e-5, atol=1e-5)


UNARY = {
    "relu": (F.relu, {}), "relu6": (F.relu6, {}), "sigmoid": (torch.sigmoid, {}), "tanh": (torch.tanh, {}),
    "hardswish": (F.hardswish, {}), "gelu": (F.gelu, {}), "silu": (F.silu, {}), "neg": (torch.neg, {}),
    "abs": (torch.abs, {}), "exp": (torch.exp, {}),
    "hardtanh": (lambda t: F.hardtanh(t, -0.5, 2.0), {"min_val": -0.5, "max_val": 2.0}),
    "clamp": (lambda t: torch.clamp(t, -1.0, 0.25), {"min": -1.0, "max": 0.25}),
    "leaky_relu": (lambda t: F.leaky_relu(t, 0.2), {"negative_slope": 0.2}),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name):
    fn, attrs = UNARY[name]
    x = rand(3, 37, scale=4.0)
    x[0, :6] = [0.0, -3.0, 3.0, 40.0, -40.0, 100.0] if name != "exp" else 0.0
    close(run_op(name, [x], **attrs), fn(T(x)), rtol=1e-5, atol=2e-6 if name != "exp" else 1e-4)


def test_gelu_tanh_and_sqrt():
    x = rand(1001, scale=3.0)
    close(run_op("gelu", [x], approximate="tanh"), F.gelu(T(x), approximate="tanh"))
    close(run_op("sqrt", [np.abs(x)]), np.sqrt(np.abs(x)))


@pytest.mark.parametrize("sa,sb", [((5, 7), (7, 3)), ((2, 17, 33), (2, 33, 19)), ((3, 2, 4, 16), (16, 9)),
                                   ((7,), (7, 5)), ((4, 7), (7,)), ((2, 1, 3, 5), (4, 5, 2))])
def test_matmul(sa, sb):
    a, b = rand(*sa), rand(*sb)
    close(run_op("matmul", [a, b]), np.matmul(a, b), atol=1e-4)


def test_bmm_and_linear():
    a, b = rand(3, 20, 31), rand(3, 31, 18)
    close(run_op("bmm", [a, b]), torch.bmm(T(a), T(b)), atol=1e-4)
    x, w, bias = rand(2, 5, 33), rand(17, 33), rand(17)
    close(run_op("linear", [x, w, bias]), F.linear(T(x), T(w), T(bias)), atol=1e-4)
    close(run_op("linear", [x, w]), F.linear(T(x), T(w)), atol=1e-4)


@pytest.mark.parametrize("n,c,h,w,oc,k,stride,padding,dilation,groups,bias", [
    (1, 3, 9, 11, 5, 3, 1, 1, 1, 1, True),
    (2, 4, 10, 7, 6, 3, 2, 0, 1, 2, False),
    (1, 6, 8, 8, 6, 3, 1, 2, 2, 6, True),      # depthwise, dilated
    (1, 3, 7, 9, 4, (1, 3), (2, 1), (0, 1), 1, 1, True),
    (1, 2, 5, 5, 3, 1, 1, 0, 1, 1, True),      # pointwise
    (2, 4, 6, 7, 16, 3, 1, 1, 1, 1, True),     # 8 output channels per invocation
    (1, 4, 6, 6, 4, 3, 2, 1, 1, 2, True),      # 2 per invocation (grouped)
    (1, 8, 7, 5, 24, (3, 2), 1, (1, 0), (2, 1), 4, False),
])
def test_conv2d(n, c, h, w, oc, k, stride, padding, dilation, groups, bias):
    kh, kw = (k, k) if isinstance(k, int) else k
    x, wt = rand(n, c, h, w), rand(oc, c // groups, kh, kw)
    b = rand(oc) if bias else None
    got = run_op("conv2d", [x, wt] + ([b] if bias else []), stride=stride, padding=padding, dilation=dilation,
                 groups=groups)
    want = F.conv2d(T(x), T(wt), T(b) if bias else None, stride, padding, dilation, groups)
    close(got, want, atol=1e-4)


def test_conv2d_fused_clamp_and_unbatched():
    x, wt, b = rand(3, 6, 6), rand(4, 3, 3, 3), rand(4)
    got = run_op("conv2d", [x, wt, b], padding=1, output_min=0.0, output_max=6.0)
    close(got, F.relu6(F.conv2d(T(x), T(wt), T(b), padding=1)), atol=1e-4)


@pytest.mark.parametrize("k,s,p,d,ceil", [(2, 2, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 1, 1, True),
                                          ((2, 3), (1, 2), (1, 1), 2, True)])
def test_max_pool2d(k, s, p, d, ceil):
    x = rand(2, 3, 9, 10)
    got = run_op("max_pool2d", [x], kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)
    close(got, F.max_pool2d(T(x), k, s, p, d, ceil_mode=ceil))


@pytest.mark.parametrize("k,s,p,ceil,cip,div", [(2, 2, 0, False, True, None), (3, 2, 1, False, True, None),
                                                (3, 2, 1, True, False, None), (3, 1, 1, False, True, 4),
                                                ((3, 2), (2, 3), (1, 1), True, True, None)])
def test_avg_pool2d(k, s, p, ceil, cip, div):
    x = rand(1, 2, 9, 11)
    got = run_op("avg_pool2d", [x], kernel_size=k, stride=s, padding=p, ceil_mode=ceil, count_include_pad=cip,
                 divisor_override=div)
    close(got, F.avg_pool2d(T(x), k, s, p, ceil, cip, div), atol=1e-5)


def test_mean_and_global_average():
    x = rand(2, 3, 5, 301)
    close(run_op("mean", [x]), x.mean(-1), rtol=1e-4, atol=1e-4)
    close(run_op("mean", [x], dim=(-2, -1), keepdim=True), x.mean((-2, -1), keepdims=True), rtol=1e-4, atol=1e-4)
    close(run_op("global_avg_pool2d", [x]), F.adaptive_avg_pool2d(T(x), 1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 1), (4, 7), (3, 5, 129), (2, 1000)])
def test_softmax(shape):
    x = rand(*shape, scale=5.0)
    close(run_op("softmax", [x]), F.softmax(T(x), -1), rtol=1e-4, atol=1e-6)
    close(run_op("log_softmax", [x], dim=len(shape) - 1), F.log_softmax(T(x), -1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,affine", [((4, 7), True), ((2, 3, 257), True), ((5, 33), False)])
def test_layer_norm(shape, affine):
    x, w, b = rand(*shape, scale=3.0) + 2.0, rand(shape[-1]), rand(shape[-1])
    got = run_op("layer_norm", [x, w, b] if affine else [x], eps=1e-5)
    want = F.layer_norm(T(x), shape[-1:], T(w) if affine else None, T(b) if affine else None, 1e-5)
    close(got, want, rtol=1e-4, atol=1e-4)
    close(run_op("layer_norm", [x, None, b], normalized_shape=shape[-1:]),
          F.layer_norm(T(x), shape[-1:], None, T(b)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,dims", [((3, 5), (1, 0)), ((2, 3, 4), (2, 0, 1)), ((2, 3, 4, 5), (0, 2, 3, 1)),
                                        ((2, 1, 3, 5), (3, 1, 0, 2))])
def test_permute(shape, dims):
    x = rand(*shape)
    close(run_op("permute", [x], dims=dims), np.transpose(x, dims))


def test_cat_slice_pad():
    a, b, c = rand(2, 3, 5), rand(2, 1, 5), rand(2, 4, 5)
    close(run_op("cat", [a, b, c], dim=1), np.concatenate([a, b, c], 1))
    close(run_op("cat", [a, a], dim=-1), np.concatenate([a, a], -1))
    close(run_op("cat", [a, np.zeros((2, 0, 5), np.float32)], dim=1), a)
    x = rand(4, 9, 6)
    close(run_op("slice", [x], dim=1, start=1, end=8, step=3), x[:, 1:8:3])
    close(run_op("slice", [x], dim=-1, start=-4), x[..., -4:])
    close(run_op("slice", [x], dim=0, start=3, end=1), x[3:1])
    close(run_op("pad", [x], pad=(1, 2)), F.pad(T(x), (1, 2)))
    close(run_op("pad", [x], pad=(0, 1, 2, 0, 1, 1), value=-3.5), F.pad(T(x), (0, 1, 2, 0, 1, 1), value=-3.5))


def test_empty_tensors():
    assert run_op("add", [np.zeros((0, 3), np.float32), np.ones(3, np.float32)]).shape == (0, 3)
    assert run_op("relu", [np.zeros((2, 0), np.float32)]).shape == (2, 0)
    close(run_op("linear", [np.zeros((2, 0), np.float32), np.zeros((3, 0), np.float32), np.ones(3, np.float32)]),
          np.ones((2, 3), np.float32))


BAD = [
    ("add", [np.zeros(3), np.zeros(3, np.float32)], {}, "float32"),
    ("add", [np.zeros((3, 4), np.float32).T, np.zeros(3, np.float32)], {}, "C-contiguous"),
    ("add", [np.zeros(3, np.float32), np.zeros(4, np.float32)], {}, "broadcast"),
    ("add", [[1.0, 2.0], np.zeros(2, np.float32)], {}, "numpy.ndarray"),
    ("add", [np.zeros((1,) * 7, np.float32), np.zeros(1, np.float32)], {}, "dims"),
    ("relu", [np.zeros(3, np.float32)], {"bogus": 1}, "bogus"),
    ("relu", [], {}, "inputs"),
    ("nope", [], {}, "unknown op"),
    ("clamp", [np.zeros(3, np.float32)], {"min": 2.0, "max": 1.0}, "min"),
    ("clamp", [np.zeros(3, np.float32)], {"min": float("nan")}, "NaN"),
    ("gelu", [np.zeros(3, np.float32)], {"approximate": "erf"}, "approximate"),
    ("matmul", [np.zeros((2, 3), np.float32), np.zeros((4, 2), np.float32)], {}, "inner"),
    ("bmm", [np.zeros((2, 3, 4), np.float32), np.zeros((3, 4, 2), np.float32)], {}, "incompatible"),
    ("linear", [np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float32), np.zeros(5, np.float32)], {}, "bias"),
    ("conv2d", [np.zeros((1, 3, 5, 5), np.float32), np.zeros((4, 2, 3, 3), np.float32)], {}, "inconsistent"),
    ("conv2d", [np.zeros((1, 4, 5, 5), np.float32), np.zeros((4, 2, 3, 3), np.float32)], {"groups": 3},
     "inconsistent"),
    ("conv2d", [np.zeros((1, 3, 2, 2), np.float32), np.zeros((4, 3, 3, 3), np.float32)], {}, "empty"),
    ("conv2d", [np.zeros((1, 3, 5, 5), np.float32), np.zeros((4, 3, 3, 3), np.float32)], {"stride": 0}, "stride"),
    ("conv2d", [np.zeros((1, 3, 5, 5), np.float32), np.zeros((4, 3, 3, 3), np.float32)], {"padding": -1},
     "padding"),
    ("conv2d", [np.zeros((1, 3, 5, 5), np.float32), np.zeros((4, 3, 3, 3), np.float32)], {"stride": True},
     "stride"),
    ("conv2d", [np.zeros((3, 5, 5), np.float32).reshape(1, 1, 3, 5, 5), np.zeros((4, 3, 3, 3), np.float32)], {},
     "dims"),
    ("max_pool2d", [np.zeros((1, 1, 4, 4), np.float32)], {"kernel_size": 2, "padding": 2}, "half"),
    ("avg_pool2d", [np.zeros((1, 1, 4, 4), np.float32)], {"kernel_size": 2, "divisor_override": 0}, "divisor"),
    ("mean", [np.zeros((2, 3), np.float32)], {"dim": 0}, "last dim"),
    ("mean", [np.zeros((2, 0), np.float32)], {}, "empty"),
    ("softmax", [np.zeros((2, 3), np.float32)], {"dim": 0}, "last dim"),
    ("softmax", [np.zeros((2, 3), np.float32)], {"dim": 5}, "dim"),
    ("layer_norm", [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)], {}, "weight"),
    ("layer_norm", [np.zeros((2, 3), np.float32)], {"normalized_shape": (2,)}, "normalized_shape"),
    ("permute", [np.zeros((2, 3), np.float32)], {"dims": (0, 0)}, "permutation"),
    ("permute", [np.zeros((2, 3), np.float32)], {"dims": (0,)}, "dims"),
    ("cat", [np.zeros((2, 3), np.float32), np.zeros((3, 3), np.float32)], {"dim": 1}, "does not match"),
    ("cat", [], {}, "inputs"),
    ("slice", [np.zeros((2, 3), np.float32)], {"dim": 1, "step": 0}, "step"),
    ("pad", [np.zeros((2, 3), np.float32)], {"pad": (1,)}, "even"),
    ("pad", [np.zeros((2, 3), np.float32)], {"pad": (1, -1)}, "pad"),
    ("pad", [np.zeros((2, 3), np.float32)], {"pad": (1, 1), "mode": "reflect"}, "constant"),
]


@pytest.mark.parametrize("name,inputs,attrs,match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_raise_value_error(name, inputs, attrs, match):
    with pytest.raises(ValueError, match=match):
        run_op(name, inputs, **attrs)


def test_oversized_input_rejected(device):
    n = device.info.max_storage_buffer_range // 4 + 1
    big = np.broadcast_to(np.float32(0), (n,))  # no memory: a 0-stride view, rejected as non-contiguous first
    with pytest.raises(ValueError):
        run_op("relu", [big])
    shape = (n // 1024 + 1, 1024)
    with pytest.raises(ValueError, match="maxStorageBufferRange"):
        run_op("add", [np.zeros((shape[0], 1), np.float32), np.zeros((1, 1024), np.float32)])


def test_ops_registry():
    assert {"add", "conv2d", "linear", "matmul", "bmm", "max_pool2d", "avg_pool2d", "mean", "softmax",
            "layer_norm", "permute", "cat", "slice", "pad", "gelu", "hardswish"} <= set(OPS)


def test_many_rows_beyond_one_grid_dimension():
    x = rand(70000, 3)
    close(run_op("mean", [x]), x.mean(-1), rtol=1e-4, atol=1e-5)
    close(run_op("softmax", [x]), F.softmax(T(x), -1), rtol=1e-4, atol=1e-6)


def test_linear_1d_input_and_big_batch_matmul():
    x, w, b = rand(33), rand(5, 33), rand(5)
    close(run_op("linear", [x, w, b]), F.linear(T(x), T(w), T(b)), atol=1e-4)
    a, bb = rand(70, 3, 2), rand(2, 4)
    close(run_op("matmul", [a, bb]), a @ bb, atol=1e-5)


def test_no_buffer_leaks(device):
    before = len(device._buffers)
    run_op("pad", [rand(2, 3)], pad=(1, 1))
    run_op("cat", [rand(2, 3), rand(2, 3)], dim=0)
    with pytest.raises(ValueError):
        run_op("conv2d", [rand(1, 3, 5, 5), rand(4, 3, 3, 3)], stride=0)
    assert len(device._buffers) == before


FP16_CASES = {
    "add": ([(3, 1, 5), (4, 1)], {}, lambda a, b: a + b),
    "gelu": ([(4, 33)], {}, lambda x: F.gelu(T(x))),
    "hardswish": ([(4, 33)], {}, lambda x: F.hardswish(T(x))),
    "matmul": ([(2, 17, 33), (2, 33, 19)], {}, lambda a, b: a @ b),
    "linear": ([(5, 33), (7, 33), (7,)], {}, lambda x, w, b: F.linear(T(x), T(w), T(b))),
    "conv2d": ([(1, 4, 9, 9), (6, 2, 3, 3), (6,)], {"padding": 1, "groups": 2},
               lambda x, w, b: F.conv2d(T(x), T(w), T(b), padding=1, groups=2)),
    "max_pool2d": ([(1, 3, 9, 9)], {"kernel_size": 3, "stride": 2, "padding": 1},
                   lambda x: F.max_pool2d(T(x), 3, 2, 1)),
    "avg_pool2d": ([(1, 3, 9, 9)], {"kernel_size": 3, "stride": 2, "ceil_mode": True},
                   lambda x: F.avg_pool2d(T(x), 3, 2, ceil_mode=True)),
    "mean": ([(3, 130)], {}, lambda x: x.mean(-1)),
    "softmax": ([(3, 130)], {}, lambda x: F.softmax(T(x), -1)),
    "layer_norm": ([(3, 130), (130,), (130,)], {}, lambda x, w, b: F.layer_norm(T(x), (130,), T(w), T(b))),
    "permute": ([(2, 3, 5)], {"dims": (2, 0, 1)}, lambda x: np.transpose(x, (2, 0, 1))),
    "cat": ([(2, 3), (2, 5)], {"dim": 1}, lambda a, b: np.concatenate([a, b], 1)),
    "pad": ([(2, 3)], {"pad": (1, 2), "value": 0.5}, lambda x: F.pad(T(x), (1, 2), value=0.5)),
}


@pytest.mark.parametrize("name", sorted(FP16_CASES))
def test_force_fp16(device, name):
    if not device.info.fp16_storage:
        pytest.skip(f"{device.info.name} has no 16-bit storage buffers")
    shapes, attrs, ref = FP16_CASES[name]
    xs = [rand(*s).astype(np.float16).astype(np.float32) for s in shapes]  # exactly representable in fp16
    got = run_op(name, xs, force_fp16=True, **attrs)
    want = ref(*xs)
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    # only the stored result is rounded to fp16 (2**-11 relative); arithmetic is fp32
    close(got, want.astype(np.float16).astype(np.float32), rtol=2e-3, atol=2e-3)


def test_force_fp16_must_be_bool():
    with pytest.raises(ValueError, match="force_fp16"):
        run_op("relu", [rand(3)], force_fp16=1)
