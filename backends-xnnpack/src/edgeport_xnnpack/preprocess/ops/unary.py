"""Elementwise unary ops (layout preserving): sigmoid, hardswish, abs, neg, floor, ceil, sqrt, square,
leaky_relu, elu, gelu (exact form)."""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack.preprocess.builder import GraphBuilder
from edgeport_xnnpack.preprocess.registry import lowers

_KIND = {
    "aten.sigmoid.default": "XNNSigmoid", "aten.hardswish.default": "XNNHardswish", "aten.abs.default": "XNNAbs",
    "aten.neg.default": "XNNNegate", "aten.floor.default": "XNNFloor", "aten.ceil.default": "XNNCeiling",
    "aten.sqrt.default": "XNNSquareRoot", "aten.pow.Tensor_Scalar": "XNNSquare",
    "aten.leaky_relu.default": "XNNLeakyReLU", "aten.elu.default": "XNNELU", "aten.gelu.default": "XNNGelu",
}


@lowers(*_KIND)
def unary(b: GraphBuilder, node: Any) -> None:
    from edgeport.aot.capability_partitioner import op_name

    kind = _KIND[op_name(node.target)]
    xv = b.val(node.args[0])
    out = b.new_val(xv.shape, xv.layout)
    extra = {}
    if kind == "XNNLeakyReLU":
        slope = node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)
        extra["negative_slope"] = float(slope)
    elif kind == "XNNELU":
        extra["alpha"] = float(node.args[1] if len(node.args) > 1 else node.kwargs.get("alpha", 1.0))
    b.add(kind, input_id=xv.id, output_id=out.id, flags=0, **extra)
    b.set(node, out)
