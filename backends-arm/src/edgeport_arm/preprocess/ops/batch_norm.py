"""``_native_batch_norm_legit_no_training`` in float graphs: one MUL and one ADD per channel.

Inference batch norm with constant statistics is ``x * scale + shift`` with ``scale = weight / sqrt(var + eps)``
and ``shift = bias - mean * scale``, both folded here (in float64, stored as float32). The input keeps its
layout (an NHWC 4-D tensor gets NHWC-shaped constants). Only output 0 (the normalized tensor) is lowered.
"""

from __future__ import annotations

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType, Op
from edgeport_arm.preprocess.lowering import Lowering
from edgeport_arm.preprocess.ops._common import binary, mul
from edgeport_arm.preprocess.values import Value


def _param(ctx: Lowering, node: object, what: str, channels: int, default: float) -> np.ndarray:
    if node is None:
        return np.full(channels, default, np.float64)
    c = ctx.const(node)
    if c is None:
        raise LoweringError(f"batch norm {what} must be a constant (a parameter or buffer)")
    data = np.asarray(c.real(), np.float64).reshape(-1)
    if data.shape != (channels,):
        raise LoweringError(f"batch norm {what} has {data.size} values for {channels} channels")
    return data


def batch_norm(ctx: Lowering, node: torch.fx.Node) -> tuple[Value, None, None]:
    if ctx.integer:
        raise LoweringError("int8 batch norm is not lowered (pt2e folds one that follows a convolution into it)")
    x = ctx.settle(ctx.value(node.args[0]))
    logical = x.logical_shape
    if len(logical) < 2:
        raise LoweringError(f"batch norm input of rank {len(logical)}; it needs (N, C, ...)")
    channels = logical[1]
    weight, bias, mean, var = (_param(ctx, node.args[i], what, channels, dflt) for i, what, dflt in (
        (1, "weight", 1.0), (2, "bias", 0.0), (3, "running_mean", 0.0), (4, "running_var", 1.0)))
    eps = float(node.args[6])
    scale = weight / np.sqrt(var + eps)
    shift = bias - mean * scale
    if x.nhwc:
        const_shape = (1, 1, 1, channels)
    else:
        const_shape = (1, channels) + (1,) * (len(logical) - 2)
    shape, f = list(x.shape), DType.FP32
    y = mul(ctx, x.name, ctx.g.const(scale.astype(np.float32).reshape(const_shape), f, "bn_scale"), shape, f)
    y = binary(ctx, Op.ADD, "AddAttribute", y, ctx.g.const(shift.astype(np.float32).reshape(const_shape), f,
                                                          "bn_shift"), shape, f)
    return x.with_(name=y), None, None
