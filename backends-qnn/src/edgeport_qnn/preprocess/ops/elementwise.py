"""add / sub / mul / div (``ElementWiseAdd`` ...), with broadcasting and constant operands.

fp32 ``ElementWiseDivide`` on the HTP: a graph where a Div whose operands are not produced by an
``ElementWiseMultiply`` has a Multiply anywhere downstream fails to prepare (``graphFinalize``:
``QNN_COMMON_ERROR_MEM_ALLOC``, "could not create op: q::flat_from_vtcm"; T5's relative position buckets,
``log(x) / c * k``). With one of its operands computed by a Multiply it prepares, so a float Div reads
``x * 1.0`` (exact) instead of ``x``.
"""

from __future__ import annotations

from typing import Any

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
        restore = _times_one(lw, a, b) if qnn_op == "ElementWiseDivide" and lw.qmode is None else None
        try:
            ins = [operand(lw, a, len(shape), nhwc), operand(lw, b, len(shape), nhwc)]
        finally:
            if restore is not None:
                lw.values[restore[0]] = restore[1]
        phys = tuple(shape[i] for i in (0, 2, 3, 1)) if nhwc else shape
        return lw.node(qnn_op, ins, phys, nhwc=nhwc)
    return lower


def _times_one(lw: Lowering, a: Any, b: Any) -> tuple[torch.fx.Node, Any] | None:
    """Make the Div's first tensor operand read ``operand * 1.0`` (see the module docstring); returns what to put
    back in ``lw.values`` afterwards."""
    for x in (a, b):
        if isinstance(x, torch.fx.Node) and lw.const(x) is None:
            old = lw.values.get(x)
            lw.values[x] = lw.binary("ElementWiseMultiply", lw.value(x), 1.0)
            return x, old
    return None


LOWERINGS = {name: _binary(op) for name, op in _QNN.items()}
