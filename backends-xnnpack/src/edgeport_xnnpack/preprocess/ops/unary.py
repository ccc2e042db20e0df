"""Elementwise unary ops (layout preserving): sigmoid, hardswish, abs, neg, floor, ceil, sqrt, square,
leaky_relu, elu, gelu (exact form); rsqrt as square root + divide."""

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


@lowers("aten.rsqrt.default")
def rsqrt(b: GraphBuilder, node: Any) -> None:
    """1 / sqrt(x): XNNSquareRoot then XNNDiv of a constant 1 (broadcast); the 2022 library has no reciprocal
    square root node. Rounds twice (eager's rsqrt once): within an ulp or two of eager."""
    import numpy as np

    xv = b.val(node.args[0])
    root = b.new_val(xv.shape, xv.layout)
    b.add("XNNSquareRoot", input_id=xv.id, output_id=root.id, flags=0)
    one = b.constant_array(np.ones((1,), dtype=np.float32))
    out = b.new_val(xv.shape, xv.layout)
    b.add("XNNDiv", input1_id=one, input2_id=root.id, output_id=out.id, flags=0)
    b.set(node, out)
