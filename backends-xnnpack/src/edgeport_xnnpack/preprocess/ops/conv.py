"""aten.convolution (2-D) -> XNNConv2d / XNNDepthwiseConv2d on NHWC; weights OHWI / 1HWO."""

from __future__ import annotations

from typing import Any

import torch

from edgeport.errors import LoweringError
from edgeport_xnnpack.preprocess.builder import NHWC, GraphBuilder
from edgeport_xnnpack.preprocess.registry import lowers
from edgeport_xnnpack.schema.graph import INVALID_ID


def emit_conv(b: GraphBuilder, node: Any, out_node: Any, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Emit ``node``'s convolution with ``weight``/``bias`` (possibly batch-norm folded) as ``out_node``'s value."""
    x, _, _, stride, padding, dilation, transposed, _, groups = node.args
    if transposed:
        raise LoweringError(f"{node.name}: transposed convolution is not supported")
    cout, cin_g, kh, kw = weight.shape
    cin = x.meta["val"].shape[1]
    depthwise = groups > 1 and groups == cin and cin_g == 1
    w = weight.detach().to(torch.float32)
    filt = w.permute(1, 2, 3, 0) if depthwise else w.permute(0, 2, 3, 1)
    filter_id = b.constant_array(filt.contiguous().numpy())
    bias_id = INVALID_ID if bias is None else b.constant_array(bias.detach().to(torch.float32).numpy())
    xin = b.value(x, NHWC)
    out = b.output_of(out_node, NHWC)
    b.add(
        "XNNDepthwiseConv2d" if depthwise else "XNNConv2d",
        padding_top=padding[0], padding_bottom=padding[0], padding_left=padding[1], padding_right=padding[1],
        kernel_height=kh, kernel_width=kw, subsampling_height=stride[0], subsampling_width=stride[1],
        dilation_height=dilation[0], dilation_width=dilation[1],
        group_input_channels=cin_g, group_output_channels=cout // groups, groups=groups,
        input1_id=xin.id, filter_id=filter_id, bias_id=bias_id, output_id=out.id, flags=0,
    )
    b.set(out_node, out)


@lowers("aten.convolution.default")
def convolution(b: GraphBuilder, node: Any) -> None:
    bias = b.tensor(node.args[2]) if node.args[2] is not None else None
    emit_conv(b, node, node, b.tensor(node.args[1]), bias)
