"""Unary activations: relu, relu6/hardtanh (``ReluMinMax``), sigmoid, tanh, hardswish, gelu. Layout-free: the
result keeps its input's layout."""

from __future__ import annotations

import torch

from edgeport_qnn.preprocess.lowering import Lowering, Val, arg


def _unary(qnn_op: str, params=None):
    def lower(lw: Lowering, node: torch.fx.Node) -> Val:
        v = lw.value(node.args[0])
        p = params(node) if params is not None else {}
        return lw.node(qnn_op, [v.name], v.qnn_shape, p, nhwc=v.nhwc, logical=v.shape)
    return lower


def _hardtanh_params(node: torch.fx.Node) -> dict:
    return {"min_value": float(arg(node, 1, "min_val", -1.0)), "max_value": float(arg(node, 2, "max_val", 1.0))}


# Abramowitz & Stegun 7.1.26: erf(z) = 1 - poly(t) exp(-z^2), t = 1 / (1 + p z), z >= 0; |error| <= 1.5e-7
_P = 0.3275911
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def gelu(lw: Lowering, node: torch.fx.Node) -> Val:
    """Exact (erf) gelu from fp32 elementwise ops: QNN's ``Gelu`` passes validation on the HTP but cannot be
    prepared in fp32 (``no properties registered for q::QNN_Gelu``); ``Erf`` is refused in fp32 too."""
    x = lw.value(node.args[0])
    if arg(node, 1, "approximate", "none") == "tanh":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = lw.binary("ElementWiseMultiply", lw.binary("ElementWiseMultiply", x, x.name), x.name)
        inner = lw.binary("ElementWiseAdd", lw.binary("ElementWiseMultiply", cube, 0.044715), x.name)
        th = lw.unary("Tanh", lw.binary("ElementWiseMultiply", inner, (2 / 3.141592653589793) ** 0.5))
        half = lw.binary("ElementWiseMultiply", lw.binary("ElementWiseAdd", th, 1.0), 0.5)
        return lw.binary("ElementWiseMultiply", half, x.name)
    z = lw.binary("ElementWiseMultiply", lw.unary("ElementWiseAbs", x), 2 ** -0.5)
    t = lw.binary("ElementWiseAdd", lw.binary("ElementWiseMultiply", z, _P), 1.0)
    t = lw.node("ElementWiseDivide", [lw.scalar(1.0, len(x.shape)), t.name], t.qnn_shape, nhwc=t.nhwc,
                logical=t.shape)
    poly = lw.binary("ElementWiseMultiply", t, _A[4])
    for a in reversed(_A[:4]):
        poly = lw.binary("ElementWiseMultiply", lw.binary("ElementWiseAdd", poly, a), t.name)
    e = lw.unary("ElementWiseExp", lw.binary("ElementWiseMultiply", lw.binary("ElementWiseMultiply", z, z.name), -1.0))
    erf = lw.binary("ElementWiseAdd", lw.binary("ElementWiseMultiply", lw.binary("ElementWiseMultiply", poly, e.name),
                                                -1.0), 1.0)
    signed = lw.binary("ElementWiseMultiply", erf, lw.unary("ElementWiseSign", x).name)
    half = lw.binary("ElementWiseMultiply", lw.binary("ElementWiseAdd", signed, 1.0), 0.5)
    return lw.binary("ElementWiseMultiply", half, x.name)


def pow_scalar(lw: Lowering, node: torch.fx.Node) -> Val:
    """``x ** e`` for the exponents the capability table admits, from exact ops: 1, 2, 3 (products), 0.5
    (``ElementWiseSquareRoot``), -0.5 (``ElementWiseRsqrt``), -1 (``1 / x``)."""
    x = lw.value(node.args[0])
    e = float(node.args[1])
    if e == 1.0:
        return lw.binary("ElementWiseMultiply", x, 1.0)
    if e in (2.0, 3.0):
        sq = lw.binary("ElementWiseMultiply", x, x.name)
        return sq if e == 2.0 else lw.binary("ElementWiseMultiply", sq, x.name)
    if e == 0.5:
        return lw.unary("ElementWiseSquareRoot", x)
    if e == -0.5:
        return lw.unary("ElementWiseRsqrt", x)
    return reciprocal(lw, node)


def reciprocal(lw: Lowering, node: torch.fx.Node) -> Val:
    x = lw.value(node.args[0])
    return lw.node("ElementWiseDivide", [lw.scalar(1.0, len(x.shape)), x.name], x.qnn_shape, nhwc=x.nhwc,
                   logical=x.shape)


def clamp(lw: Lowering, node: torch.fx.Node) -> Val:
    x = lw.value(node.args[0])
    lo, hi = arg(node, 1, "min", None), arg(node, 2, "max", None)
    if lo is not None and hi is not None:
        return lw.node("ReluMinMax", [x.name], x.qnn_shape, {"min_value": float(lo), "max_value": float(hi)},
                       nhwc=x.nhwc, logical=x.shape)
    y = x if lo is None else lw.binary("ElementWiseMaximum", x, float(lo))
    return y if hi is None else lw.binary("ElementWiseMinimum", y, float(hi))


def leaky_relu(lw: Lowering, node: torch.fx.Node) -> Val:
    """max(x, slope * x) for 0 <= slope <= 1 (exact in fp32)."""
    x = lw.value(node.args[0])
    scaled = lw.binary("ElementWiseMultiply", x, float(arg(node, 1, "negative_slope", 0.01)))
    return lw.node("ElementWiseMaximum", [x.name, scaled.name], x.qnn_shape, nhwc=x.nhwc, logical=x.shape)


LOWERINGS = {
    "aten.relu.default": _unary("Relu"),
    "aten.clamp.default": clamp,
    "aten.leaky_relu.default": leaky_relu,
    "aten.exp.default": _unary("ElementWiseExp"),
    "aten.abs.default": _unary("ElementWiseAbs"),
    "aten.neg.default": _unary("ElementWiseNeg"),
    "aten.reciprocal.default": reciprocal,
    "aten.sign.default": _unary("ElementWiseSign"),
    "aten.sin.default": _unary("ElementWiseSin"),
    "aten.cos.default": _unary("ElementWiseCos"),
    "aten.pow.Tensor_Scalar": pow_scalar,
    "aten.sqrt.default": _unary("ElementWiseSquareRoot"),
    "aten.rsqrt.default": _unary("ElementWiseRsqrt"),
    "aten.hardtanh.default": _unary("ReluMinMax", _hardtanh_params),
    "aten.sigmoid.default": _unary("Sigmoid"),
    "aten.tanh.default": _unary("Tanh"),
    "aten.hardswish.default": _unary("HardSwish"),
    "aten.gelu.default": gelu,
}
