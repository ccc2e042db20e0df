"""linear (``FullyConnected``, inputs of any rank flattened to 2-D), addmm, mm / bmm (``MatMul``)."""

from __future__ import annotations

import math

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_qnn.preprocess.lowering import Lowering, Val, static_shape
from edgeport_qnn.preprocess.ops._common import operand


def linear(lw: Lowering, node: torch.fx.Node) -> Val:
    x = lw.nchw(lw.value(node.args[0]))
    w = lw.const(node.args[1])
    if w is None:
        raise LoweringError("linear weights must be constant")
    bias_node = node.args[2] if len(node.args) > 2 else None
    b = lw.const(bias_node) if bias_node is not None else None
    out = static_shape(node)
    rows = math.prod(x.shape[:-1])
    src = x.name if len(x.shape) == 2 else lw.node("Reshape", [x.name], (rows, x.shape[-1])).name
    ins = [src, lw.static(np.asarray(w, np.float32), "weight")]
    ins.append(lw.static(np.asarray(b if b is not None else np.zeros(w.shape[0]), np.float32), "bias"))
    y = lw.node("FullyConnected", ins, (rows, w.shape[0]), {"keep_dims": False})
    return y if len(out) == 2 else lw.node("Reshape", [y.name], out)


def addmm(lw: Lowering, node: torch.fx.Node) -> Val:
    """``bias + mat1 @ mat2`` (GPT-2's ``Conv1D``): ``FullyConnected`` when ``mat2`` is constant (its transpose is
    the weight) and the bias a constant vector, else ``MatMul`` + ``ElementWiseAdd``."""
    bias_node, a_node, b_node = node.args[0], node.args[1], node.args[2]
    out = static_shape(node)
    a = lw.nchw(lw.value(a_node))
    w, b = lw.const(b_node), lw.const(bias_node)
    if w is not None and b is not None and np.asarray(b).reshape(-1).shape == (out[-1],):
        ins = [a.name, lw.static(np.ascontiguousarray(np.asarray(w, np.float32).T), "weight"),
               lw.static(np.asarray(b, np.float32).reshape(-1), "bias")]
        return lw.node("FullyConnected", ins, out, {"keep_dims": False})
    mat2 = lw.nchw(lw.value(b_node))
    prod = lw.node("MatMul", [a.name, mat2.name], out, {"transpose_in0": False, "transpose_in1": False})
    return lw.node("ElementWiseAdd", [prod.name, operand(lw, bias_node, len(out), False)], out)


def matmul(lw: Lowering, node: torch.fx.Node) -> Val:
    a = lw.nchw(lw.value(node.args[0]))
    b = lw.nchw(lw.value(node.args[1]))
    return lw.node("MatMul", [a.name, b.name], static_shape(node), {"transpose_in0": False, "transpose_in1": False})


LOWERINGS = {"aten.linear.default": linear, "aten.addmm.default": addmm, "aten.mm.default": matmul, "aten.bmm.default": matmul}
