"""Pooling: ``max_pool2d`` (with or without indices), ``avg_pool2d``, global average pooling
(``_adaptive_avg_pool2d`` to 1x1, ``mean`` over H and W) as TOSA MAX_POOL2D / AVG_POOL2D in NHWC, and other
``mean`` reductions as REDUCE_SUM scaled by 1/N.

Integer pooling keeps the input's quantization parameters (AVG_POOL2D averages ``x - zp`` and adds ``zp``
back); an integer ``mean`` over other axes sums in int32 (scale ``input_scale / N``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import tosa_serializer as ts

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType, Op
from edgeport_arm.preprocess.lowering import Lowering, static_shape
from edgeport_arm.preprocess.ops._common import (
    arg,
    fit_padding,
    mul,
    nhwc_shape,
    pair,
    scalar,
    zero_point_const,
)
from edgeport_arm.preprocess.values import Value


def _max_pool(ctx: Lowering, node: torch.fx.Node) -> Value:
    x = ctx.nhwc(ctx.settle(ctx.value(node.args[0])))
    kernel = pair(node.args[1])
    stride = pair(arg(node, 2, "stride", None) or kernel)
    ph, pw = pair(arg(node, 3, "padding", 0))
    shape = nhwc_shape(node)
    x, pad = fit_padding(ctx, x, kernel, stride, (1, 1), [ph, ph, pw, pw])
    out = ctx.g.tensor(shape, x.dtype)
    ctx.g.op(Op.MAX_POOL2D, [x.name], [out], "MaxPool2dAttribute", kernel=list(kernel), stride=list(stride),
             pad=pad, nan_mode=ts.NanPropagationMode.PROPAGATE)
    return x.with_(name=out, shape=shape)


def max_pool2d(ctx: Lowering, node: torch.fx.Node) -> Value:
    return _max_pool(ctx, node)


def max_pool2d_with_indices(ctx: Lowering, node: torch.fx.Node) -> tuple[Value, None]:
    return _max_pool(ctx, node), None


def _sum_pool(ctx: Lowering, x: Value, kernel: tuple[int, int], stride: tuple[int, int], shape: tuple[int, ...]
              ) -> Value:
    """Integer average pooling without padding on plain TOSA INT: a DEPTHWISE_CONV2D with all-one weights sums in
    int32 (scale ``input_scale / count``); the quantize after it rounds once, as torch does. On Ethos-U targets
    (int16 extension) AVG_POOL2D + RESCALE is used instead: Vela pools natively, and the depthwise sum measured
    1-8% more NPU cycles (bench/arm.py)."""
    channels = x.shape[3]
    ones = ctx.g.const(np.ones((kernel[0], kernel[1], channels, 1), np.int8), DType.INT8, "ones")
    out = ctx.g.tensor(shape, DType.INT32)
    ctx.g.op(Op.DEPTHWISE_CONV2D, [x.name, ones, ctx.g.const(np.zeros(channels), DType.INT32, "bias"),
                                   zero_point_const(ctx, DType.INT8, x.q.zero_point), zero_point_const(ctx, DType.INT8)],
             [out], "DepthwiseConv2dAttribute", pad=[0, 0, 0, 0], stride=list(stride), dilation=[1, 1],
             local_bound=False, acc_type=DType.INT32)
    return x.with_(name=out, shape=shape, dtype=DType.INT32, q=None, acc_scale=x.q.scale / (kernel[0] * kernel[1]))


def _avg_pool(ctx: Lowering, x: Value, kernel: tuple[int, int], stride: tuple[int, int], pad: list[int],
              shape: tuple[int, ...]) -> Value:
    x = ctx.nhwc(ctx.settle(x))
    if ctx.integer and x.q is not None and not any(pad):
        x, _ = fit_padding(ctx, x, kernel, stride, (1, 1), pad)
        if "int16" not in ctx.spec.extensions:
            return _sum_pool(ctx, x, kernel, stride, shape)
    zp = x.q.zero_point if (ctx.integer and x.q is not None) else 0
    if ctx.integer and x.q is None:
        raise LoweringError("integer average pooling needs a dequantized int8 input")
    x, pad = fit_padding(ctx, x, kernel, stride, (1, 1), pad)
    out = ctx.g.tensor(shape, x.dtype)
    ctx.g.op(Op.AVG_POOL2D, [x.name, zero_point_const(ctx, x.dtype, zp), zero_point_const(ctx, x.dtype, zp)], [out],
             "AvgPool2dAttribute", kernel=list(kernel), stride=list(stride), pad=pad,
             acc_type=DType.INT32 if ctx.integer else DType.FP32)
    return x.with_(name=out, shape=shape)


def avg_pool2d(ctx: Lowering, node: torch.fx.Node) -> Value:
    kernel = pair(node.args[1])
    stride = pair(arg(node, 2, "stride", None) or kernel)
    ph, pw = pair(arg(node, 3, "padding", 0))
    return _avg_pool(ctx, ctx.value(node.args[0]), kernel, stride, [ph, ph, pw, pw], nhwc_shape(node))


def adaptive_avg_pool2d(ctx: Lowering, node: torch.fx.Node) -> Value:
    x = ctx.value(node.args[0])
    h, w = x.logical_shape[2:]
    return _avg_pool(ctx, x, (h, w), (1, 1), [0, 0, 0, 0], nhwc_shape(node))


def mean_dim(ctx: Lowering, node: torch.fx.Node) -> Value:
    x = ctx.value(node.args[0])
    rank = len(x.logical_shape)
    dims = sorted({int(d) % rank for d in (arg(node, 1, "dim") or range(rank))})
    keepdim = bool(arg(node, 2, "keepdim", False))
    out_shape = static_shape(node)
    if rank == 4 and dims == [2, 3]:
        h, w = x.logical_shape[2:]
        y = _avg_pool(ctx, x, (h, w), (1, 1), [0, 0, 0, 0], (x.logical_shape[0], 1, 1, x.logical_shape[1]))
        if keepdim:
            return y
        return y.with_(name=ctx.g.reshape(y.name, out_shape, y.dtype), shape=out_shape, nhwc=False)
    x = ctx.nchw(ctx.to_int32(x) if ctx.integer else x)
    count = math.prod(x.shape[d] for d in dims)
    shape = list(x.shape)
    name = x.name
    for d in dims:
        shape[d] = 1
        out = ctx.g.tensor(shape, x.dtype)
        ctx.g.op(Op.REDUCE_SUM, [name], [out], "ReduceSumAttribute", axis=d)
        name = out
    if ctx.integer:
        y = x.with_(name=name, shape=tuple(shape), acc_scale=float(x.acc_scale) / count)
    else:
        y = x.with_(name=mul(ctx, name, scalar(ctx, 1.0 / count, rank), shape, DType.FP32), shape=tuple(shape))
    if not keepdim:
        y = y.with_(name=ctx.g.reshape(y.name, out_shape, y.dtype), shape=out_shape)
    return y
