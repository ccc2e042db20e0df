"""``upsample_bilinear2d``: one TOSA RESIZE on the NHWC tensor (float: BILINEAR; int8: from a 1x1 map only).

TOSA samples output row ``y`` at input row ``(y * scale_d + offset) / scale_n`` (indices clamped to the
input), which is torch's source coordinate when ``scale_n / scale_d = out / in`` and, without aligned
corners, ``offset = in - out`` on the doubled scale (``(y + 0.5) * in / out - 0.5``); with aligned corners
``(out - 1) / (in - 1)`` and no offset. ``border`` makes the output size exact; all four are reduced by their
common divisor.
"""

from __future__ import annotations

import math

import torch
import tosa_serializer as ts

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import Op
from edgeport_arm.preprocess.lowering import Lowering, static_shape
from edgeport_arm.preprocess.values import Value

_MAX_SCALE = 1 << 11


def resize_params(size_in: int, size_out: int, align_corners: bool) -> tuple[int, int, int, int]:
    """``(scale_n, scale_d, offset, border)`` of one axis, as TOSA RESIZE takes them."""
    if size_in == 1:  # every output reads the one input row
        n, d, offset = size_out, 1, 0
    elif align_corners:
        if size_out == 1:
            n, d, offset = 1, 1, 0
        else:
            n, d, offset = size_out - 1, size_in - 1, 0
    else:
        n, d, offset = 2 * size_out, 2 * size_in, size_in - size_out
    g = math.gcd(math.gcd(n, d), abs(offset)) if offset else math.gcd(n, d)
    n, d, offset = n // g, d // g, offset // g
    border = (size_out - 1) * d - (size_in - 1) * n + offset
    if not (0 < n <= _MAX_SCALE and 0 < d < 16 * n and -n <= offset < 16 * n and -16 * n <= border < n):
        raise LoweringError(f"resize {size_in} -> {size_out} needs TOSA RESIZE parameters out of range "
                            f"(scale {n}/{d}, offset {offset}, border {border})")
    return n, d, offset, border


def upsample_bilinear2d(ctx: Lowering, node: torch.fx.Node) -> Value:
    """Float: RESIZE BILINEAR. Int8: from a 1x1 map, RESIZE NEAREST on the codes (every output is the one input
    pixel, as in bilinear), keeping the input's parameters; larger int8 maps are not lowered yet."""
    x = ctx.nhwc(ctx.settle(ctx.value(node.args[0])))
    align = bool(node.args[2]) if len(node.args) > 2 else False
    out_nchw = static_shape(node)
    shape = (out_nchw[0], out_nchw[2], out_nchw[3], out_nchw[1])
    if ctx.integer and (x.shape[1], x.shape[2]) != (1, 1):
        raise LoweringError("int8 bilinear upsampling is lowered from a 1x1 map only")
    if ctx.integer and x.q is None:
        raise LoweringError("integer upsampling needs a dequantized int8 input")
    (nh, dh, oh, bh), (nw, dw, ow, bw) = (resize_params(x.shape[1 + i], out_nchw[2 + i], align) for i in range(2))
    out = ctx.g.tensor(shape, x.dtype)
    mode = ts.ResizeMode.NEAREST if ctx.integer else ts.ResizeMode.BILINEAR
    ctx.g.op(Op.RESIZE, [x.name, ctx.g.shape_const([nh, dh, nw, dw], "scale"), ctx.g.shape_const([oh, ow], "offset"),
                         ctx.g.shape_const([bh, bw], "border")], [out], "ResizeAttribute", mode=mode)
    return x.with_(name=out, shape=shape, nhwc=True)
