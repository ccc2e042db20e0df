"""2-D convolution (``Conv2d``; depthwise: ``DepthWiseConv2d``), NHWC activations, filters [h, w, in, out]."""

from __future__ import annotations

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_qnn.preprocess.lowering import Lowering, Val, arg, static_shape
from edgeport_qnn.preprocess.ops._common import pair, u32


def convolution(lw: Lowering, node: torch.fx.Node) -> Val:
    x = lw.nhwc(lw.value(node.args[0]))
    w = lw.const(node.args[1])
    if w is None or w.ndim != 4:
        raise LoweringError("convolution weights must be a constant 4-D tensor")
    b = lw.const(node.args[2]) if node.args[2] is not None else None
    stride, padding, dilation = (pair(arg(node, i, n, d)) for i, n, d in ((3, "stride", 1), (4, "padding", 0),
                                                                            (5, "dilation", 1)))
    groups = int(arg(node, 8, "groups", 1))
    out = static_shape(node)
    cout = w.shape[0]
    filt = np.ascontiguousarray(np.asarray(w, np.float32).transpose(2, 3, 1, 0))  # [kh, kw, in/groups, out]
    bias = np.asarray(b if b is not None else np.zeros(cout), np.float32)
    params = {"stride": u32(stride), "pad_amount": u32([[padding[0]] * 2, [padding[1]] * 2]),
              "dilation": u32(dilation)}
    depthwise = groups > 1 and groups == x.shape[1] and w.shape[1] == 1
    if depthwise:
        op = "DepthWiseConv2d"
    else:
        op = "Conv2d"
        params["group"] = groups
    ins = [x.name, lw.static(filt, "filter"), lw.static(bias, "bias")]
    return lw.node(op, ins, (out[0], out[2], out[3], out[1]), params, nhwc=True)


LOWERINGS = {"aten.convolution.default": convolution}
