"""add / sub / mul / div (``ElementWiseAdd`` ...), with broadcasting and constant operands."""

from __future__ import annotations

import torch

from edgeport_qnn.preprocess.lowering import Lowering, Val
from edgeport_qnn.preprocess.ops._common import operand, out_shape

_QNN = {"aten.add.Tensor": "ElementWiseAdd", "aten.sub.Tensor": "ElementWiseSubtract",
        "aten.mul.Tensor": "ElementWiseMultiply", "aten.div.Tensor": "ElementWiseDivide",
        "aten.add.Scalar": "ElementWiseAdd", "aten.sub.Scalar": "ElementWiseSubtract",
        "aten.mul.Scalar": "ElementWiseMultiply", "aten.div.Scalar": "ElementWiseDivide",
        "aten.maximum.default": "ElementWiseMaximum", "aten.minimum.default": "ElementWiseMinimum"}


def _binary(qnn_op: str):
    def lower(lw: Lowering, node: torch.fx.Node) -> Val:
        a, b = node.args[0], node.args[1]
        shape = out_shape(node)
        vals = [lw.values.get(x) for x in (a, b) if isinstance(x, torch.fx.Node)]
        tensors = [v for v in vals if isinstance(v, Val)]
        # stay NHWC when every tensor operand is NHWC and the result is 4-D
        nhwc = len(shape) == 4 and bool(tensors) and all(v.nhwc and len(v.shape) == 4 for v in tensors)
        ins = [operand(lw, a, len(shape), nhwc), operand(lw, b, len(shape), nhwc)]
        phys = tuple(shape[i] for i in (0, 2, 3, 1)) if nhwc else shape
        return lw.node(qnn_op, ins, phys, nhwc=nhwc)
    return lower


LOWERINGS = {name: _binary(op) for name, op in _QNN.items()}
