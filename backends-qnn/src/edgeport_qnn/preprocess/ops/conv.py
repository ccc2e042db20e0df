"""2-D convolution (``Conv2d``; depthwise: ``DepthWiseConv2d``), NHWC activations, filters [h, w, in, out].

Measured on the HTP (QAIRT 2.51 emulator): a float32 ``DepthWiseConv2d`` with more than 32 channels and a dilation
of 3 or more computes garbage (errors of 1e0 to 1e34 and NaN, e.g. MobileNetV2 + DeepLabV3's dilation-4 blocks),
while ``Conv2d`` with ``group`` = channels computes the same convolution exactly (1e-7) and dilation 1-2 depthwise
is exact too. So float depthwise convolutions dilated by more than :data:`MAX_DEPTHWISE_DILATION` are ``Conv2d``
with groups. (8-bit quantized ``DepthWiseConv2d`` is correct at any dilation: ``ops/quant.py`` keeps it.)
"""

from __future__ import annotations

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_qnn.preprocess.lowering import Lowering, Val, arg, static_shape
from edgeport_qnn.preprocess.ops._common import pair, u32

#: Largest dilation a float32 ``DepthWiseConv2d`` computes correctly on the HTP (see the module docstring).
MAX_DEPTHWISE_DILATION = 2


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
    depthwise = groups > 1 and groups == x.shape[1] and w.shape[1] == 1 and max(dilation) <= MAX_DEPTHWISE_DILATION
    if depthwise:
        op = "DepthWiseConv2d"
    else:
        op = "Conv2d"
        params["group"] = groups
    ins = [x.name, lw.static(filt, "filter"), lw.static(bias, "bias")]
    return lw.node(op, ins, (out[0], out[2], out[3], out[1]), params, nhwc=True)


LOWERINGS = {"aten.convolution.default": convolution}
