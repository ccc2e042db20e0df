"""linear / addmm / mm -> XNNFullyConnected (filter [out, in]; a non-constant right operand uses
XNN_FLAG_TRANSPOSE_WEIGHTS with a [in, out] filter, as ExecuTorch lowers mm)."""

from __future__ import annotations

from typing import Any

import torch

from edgeport_xnnpack.preprocess.builder import NCHW, GraphBuilder
from edgeport_xnnpack.preprocess.registry import lowers
from edgeport_xnnpack.preprocess.views import FcInfo
from edgeport_xnnpack.schema.graph import INVALID_ID

TRANSPOSE_WEIGHTS = 0x1


def _fc(b: GraphBuilder, node: Any, x: Any, weight: Any, bias: Any, weight_is_in_out: bool) -> None:
    xv = b.value(x, NCHW)
    flags = 0
    if b.is_constant(weight):
        w = b.tensor(weight).detach().to(torch.float32)
        filter_id = b.constant_array((w.t() if weight_is_in_out else w).contiguous().numpy())
    else:
        filter_id = b.value(weight, NCHW).id
        flags = TRANSPOSE_WEIGHTS if weight_is_in_out else 0
    out = b.output_of(node)
    n_out = out.shape[-1]
    bias_id, extra = INVALID_ID, None
    if bias is not None and not b.is_constant(bias):
        extra = b.value(bias, NCHW).id  # a runtime bias: added after the fully connected node
    elif bias is not None:
        t = b.tensor(bias).detach().to(torch.float32)
        if t.numel() == n_out and (t.dim() <= 1 or (t.dim() == 2 and t.shape[0] == 1)):
            bias_id = b.constant_array(t.reshape(-1).numpy())
        else:
            extra = b.constant_array(t.numpy())
    fc_out = out if extra is None else b.new_val(out.shape)
    b.add("XNNFullyConnected", input1_id=xv.id, filter_id=filter_id, bias_id=bias_id, output_id=fc_out.id,
          flags=flags)
    if b.views is not None and flags == 0 and extra is None and b.is_constant(weight):
        wt = b.tensor(weight).detach().to(torch.float32)
        wt = (wt.t() if weight_is_in_out else wt).contiguous().numpy()
        bt = None if bias_id == INVALID_ID else b.tensor(bias).detach().to(torch.float32).reshape(-1).numpy()
        b.views.fc[fc_out.id] = FcInfo(xv.id, wt, bt, 0, None)
    if extra is not None:
        b.add("XNNAdd", input1_id=fc_out.id, input2_id=extra, output_id=out.id, flags=0)
    b.set(node, out)


@lowers("aten.linear.default")
def linear(b: GraphBuilder, node: Any) -> None:
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    _fc(b, node, node.args[0], node.args[1], bias, weight_is_in_out=False)


@lowers("aten.addmm.default")
def addmm(b: GraphBuilder, node: Any) -> None:
    _fc(b, node, node.args[1], node.args[2], node.args[0], weight_is_in_out=True)


@lowers("aten.mm.default")
def mm(b: GraphBuilder, node: Any) -> None:
    _fc(b, node, node.args[0], node.args[1], None, weight_is_in_out=True)
