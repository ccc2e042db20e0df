"""``sigmoid`` / ``tanh`` / ``hardswish`` / ``gelu`` / ``silu`` (and ``exp`` / ``reciprocal`` / ``rsqrt``): one int8 TABLE in integer graphs (the 256 results of the
float function on every input code, quantized with the parameters of the quantize that follows); native SIGMOID
/ TANH, or a few arithmetic operators, in float graphs."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import DType, Op
from edgeport_arm.preprocess.lowering import Lowering
from edgeport_arm.preprocess.ops._common import binary, mul, output_qparams, scalar, unary
from edgeport_arm.preprocess.values import Value


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _hardswish(x: np.ndarray) -> np.ndarray:
    return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0


def _gelu(x: np.ndarray) -> np.ndarray:
    return np.asarray(torch.nn.functional.gelu(torch.from_numpy(x)).numpy(), np.float64)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _table(ctx: Lowering, node: torch.fx.Node, fn: Callable[[np.ndarray], np.ndarray]) -> Value:
    x = ctx.settle(ctx.value(node.args[0]))
    out_q = output_qparams(node)
    if x.q is None or out_q is None:
        raise LoweringError("an int8 table op needs a dequantize before it and a quantize after it")
    codes = np.arange(-128, 128, dtype=np.float64)
    real = fn((codes - x.q.zero_point) * x.q.scale)
    table = np.clip(np.round(real / out_q.scale) + out_q.zero_point, -128, 127).astype(np.int8)
    out = ctx.g.tensor(x.shape, DType.INT8)
    ctx.g.op(Op.TABLE, [x.name, ctx.g.const(table, DType.INT8, "table")], [out], "TableAttribute")
    return x.with_(name=out, q=out_q)


def sigmoid(ctx: Lowering, node: torch.fx.Node) -> Value:
    if ctx.integer:
        return _table(ctx, node, _sigmoid)
    x = ctx.value(node.args[0])
    return x.with_(name=unary(ctx, Op.SIGMOID, "SigmoidAttribute", x.name, x.shape, DType.FP32))


def tanh(ctx: Lowering, node: torch.fx.Node) -> Value:
    if ctx.integer:
        return _table(ctx, node, np.tanh)
    x = ctx.value(node.args[0])
    return x.with_(name=unary(ctx, Op.TANH, "TanhAttribute", x.name, x.shape, DType.FP32))


def _silu(x: np.ndarray) -> np.ndarray:
    # float32 as the pt2e model computes it (its quantize then rounds that value)
    return np.asarray(torch.nn.functional.silu(torch.from_numpy(x.astype(np.float32))).numpy(), np.float64)


def silu(ctx: Lowering, node: torch.fx.Node) -> Value:
    """SiLU (``x * sigmoid(x)``): one int8 TABLE; SIGMOID then MUL in float graphs."""
    if ctx.integer:
        return _table(ctx, node, _silu)
    x = ctx.value(node.args[0])
    gate = unary(ctx, Op.SIGMOID, "SigmoidAttribute", x.name, x.shape, DType.FP32)
    return x.with_(name=mul(ctx, x.name, gate, x.shape, DType.FP32))


def hardswish(ctx: Lowering, node: torch.fx.Node) -> Value:
    if ctx.integer:
        return _table(ctx, node, _hardswish)
    x = ctx.value(node.args[0])
    rank, shape = len(x.shape), x.shape
    shifted = binary(ctx, Op.ADD, "AddAttribute", x.name, scalar(ctx, 3.0, rank), shape, DType.FP32)
    gate = ctx.g.clamp(shifted, shape, DType.FP32, 0.0, 6.0)
    y = mul(ctx, mul(ctx, x.name, gate, shape, DType.FP32), scalar(ctx, 1.0 / 6.0, rank), shape, DType.FP32)
    return x.with_(name=y)


def gelu(ctx: Lowering, node: torch.fx.Node) -> Value:
    approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    if ctx.integer:
        return _table(ctx, node, _gelu_tanh if approximate == "tanh" else _gelu)
    x = ctx.value(node.args[0])
    rank, shape, f = len(x.shape), x.shape, DType.FP32
    if approximate == "tanh":
        cube = mul(ctx, mul(ctx, x.name, x.name, shape, f), x.name, shape, f)
        inner = binary(ctx, Op.ADD, "AddAttribute", x.name, mul(ctx, cube, scalar(ctx, 0.044715, rank), shape, f),
                       shape, f)
        t = unary(ctx, Op.TANH, "TanhAttribute", mul(ctx, inner, scalar(ctx, math.sqrt(2 / math.pi), rank), shape, f),
                  shape, f)
    else:
        t = unary(ctx, Op.ERF, "ErfAttribute", mul(ctx, x.name, scalar(ctx, 1 / math.sqrt(2), rank), shape, f),
                  shape, f)
    one_plus = binary(ctx, Op.ADD, "AddAttribute", t, scalar(ctx, 1.0, rank), shape, f)
    y = mul(ctx, mul(ctx, x.name, one_plus, shape, f), scalar(ctx, 0.5, rank), shape, f)
    return x.with_(name=y)


def _reciprocal(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return 1.0 / x


def _rsqrt(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, 1.0 / np.sqrt(np.maximum(x, 1e-300)), np.inf)


def _unary_or_table(ctx: Lowering, node: torch.fx.Node, fn: Callable[[np.ndarray], np.ndarray], op: object,
                    attr: str) -> Value:
    if ctx.integer:
        return _table(ctx, node, fn)
    x = ctx.value(node.args[0])
    return x.with_(name=unary(ctx, op, attr, x.name, x.shape, DType.FP32))


def exp(ctx: Lowering, node: torch.fx.Node) -> Value:
    """EXP; int8: TABLE."""
    return _unary_or_table(ctx, node, np.exp, Op.EXP, "ExpAttribute")


def reciprocal(ctx: Lowering, node: torch.fx.Node) -> Value:
    """RECIPROCAL; int8: TABLE (1/0 saturates to the largest output code, as the quantized torch model does)."""
    return _unary_or_table(ctx, node, _reciprocal, Op.RECIPROCAL, "ReciprocalAttribute")


def rsqrt(ctx: Lowering, node: torch.fx.Node) -> Value:
    """RSQRT; int8: TABLE (non-positive inputs saturate to the largest output code)."""
    return _unary_or_table(ctx, node, _rsqrt, Op.RSQRT, "RsqrtAttribute")
