"""layer norm over the last dimensions (ReduceMean / elementwise ops / ElementWiseRsqrt); inference batch norm (``Batchnorm``, NHWC: per channel
``x * (gamma / sqrt(var + eps)) + (beta - mean * gamma / sqrt(var + eps))``)."""

from __future__ import annotations

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_qnn.preprocess.lowering import Lowering, static_shape
from edgeport_qnn.preprocess.ops._common import broadcast_const, u32


def layer_norm(lw: Lowering, node: torch.fx.Node) -> tuple:
    v = lw.nchw(lw.value(node.args[0]))
    normalized = [int(d) for d in node.args[1]]
    k = len(normalized)
    w_node, b_node = node.args[2], node.args[3]
    w = lw.const(w_node) if w_node is not None else np.ones(normalized, np.float32)
    b = lw.const(b_node) if b_node is not None else np.zeros(normalized, np.float32)
    if w is None or b is None:
        raise LoweringError("layer norm weight and bias must be constants")
    rank = len(v.shape)
    axes = u32(range(rank - k, rank))
    # decomposed into fp32 elementwise ops: QNN's LayerNorm runs in reduced precision on the HTP (~5e-4 off)
    kept = tuple(1 if d >= rank - k else v.shape[d] for d in range(rank))
    mean = lw.node("ReduceMean", [v.name], kept, {"axes": axes, "keep_dims": True})
    d = lw.node("ElementWiseSubtract", [v.name, mean.name], v.shape)
    var = lw.node("ReduceMean", [lw.binary("ElementWiseMultiply", d, d.name).name], kept,
                  {"axes": axes, "keep_dims": True})
    r = lw.unary("ElementWiseRsqrt", lw.binary("ElementWiseAdd", var, float(node.args[4])))
    y = lw.node("ElementWiseMultiply", [d.name, r.name], v.shape)
    if w_node is not None:
        y = lw.binary("ElementWiseMultiply", y, lw.static(broadcast_const(w, rank, False), "gamma"))
    if b_node is not None:
        y = lw.binary("ElementWiseAdd", y, lw.static(broadcast_const(b, rank, False), "beta"))
    return (y, None, None)


def batch_norm(lw: Lowering, node: torch.fx.Node) -> tuple:
    x = lw.value(node.args[0])
    consts = [lw.const(a) if a is not None else None for a in node.args[1:5]]
    weight, bias, mean, var = consts
    if mean is None or var is None:
        raise LoweringError("batch norm statistics must be constants")
    c = static_shape(node.args[0])[1]
    eps = float(node.args[6])
    gamma = np.asarray(weight if weight is not None else np.ones(c), np.float64)
    beta = np.asarray(bias if bias is not None else np.zeros(c), np.float64)
    scale = gamma / np.sqrt(np.asarray(var, np.float64) + eps)
    shift = beta - np.asarray(mean, np.float64) * scale
    if len(x.shape) == 4:
        x = lw.nhwc(x)
        ins = [x.name, lw.static(scale.astype(np.float32), "bn_scale"), lw.static(shift.astype(np.float32), "bn_shift")]
        return (lw.node("Batchnorm", ins, x.qnn_shape, nhwc=True, logical=x.shape), None, None)
    raise LoweringError("batch norm of a non-4-D input is not lowered")


LOWERINGS = {"aten.native_layer_norm.default": layer_norm,
             "aten._native_batch_norm_legit_no_training.default": batch_norm}
