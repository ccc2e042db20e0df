"""softmax over one dimension (``Softmax`` over the last axis; other axes moved there with ``Transpose``)."""

from __future__ import annotations

import torch

from edgeport_qnn.preprocess.lowering import Lowering, Val, static_shape
from edgeport_qnn.preprocess.ops._common import u32


def softmax(lw: Lowering, node: torch.fx.Node, op: str = "Softmax") -> Val:
    v = lw.nchw(lw.value(node.args[0]))
    rank = len(v.shape)
    axis = int(node.args[1]) % rank
    if axis == rank - 1:
        return lw.node(op, [v.name], static_shape(node), {"axis": axis, "beta": 1.0})
    # the HTP takes softmax over the last axis only: move the axis there and back
    perm = [d for d in range(rank) if d != axis] + [axis]
    inverse = [perm.index(d) for d in range(rank)]
    moved = lw.node("Transpose", [v.name], tuple(v.shape[d] for d in perm), {"perm": u32(perm)}, like=v)
    y = lw.node(op, [moved.name], moved.shape, {"axis": rank - 1, "beta": 1.0})
    return lw.node("Transpose", [y.name], v.shape, {"perm": u32(inverse)}, like=y)


def log_softmax(lw: Lowering, node: torch.fx.Node) -> Val:
    return softmax(lw, node, "LogSoftmax")


LOWERINGS = {"aten._softmax.default": softmax, "aten._log_softmax.default": log_softmax}
