"""``relu`` / ``hardtanh`` / ``clamp``: a CLAMP in float graphs; in integer graphs a bound kept on the value and
applied, exactly, as an int8 CLAMP after the RESCALE of the quantize that follows."""

from __future__ import annotations

import math

import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType
from edgeport_arm.preprocess.lowering import Lowering
from edgeport_arm.preprocess.ops._common import arg
from edgeport_arm.preprocess.values import Value


def _bounds(lo: float | None, hi: float | None, v: Value) -> tuple[float | None, float | None]:
    old = v.bounds or (None, None)
    lo = lo if old[0] is None else (old[0] if lo is None else max(lo, old[0]))
    hi = hi if old[1] is None else (old[1] if hi is None else min(hi, old[1]))
    return lo, hi


def _clamp(ctx: Lowering, node: torch.fx.Node, lo: float | None, hi: float | None) -> Value:
    v = ctx.value(node.args[0])
    if ctx.integer:
        if v.dtype in (DType.INT8, DType.INT16) and v.q is None:
            raise LoweringError("activation on an int8 tensor without quantization parameters")
        return v.with_(bounds=_bounds(lo, hi, v))
    lo_f = -math.inf if lo is None else lo
    hi_f = math.inf if hi is None else hi
    big = 3.4e38
    return v.with_(name=ctx.g.clamp(v.name, v.shape, DType.FP32, max(lo_f, -big), min(hi_f, big)))


def relu(ctx: Lowering, node: torch.fx.Node) -> Value:
    return _clamp(ctx, node, 0.0, None)


def hardtanh(ctx: Lowering, node: torch.fx.Node) -> Value:
    return _clamp(ctx, node, float(arg(node, 1, "min_val", -1.0)), float(arg(node, 2, "max_val", 1.0)))


def clamp(ctx: Lowering, node: torch.fx.Node) -> Value:
    lo, hi = arg(node, 1, "min"), arg(node, 2, "max")
    return _clamp(ctx, node, None if lo is None else float(lo), None if hi is None else float(hi))
