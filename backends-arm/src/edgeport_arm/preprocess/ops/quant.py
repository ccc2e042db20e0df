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


def quantize_per_tensor(ctx: Lowering, node: torch.fx.Node) -> Value:
    x, scale, zp, qmin, qmax, dtype = node.args[:6]
    _check_int8(node, qmin, qmax, dtype)
    return ctx.requantize(ctx.value(x), QParams(float(scale), int(zp)), int(qmin), int(qmax))


def dequantize_per_tensor(ctx: Lowering, node: torch.fx.Node) -> Value | Const:
    x, scale, zp, qmin, qmax, dtype = node.args[:6]
    _check_int8(node, qmin, qmax, dtype)
    c = ctx.const(x)
    if c is not None:
        return Const(c.data.astype(np.int8), np.asarray(float(scale)), np.asarray(int(zp)))
    v = ctx.settle(ctx.value(x))
    if v.dtype != DType.INT8:
        raise LoweringError(f"dequantize of a {v.dtype} tensor")
    return v.with_(q=QParams(float(scale), int(zp)))


def dequantize_per_channel(ctx: Lowering, node: torch.fx.Node) -> Const:
    x, scales, zps, axis, qmin, qmax, dtype = node.args[:7]
    _check_int8(node, qmin, qmax, dtype)
    c, s, z = ctx.const(x), ctx.const(scales), ctx.const(zps)
    if c is None or s is None or z is None:
        raise LoweringError("per-channel dequantize of a non-constant (only weights are quantized per channel)")
    return Const(c.data.astype(np.int8), s.data.astype(np.float64).reshape(-1), z.data.astype(np.int64).reshape(-1),
                 int(axis) % c.data.ndim)
