"""``cat`` -> TOSA CONCAT (in NHWC when every input lives there). Integer inputs are first brought to one set
of quantization parameters: the following quantize's, else the first input's."""

from __future__ import annotations

import torch

from edgeport.errors import LoweringError
from edgeport_arm.preprocess.graph import Op
from edgeport_arm.preprocess.lowering import Lowering, static_shape
from edgeport_arm.preprocess.ops._common import arg, output_qparams
from edgeport_arm.preprocess.values import NCHW_TO_NHWC, Value


def cat(ctx: Lowering, node: torch.fx.Node) -> Value:
    values = [ctx.settle(ctx.value(n)) for n in node.args[0]]
    shape = static_shape(node)
    dim = int(arg(node, 1, "dim", 0)) % len(shape)
    if ctx.integer:
        if any(v.q is None for v in values):
            raise LoweringError("integer cat needs dequantized int8 inputs")
        values = ctx.same_q(values, output_qparams(node) or values[0].q)
    if len(shape) == 4 and all(v.nhwc for v in values):
        axis, out_shape, nhwc = NCHW_TO_NHWC.index(dim), tuple(shape[i] for i in NCHW_TO_NHWC), True
    else:
        values = [ctx.nchw(v) for v in values]
        axis, out_shape, nhwc = dim, shape, False
    out = ctx.g.tensor(out_shape, values[0].dtype)
    ctx.g.op(Op.CONCAT, [v.name for v in values], [out], "ConcatAttribute", axis=axis)
    return values[0].with_(name=out, shape=out_shape, nhwc=nhwc)
