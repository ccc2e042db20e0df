"""``quantize_per_tensor`` / ``dequantize_per_tensor`` / ``dequantize_per_channel`` in integer graphs.

A dequantize costs nothing (the int8 tensor gets its parameters; a dequantized constant stays a compile-time
constant for the op that reads it); a quantize is one RESCALE of what its producer computed, plus a CLAMP for
an activation fused before it.
"""

from __future__ import annotations

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType
from edgeport_arm.preprocess.lowering import Lowering
from edgeport_arm.preprocess.values import Const, QParams, Value


def _check_int8(node: torch.fx.Node, qmin: int, qmax: int, dtype: object) -> None:
    if dtype != torch.int8 or qmin < -128 or qmax > 127:
        raise LoweringError(f"{node.name}: only int8 quantization is lowered (got {dtype} [{qmin}, {qmax}])")


def _bits(ctx: Lowering, node: torch.fx.Node, qmin: int, qmax: int, dtype: object) -> int:
    """8, or 16 for int16 activations (a16w8) in a graph with the int16 extension."""
    if dtype == torch.int16 and ctx.int16 and -32768 <= qmin and qmax <= 32767:
        return 16
    if dtype == torch.int16:
        raise LoweringError(f"{node.name}: int16 activations need a TOSA target with the int16 extension "
                            f"(e.g. 'TOSA-1.0+INT+int16'); {ctx.spec} has none")
    _check_int8(node, qmin, qmax, dtype)
    return 8


def quantize_per_tensor(ctx: Lowering, node: torch.fx.Node) -> Value:
    x, scale, zp, qmin, qmax, dtype = node.args[:6]
    bits = _bits(ctx, node, qmin, qmax, dtype)
    return ctx.requantize(ctx.value(x), QParams(float(scale), int(zp), bits), int(qmin), int(qmax))


def dequantize_per_tensor(ctx: Lowering, node: torch.fx.Node) -> Value | Const:
    x, scale, zp, qmin, qmax, dtype = node.args[:6]
    bits = _bits(ctx, node, qmin, qmax, dtype)
    c = ctx.const(x)
    if c is not None:
        if bits != 8:
            raise LoweringError(f"{node.name}: int16 constants are not lowered")
        return Const(c.data.astype(np.int8), np.asarray(float(scale)), np.asarray(int(zp)))
    v = ctx.settle(ctx.value(x))
    if v.dtype != (DType.INT16 if bits == 16 else DType.INT8):
        raise LoweringError(f"dequantize of a {v.dtype} tensor")
    return v.with_(q=QParams(float(scale), int(zp), bits))


def dequantize_per_channel(ctx: Lowering, node: torch.fx.Node) -> Const:
    """A per-channel constant: int8 weights, or an int32 bias (scale ``input_scale * weight_scale``, which the
    convolution uses as it is)."""
    x, scales, zps, axis, qmin, qmax, dtype = node.args[:7]
    if dtype != torch.int32:
        _check_int8(node, qmin, qmax, dtype)
    c, s, z = ctx.const(x), ctx.const(scales), ctx.const(zps)
    if c is None or s is None or z is None:
        raise LoweringError("per-channel dequantize of a non-constant (only weights are quantized per channel)")
    return Const(c.data.astype(np.int32 if dtype == torch.int32 else np.int8), s.data.astype(np.float64).reshape(-1),
                 z.data.astype(np.int64).reshape(-1), int(axis) % c.data.ndim)
