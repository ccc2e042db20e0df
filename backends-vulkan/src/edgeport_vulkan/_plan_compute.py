"""Planning of the computing operators of a ``VkGraph`` (elementwise, matrix products, convolution, pooling,
reductions, softmax, normalizations) into shader dispatches; see :mod:`edgeport_vulkan._plan`."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ._launch import contiguous_strides, pad6
from ._plan_context import (
    FLOAT,
    MAX_GROUPS,
    PlanContext,
    check_nargs,
    dispatch_groups,
)
from ._plan_typed import typed_binary
from .schema import (
    IntList,
    Null,
    ValueList,
    VkTensor,
)

# -- elementwise ------------------------------------------------------------------------------------------------
_BINARY = {"aten.add.Tensor": 0, "aten.sub.Tensor": 1, "aten.mul.Tensor": 2, "aten.div.Tensor": 3,
           "aten.add.Scalar": 0, "aten.sub.Scalar": 1, "aten.mul.Scalar": 2, "aten.div.Scalar": 3,
           "aten.maximum.default": 4, "aten.minimum.default": 5}


def _operand(ctx: PlanContext, vid: int) -> int:
    v = ctx.value(vid)
    if isinstance(v, VkTensor):
        ctx.tensor(vid)
        return vid
    return ctx.synthetic(np.array([ctx.num(vid, "scalar operand")], np.float32))


def _is_float(ctx: PlanContext, vid: int) -> bool:
    v = ctx.value(vid)
    if isinstance(v, VkTensor):
        return ctx.typed_dims(vid, v)[1] == FLOAT
    return True  # a number: the float shader takes it as a float operand


def _binary(ctx: PlanContext, args: list[int]) -> None:
    if len(args) >= 3 and not all(_is_float(ctx, v) for v in (args[0], args[1], args[-1])):
        typed_binary(ctx, args)  # an int32 / bool operand or output: the ewise shader
        return
    has_alpha = ctx.op.startswith(("aten.add.", "aten.sub."))
    check_nargs(ctx, args, 3, 4 if has_alpha else 3)
    if has_alpha and len(args) == 4 and not ctx.is_null(args[2]) and ctx.num(args[2], "alpha") != 1:
        raise ctx.fail("alpha != 1 is not supported")
    a, b = _operand(ctx, args[0]), _operand(ctx, args[1])
    da, db = ctx.plan.dims[a], ctx.plan.dims[b]
    if a < 0:
        da = ()
    if b < 0:
        db = ()
    try:
        shape = np.broadcast_shapes(da, db)
    except ValueError:
        raise ctx.fail(f"shapes {list(da)} and {list(db)} do not broadcast") from None
    ctx.out(args[-1], tuple(shape))
    n = math.prod(shape)

    def bstrides(dims: tuple[int, ...]) -> list[int]:
        st = [0] * (len(shape) - len(dims)) + contiguous_strides(dims)
        full = (1,) * (len(shape) - len(dims)) + tuple(dims)
        return [0 if d == 1 else s for d, s in zip(full, st)]

    cshape, (sa, sb) = ctx.coalesce(shape, bstrides(da), bstrides(db))
    ctx.dispatch("binary", [a, b, args[-1]], "19i", [n, *pad6(cshape), *pad6(sa, 0), *pad6(sb, 0)],
                 dispatch_groups(n, 256), (_BINARY[ctx.op], len(cshape)))


_UNARY = {"aten.relu.default": 0, "aten.hardtanh.default": 1, "aten.clamp.default": 1, "aten.sigmoid.default": 2,
          "aten.tanh.default": 3, "aten.hardswish.default": 4, "aten.gelu.default": 5, "aten.neg.default": 7,
          "aten.abs.default": 8, "aten.exp.default": 9, "aten.sqrt.default": 10, "aten.silu.default": 11,
          "aten.leaky_relu.default": 12, "aten.rsqrt.default": 13, "aten.pow.Tensor_Scalar": 14,
          "aten.sin.default": 15, "aten.cos.default": 16}


def _unary(ctx: PlanContext, args: list[int]) -> None:
    name = ctx.op
    code, lo, hi = _UNARY[name], 0.0, 0.0
    if name == "aten.hardtanh.default":
        check_nargs(ctx, args, 2, 4)
        lo = ctx.num(args[1], "min_val") if len(args) > 2 else -1.0
        hi = ctx.num(args[2], "max_val") if len(args) > 3 else 1.0
    elif name == "aten.clamp.default":
        check_nargs(ctx, args, 2, 4)
        lo = -math.inf if len(args) < 3 or ctx.is_null(args[1]) else ctx.num(args[1], "min")
        hi = math.inf if len(args) < 4 or ctx.is_null(args[2]) else ctx.num(args[2], "max")
    elif name == "aten.gelu.default":
        check_nargs(ctx, args, 2, 3)
        approximate = ctx.string(args[1], "approximate") if len(args) == 3 else "none"
        if approximate not in (None, "none", "tanh"):
            raise ctx.fail(f"unknown approximation {approximate!r}")
        code = 6 if approximate == "tanh" else 5
    elif name == "aten.pow.Tensor_Scalar":
        check_nargs(ctx, args, 3)
        lo = hi = ctx.num(args[1], "exponent")
        if math.isinf(lo):
            raise ctx.fail("the exponent must be finite")
    elif name == "aten.leaky_relu.default":
        check_nargs(ctx, args, 2, 3)
        lo = ctx.num(args[1], "negative_slope") if len(args) == 3 else 0.01
        if math.isinf(lo):
            raise ctx.fail("negative_slope must be finite")
    else:
        check_nargs(ctx, args, 2)
    if lo > hi and name not in ("aten.leaky_relu.default", "aten.pow.Tensor_Scalar"):
        raise ctx.fail(f"min {lo} > max {hi}")
    dims = ctx.tensor(args[0])
    ctx.out(args[-1], dims)
    n = math.prod(dims)
    ctx.dispatch("unary", [args[0], args[-1]], "i2f", [n, lo, hi], dispatch_groups(n, 256), (code,))


# -- matmul family ------------------------------------------------------------------------------------------------
def _matmul(ctx: PlanContext, a: int, b: int, bias: int | None, batch: int, m: int, n: int, k: int, sa: int, sb: int,
            trans_b: bool, out: int, out_shape: tuple[int, ...]) -> None:
    ctx.out(out, out_shape)
    if m > MAX_GROUPS * 64 or n > MAX_GROUPS * 64 or batch > MAX_GROUPS:
        raise ctx.fail(f"M={m}, N={n} or batch={batch} too large")
    ctx.dispatch("matmul", [a, b, bias if bias is not None else ctx.dummy(), out], "7i",
                 [m, n, k, sa, sb, int(trans_b), int(bias is not None)], (-(-n // 64), -(-m // 64), batch))


def _bias(ctx: PlanContext, vid: int, n: int) -> int | None:
    if ctx.is_null(vid):
        return None
    dims = ctx.tensor(vid, "bias")
    if math.prod(dims) != n or (dims and dims[-1] != n):
        raise ctx.fail(f"bias of shape {list(dims)} does not match {n} output features")
    return vid


def _linear(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 3, 4)
    x, w = ctx.tensor(args[0]), ctx.tensor(args[1], "weight")
    if len(w) != 2 or not x or x[-1] != w[1]:
        raise ctx.fail(f"input {list(x)} does not match weight {list(w)}")
    n, k = w
    bias = _bias(ctx, args[2], n) if len(args) == 4 else None
    rows = math.prod(x[:-1])
    _matmul(ctx, args[0], args[1], bias, 1, rows, n, k, 0, 0, True, args[-1], (*x[:-1], n))


def _mm(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 3)
    a, b = ctx.tensor(args[0]), ctx.tensor(args[1])
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        raise ctx.fail(f"mm of {list(a)} and {list(b)}")
    _matmul(ctx, args[0], args[1], None, 1, a[0], b[1], a[1], 0, 0, False, args[-1], (a[0], b[1]))


def _addmm(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 4, 6)
    for i, what in ((3, "beta"), (4, "alpha")):
        if len(args) > i + 1 and ctx.num(args[i], what) != 1:
            raise ctx.fail(f"{what} != 1 is not supported")
    a, b = ctx.tensor(args[1]), ctx.tensor(args[2])
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        raise ctx.fail(f"addmm of {list(a)} and {list(b)}")
    bias = _bias(ctx, args[0], b[1])
    _matmul(ctx, args[1], args[2], bias, 1, a[0], b[1], a[1], 0, 0, False, args[-1], (a[0], b[1]))


def _bmm(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 3)
    a, b = ctx.tensor(args[0]), ctx.tensor(args[1])
    if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[2] != b[1]:
        raise ctx.fail(f"bmm of {list(a)} and {list(b)}")
    (batch, m, k), n = a, b[2]
    _matmul(ctx, args[0], args[1], None, batch, m, n, k, m * k, k * n, False, args[-1], (batch, m, n))


# -- convolution and pooling --------------------------------------------------------------------------------------
def _conv(ctx: PlanContext, args: list[int]) -> None:
    clamp = ctx.op == "et_vk.conv_with_clamp.default"
    check_nargs(ctx, args, 12 if clamp else 10)
    x, w = ctx.tensor(args[0]), ctx.tensor(args[1], "weight")
    if len(x) not in (3, 4) or len(w) != 4:
        raise ctx.fail(f"only 2-D convolution: input {list(x)}, weight {list(w)}")
    if ctx.flag(args[6], "transposed"):
        raise ctx.fail("transposed convolution is not supported")
    if any(ctx.ints(args[7], "output_padding")):
        raise ctx.fail("output_padding is not supported")
    n, c, h, wd = (1, *x) if len(x) == 3 else x
    oc, cpg, kh, kw = w
    g = ctx.int_(args[8], "groups")
    sh, sw = ctx.ints(args[3], "stride", 2)
    ph, pw = ctx.ints(args[4], "padding", 2)
    dh, dw = ctx.ints(args[5], "dilation", 2)
    if g < 1 or c % g or oc % g or cpg != c // g or min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ctx.fail(f"input {list(x)}, weight {list(w)}, groups {g}, stride/dilation/padding are inconsistent")
    lo, hi = -math.inf, math.inf
    if clamp:
        lo = -math.inf if ctx.is_null(args[9]) else ctx.num(args[9], "output_min")
        hi = math.inf if ctx.is_null(args[10]) else ctx.num(args[10], "output_max")
    bias = _bias(ctx, args[2], oc)
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise ctx.fail(f"empty output ({oh}x{ow})")
    shape = (n, oc, oh, ow)
    ctx.out(args[-1], shape[1:] if len(x) == 3 else shape)
    total = math.prod(shape)
    ocb = next(bb for bb in (8, 4, 2, 1) if (oc // g) % bb == 0)
    ctx.dispatch("conv2d", [args[0], args[1], bias if bias is not None else ctx.dummy(), args[-1]], "17i2f",
                 [n, c, h, wd, oc, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, g, int(bias is not None), lo, hi],
                 dispatch_groups(total // ocb, 64), (ocb,))


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    num = size + 2 * p - d * (k - 1) - 1
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool(ctx: PlanContext, args: list[int]) -> None:
    is_max = ctx.op.startswith("aten.max_pool2d")
    check_nargs(ctx, args, 7 if is_max else 8)
    x = ctx.tensor(args[0])
    if len(x) not in (3, 4):
        raise ctx.fail(f"input {list(x)} is not 3-D or 4-D")
    n, c, h, w = (1, *x) if len(x) == 3 else x
    kh, kw = ctx.ints(args[1], "kernel_size", 2)
    stride = ctx.value(args[2])
    sh, sw = (kh, kw) if isinstance(stride, Null) or (isinstance(stride, IntList) and not stride.items) \
        else ctx.ints(args[2], "stride", 2)
    ph, pw = ctx.ints(args[3], "padding", 2)
    if is_max:
        dh, dw = ctx.ints(args[4], "dilation", 2)
        ceil_mode, include_pad, div = ctx.flag(args[5], "ceil_mode"), True, 0
    else:
        dh = dw = 1
        ceil_mode = ctx.flag(args[4], "ceil_mode")
        include_pad = ctx.flag(args[5], "count_include_pad")
        div = 0 if ctx.is_null(args[6]) else ctx.int_(args[6], "divisor_override")
        if div < 0:
            raise ctx.fail("divisor_override < 0")
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0 or 2 * ph > dh * (kh - 1) + 1 or 2 * pw > dw * (kw - 1) + 1:
        raise ctx.fail("invalid kernel_size / stride / padding / dilation")
    oh, ow = _pool_out(h, kh, sh, ph, dh, ceil_mode), _pool_out(w, kw, sw, pw, dw, ceil_mode)
    if oh <= 0 or ow <= 0:
        raise ctx.fail(f"empty output ({oh}x{ow})")
    shape = (n, c, oh, ow) if len(x) == 4 else (c, oh, ow)
    out = args[-1]
    if ctx.op == "aten.max_pool2d_with_indices.default":
        outs = ctx.value(out)
        if not isinstance(outs, ValueList) or len(outs.items) != 2:
            raise ctx.fail("output must be a ValueList of (values, indices)")
        out = outs.items[0]
        indices = ctx.tensor_decl(outs.items[1])
        if tuple(indices.dims) != shape:
            raise ctx.fail("indices tensor has the wrong shape")
        ctx.unused.add(outs.items[1])
    ctx.out(out, shape)
    total = n * c * oh * ow
    ctx.dispatch("pool2d", [args[0], out], "15i",
                 [n * c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, int(include_pad), div],
                 dispatch_groups(total, 64), (0 if is_max else 1,))


# -- row reductions -----------------------------------------------------------------------------------------------
def _mean(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 4, 5)
    x = ctx.tensor(args[0])
    if len(args) == 5 and not ctx.is_null(args[3]):
        raise ctx.fail("the dtype argument is not supported")
    dims = list(range(len(x))) if ctx.is_null(args[1]) else ctx.ints(args[1], "dim")
    norm = sorted({ctx.dim(d, len(x)) for d in dims})
    if len(norm) != len(dims) or norm != list(range(len(x) - len(norm), len(x))):
        raise ctx.fail(f"only the trailing dims can be reduced, got {dims} of rank {len(x)}")
    keep = ctx.flag(args[2], "keepdim")
    k = len(norm)
    rows, length = math.prod(x[:len(x) - k]), math.prod(x[len(x) - k:])
    ctx.out(args[-1], tuple(x[:len(x) - k]) + ((1,) * k if keep else ()))
    ctx.dispatch("mean", [args[0], args[-1]], "2i", [rows, length], (min(rows, MAX_GROUPS), 1, 1))


def _softmax(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 4)
    x = ctx.tensor(args[0])
    if ctx.dim(ctx.int_(args[1], "dim"), len(x)) != max(len(x), 1) - 1:
        raise ctx.fail("softmax over a dim other than the last")
    if ctx.flag(args[2], "half_to_float"):
        raise ctx.fail("half_to_float is not supported")
    ctx.out(args[-1], x)
    length = x[-1] if x else 1
    rows = math.prod(x) // length
    log = int(ctx.op == "aten._log_softmax.default")
    ctx.dispatch("softmax", [args[0], args[-1]], "3i", [rows, length, log], (min(rows, MAX_GROUPS), 1, 1))


def _adaptive_avg_pool(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 3)
    x = ctx.tensor(args[0])
    if len(x) not in (3, 4) or ctx.ints(args[1], "output_size", 2) != [1, 1]:
        raise ctx.fail("only output_size 1x1 of a 3-D or 4-D input")
    rows, length = math.prod(x[:-2]), x[-2] * x[-1]
    ctx.out(args[-1], (*x[:-2], 1, 1))
    ctx.dispatch("mean", [args[0], args[-1]], "2i", [rows, length], (min(rows, MAX_GROUPS), 1, 1))


def _layer_norm(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 6)
    x = ctx.tensor(args[0])
    norm = tuple(ctx.ints(args[1], "normalized_shape"))
    if not norm or len(norm) > len(x) or tuple(x[len(x) - len(norm):]) != norm:
        raise ctx.fail(f"normalized_shape {list(norm)} does not end input shape {list(x)}")
    wb = []
    for vid, what in ((args[2], "weight"), (args[3], "bias")):
        if ctx.is_null(vid):
            wb.append(None)
            continue
        if ctx.tensor(vid, what) != norm:
            raise ctx.fail(f"{what} must have shape {list(norm)}")
        wb.append(vid)
    eps = ctx.num(args[4], "eps")
    if not 0 <= eps < math.inf:
        raise ctx.fail(f"eps {eps}")
    outs = ctx.value(args[-1])
    if not isinstance(outs, ValueList) or len(outs.items) != 3:
        raise ctx.fail("output must be a ValueList of (out, mean, rstd)")
    out = outs.items[0]
    ctx.unused.update(outs.items[1:])
    ctx.out(out, x)
    length = math.prod(norm)
    rows = math.prod(x) // length
    ctx.dispatch("layer_norm", [args[0], wb[0] if wb[0] is not None else ctx.dummy(),
                                wb[1] if wb[1] is not None else ctx.dummy(), out], "2if2i",
                 [rows, length, eps, int(wb[0] is not None), int(wb[1] is not None)], (min(rows, MAX_GROUPS), 1, 1))


def _batch_norm(ctx: PlanContext, args: list[int]) -> None:
    """``_native_batch_norm_legit_no_training`` with constant statistics: folded here, at load, into a per-channel
    scale and shift (two elementwise dispatches, the second in place)."""
    check_nargs(ctx, args, 8)
    x = ctx.tensor(args[0])
    if len(x) < 2:
        raise ctx.fail(f"batch norm of a {len(x)}-D input")
    channels = x[1]

    def stat(vid: int, what: str, default: float) -> np.ndarray:
        if ctx.is_null(vid):
            return np.full(channels, default)
        ctx.tensor(vid, what)
        arr = ctx.plan.constants.get(vid)
        if arr is None or arr.size != channels:
            raise ctx.fail(f"{what} must be a constant of {channels} values")
        return arr.astype(np.float64)

    weight, bias = stat(args[1], "weight", 1.0), stat(args[2], "bias", 0.0)
    mean, var = stat(args[3], "running_mean", 0.0), stat(args[4], "running_var", 1.0)
    eps = ctx.num(args[6], "eps")
    if not 0 <= eps < math.inf or np.any(var + eps <= 0):
        raise ctx.fail(f"eps {eps} and running_var give a non-positive variance")
    scale = weight / np.sqrt(var + eps)
    shift = bias - mean * scale
    outs = ctx.value(args[-1])
    if not isinstance(outs, ValueList) or len(outs.items) != 3:
        raise ctx.fail("output must be a ValueList of (out, save_mean, save_invstd)")
    out = outs.items[0]
    ctx.unused.update(outs.items[1:])
    ctx.out(out, x)
    n = math.prod(x)
    per_channel = [0, 1] + [0] * (len(x) - 2)  # the stride of a (C,)-vector broadcast over x
    cshape, (sx, sc) = ctx.coalesce(x, contiguous_strides(x), per_channel)
    for code, operand, src in ((_BINARY["aten.mul.Tensor"], scale, args[0]), (_BINARY["aten.add.Tensor"], shift, out)):
        vid = ctx.synthetic(operand)
        ctx.dispatch("binary", [src, vid, out], "19i", [n, *pad6(cshape), *pad6(sx, 0), *pad6(sc, 0)],
                     dispatch_groups(n, 256), (code, len(cshape)))


def _upsample(ctx: PlanContext, args: list[int]) -> None:
    """``upsample_bilinear2d.vec`` with an output size (torch's source-coordinate rules, either align_corners)."""
    check_nargs(ctx, args, 5)
    x = ctx.tensor(args[0])
    if len(x) != 4:
        raise ctx.fail(f"input {list(x)} is not NCHW")
    if ctx.is_null(args[1]) or not ctx.is_null(args[3]):
        raise ctx.fail("only an output_size (no scale_factors) is supported")
    oh, ow = ctx.ints(args[1], "output_size", 2)
    if oh < 1 or ow < 1:
        raise ctx.fail(f"output size {oh}x{ow}")
    align = ctx.flag(args[2], "align_corners")
    n, c, ih, iw = x

    def scale(i: int, o: int) -> float:
        if align:
            return (i - 1) / (o - 1) if o > 1 else 0.0
        return i / o

    ctx.out(args[-1], (n, c, oh, ow))
    total = n * c * oh * ow
    ctx.dispatch("upsample", [args[0], args[-1]], "6i2f", [total, ih, iw, oh, ow, int(align), scale(ih, oh),
                                                           scale(iw, ow)], dispatch_groups(total, 256))


COMPUTE_HANDLERS: dict[str, Callable[[PlanContext, list[int]], None]] = {
    **{name: _binary for name in _BINARY}, **{name: _unary for name in _UNARY},
    "aten.linear.default": _linear, "aten.mm.default": _mm, "aten.addmm.default": _addmm, "aten.bmm.default": _bmm,
    "aten.convolution.default": _conv, "et_vk.conv_with_clamp.default": _conv,
    "aten.max_pool2d.default": _pool, "aten.max_pool2d_with_indices.default": _pool,
    "aten.avg_pool2d.default": _pool, "aten.mean.dim": _mean, "aten._softmax.default": _softmax,
    "aten._log_softmax.default": _softmax, "aten._adaptive_avg_pool2d.default": _adaptive_avg_pool,
    "aten.native_layer_norm.default": _layer_norm,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm,
    "aten.upsample_bilinear2d.vec": _upsample,
}
