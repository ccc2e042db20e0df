"""Batch norm (inference): folded into the preceding convolution, else a per-channel multiply and add."""

from __future__ import annotations

from typing import Any

import torch

from edgeport_xnnpack.preprocess.builder import NHWC, GraphBuilder
from edgeport_xnnpack.preprocess.ops.conv import emit_conv
from edgeport_xnnpack.preprocess.registry import lowers


@lowers("aten._native_batch_norm_legit_no_training.default")
def batch_norm(b: GraphBuilder, node: Any) -> None:
    x, weight, bias, mean, var = node.args[:5]
    eps = node.args[6] if len(node.args) > 6 else node.kwargs.get("eps", 1e-5)
    f64 = torch.float64
    scale = b.tensor(weight).to(f64) / torch.sqrt(b.tensor(var).to(f64) + eps)
    shift = b.tensor(bias).to(f64) - b.tensor(mean).to(f64) * scale
    conv = x if b.fold.get(x) is node else None
    if conv is not None:
        w = b.tensor(conv.args[1]).to(f64) * scale.reshape(-1, 1, 1, 1)
        cb = b.tensor(conv.args[2]).to(f64) if conv.args[2] is not None else torch.zeros_like(scale)
        emit_conv(b, conv, node, w.to(torch.float32), (cb * scale + shift).to(torch.float32))
        return
    xv = b.val(x)
    nhwc = xv.layout == NHWC
    shape = (-1,) if nhwc else (-1, 1, 1)
    s_id = b.constant_array(scale.to(torch.float32).numpy().reshape(shape))
    t_id = b.constant_array(shift.to(torch.float32).numpy().reshape(shape))
    mid = b.new_val(xv.shape, xv.layout)
    out = b.new_val(xv.shape, xv.layout)
    b.add("XNNMultiply", input1_id=xv.id, input2_id=s_id, output_id=mid.id, flags=0)
    b.add("XNNAdd", input1_id=mid.id, input2_id=t_id, output_id=out.id, flags=0)
    b.set(node, out)
