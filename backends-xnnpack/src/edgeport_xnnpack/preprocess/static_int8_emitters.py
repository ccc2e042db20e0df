"""Emitters of the static int8 ops a :class:`~edgeport_xnnpack.preprocess.static_int8_plan.QuantPlan` picked.

One function per op kind writes its XNNPACK node(s) reading and writing ``qint8`` values: int8 filters
(``qcint8`` / ``qint8``) and int32 biases are made here, a linear is a 1x1 convolution between free reshapes, and
:func:`qconvert` changes an int8 value's layout. See :mod:`edgeport_xnnpack.preprocess.quantized` for the whole
int8 lowering.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from edgeport.aot.capability_partitioner import op_name
from edgeport.errors import LoweringError
from edgeport_xnnpack.preprocess.builder import KEEP_DIMS, NCHW, NHWC, GraphBuilder, Val
from edgeport_xnnpack.preprocess.quant_values import QOp, is_quantized, new_qval, qparams_of
from edgeport_xnnpack.preprocess.quant_values import new_constant as _constant
from edgeport_xnnpack.preprocess.quant_values import new_value as _new_value
from edgeport_xnnpack.preprocess.quant_values import qarg as _arg
from edgeport_xnnpack.schema.graph import (
    FP32,
    INVALID_ID,
    QCINT8,
    QCINT32,
    QINT8,
    QINT32,
    PerChannelQuant,
    PerTensorQuant,
)

BINARY_NODES = {"aten.add.Tensor": "XNNAdd", "aten.sub.Tensor": "XNNSubtract", "aten.mul.Tensor": "XNNMultiply"}
"""Elementwise binary op -> the XNNPACK node lowering it (in int8 as in float32)."""


# -- values ---------------------------------------------------------------------------------------------------

def qconvert(b: GraphBuilder, v: Val, layout: str) -> Val:
    """The int8 value ``v`` in ``layout``: a free reshape when no byte moves, else float32 around a transpose
    (edgeport's runtime transposes on the host, in float32 only)."""
    if v.layout == layout or len(v.shape) != 4:
        return v
    key = (v.id, layout)
    if key not in b._converted:
        params = qparams_of(b, v)
        out = new_qval(b, v.shape, layout, params)
        _, c, h, w = v.shape
        if c == 1 or h * w == 1:
            b.add("XNNStaticReshape", num_dims=4, new_shape=out.dims, input_id=v.id, output_id=out.id, flags=0)
        else:
            f = Val(-1, v.layout, v.shape)
            f.id = _new_value(b, FP32, v.dims, None)
            b.add("XNNConvert", input_id=v.id, output_id=f.id, flags=0)
            t = b.convert(f, layout)
            b.add("XNNConvert", input_id=t.id, output_id=out.id, flags=0)
        b._converted[key] = out
    return b._converted[key]


def qinput(b: GraphBuilder, dq: torch.fx.Node) -> Val:
    """The int8 value a dequantize node ``dq`` reads (it must have been lowered in int8)."""
    src = dq.args[0]
    if src not in b.env or not is_quantized(b, b.env[src]):
        raise LoweringError(f"{dq.name}: its int8 input {getattr(src, 'name', src)} was not lowered in int8")
    return b.env[src]


def _publish(b: GraphBuilder, op: QOp, out: Val) -> None:
    """``out`` is the value of the op, its fused clamps and the quantize nodes after it."""
    b.set(op.node, out)  # (max_pool2d_with_indices: the lowering loop aliases its getitem)
    for n in (*op.fused, *op.quants):
        b.set(n, out)


# -- emitters -------------------------------------------------------------------------------------------------
def _weight_values(b: GraphBuilder, op: QOp, filt: torch.Tensor, channel_dim: int) -> tuple[int, int]:
    """(filter id, bias id) of a convolution: int8 filter ``filt`` (already in XNNPACK's layout), int32 bias."""
    w = op.weight
    assert w is not None
    data = filt.detach().to(torch.int8).contiguous().numpy()
    in_scale = op.in_params[0].scale
    if w.per_channel:
        scales = w.scales.astype(np.float32)
        filter_id = _constant(b, data, QCINT8, PerChannelQuant([float(s) for s in scales], channel_dim, 0, len(scales)))
    else:
        filter_id = _constant(b, data, QINT8, PerTensorQuant(float(w.scales[0]), 0))
    if op.bias is None:
        return filter_id, INVALID_ID
    bias_scales = (w.scales.astype(np.float64) * in_scale).reshape(-1)
    if op.bias.dtype == torch.int32:  # the quantizer's int32 bias: exactly what the pt2e model adds
        q = op.bias.numpy().astype(np.int32).reshape(-1)
    else:  # a float bias (another quantizer's): rounded here
        raw = op.bias.detach().to(torch.float64).reshape(-1).numpy() / bias_scales
        q = np.clip(np.rint(raw), -(2**31), 2**31 - 1).astype(np.int32)
    if w.per_channel:
        bias_id = _constant(b, q, QCINT32, PerChannelQuant([float(s) for s in bias_scales.astype(np.float32)], 0, 0, len(bias_scales)))
    else:
        bias_id = _constant(b, q, QINT32, PerTensorQuant(float(bias_scales[0]), 0))
    return filter_id, bias_id


def _emit_conv(b: GraphBuilder, op: QOp) -> None:
    node = op.node
    x, _, _, stride, padding, dilation, _, _, groups = node.args
    w = op.weight.data
    cout, cin_g, kh, kw = w.shape
    cin = x.meta["val"].shape[1]
    depthwise = groups > 1 and groups == cin and cin_g == 1
    filt = w.permute(1, 2, 3, 0) if depthwise else w.permute(0, 2, 3, 1)
    filter_id, bias_id = _weight_values(b, op, filt, 3 if depthwise else 0)
    xin = qconvert(b, qinput(b, op.inputs[0]), NHWC)
    out = new_qval(b, tuple(op.last.meta["val"].shape), NHWC, op.out)
    b.add("XNNDepthwiseConv2d" if depthwise else "XNNConv2d", minmax=op.minmax,
          padding_top=padding[0], padding_bottom=padding[0], padding_left=padding[1], padding_right=padding[1],
          kernel_height=kh, kernel_width=kw, subsampling_height=stride[0], subsampling_width=stride[1],
          dilation_height=dilation[0], dilation_width=dilation[1],
          group_input_channels=cin_g, group_output_channels=cout // groups, groups=groups,
          input1_id=xin.id, filter_id=filter_id, bias_id=bias_id, output_id=out.id, flags=0)
    _publish(b, op, out)


def _emit_linear(b: GraphBuilder, op: QOp) -> None:
    """A linear as a 1x1 convolution over [M, 1, 1, K] (reshapes of int8 values move no byte)."""
    w = op.weight.data
    n_out, k = w.shape
    xin = qconvert(b, qinput(b, op.inputs[0]), NCHW)
    m = math.prod(xin.shape[:-1])
    if xin.shape[-1] != k:
        raise LoweringError(f"{op.node.name}: input {list(xin.shape)} does not match weight {list(w.shape)}")
    filter_id, bias_id = _weight_values(b, op, w.reshape(n_out, 1, 1, k), 0)
    x4 = new_qval(b, (m, k, 1, 1), NHWC, op.in_params[0])
    b.add("XNNStaticReshape", num_dims=4, new_shape=x4.dims, input_id=xin.id, output_id=x4.id, flags=0)
    y4 = new_qval(b, (m, n_out, 1, 1), NHWC, op.out)
    b.add("XNNConv2d", minmax=op.minmax, padding_top=0, padding_bottom=0, padding_left=0, padding_right=0,
          kernel_height=1, kernel_width=1, subsampling_height=1, subsampling_width=1, dilation_height=1,
          dilation_width=1, group_input_channels=k, group_output_channels=n_out, groups=1,
          input1_id=x4.id, filter_id=filter_id, bias_id=bias_id, output_id=y4.id, flags=0)
    shape = tuple(op.last.meta["val"].shape)
    out = new_qval(b, shape, NCHW, op.out)
    b.add("XNNStaticReshape", num_dims=len(out.dims), new_shape=out.dims, input_id=y4.id, output_id=out.id,
          flags=0)
    _publish(b, op, out)


def _emit_binary(b: GraphBuilder, op: QOp) -> None:
    vals = [qinput(b, dq) for dq in op.inputs]
    shape = tuple(op.last.meta["val"].shape)
    layout = NHWC if len(shape) == 4 and any(v.layout == NHWC for v in vals) else NCHW
    vals = [qconvert(b, v, layout) for v in vals]
    out = new_qval(b, shape, layout, op.out)
    b.add(BINARY_NODES[op_name(op.node.target)], minmax=op.minmax, input1_id=vals[0].id, input2_id=vals[1].id,
          output_id=out.id, flags=0)
    _publish(b, op, out)


def _arg_pair(v: Any, default: Any) -> list[int]:
    if v is None or (isinstance(v, (list, tuple)) and not v):
        v = default
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * 2 if len(v) == 1 else v


def _emit_maxpool(b: GraphBuilder, op: QOp) -> None:
    node = op.node
    kernel = _arg_pair(node.args[1], None)
    stride = _arg_pair(_arg(node, 2, "stride"), kernel)
    padding = _arg_pair(_arg(node, 3, "padding", 0), [0])
    dilation = _arg_pair(_arg(node, 4, "dilation", 1), [1])
    xin = qconvert(b, qinput(b, op.inputs[0]), NHWC)
    out = new_qval(b, tuple(op.last.meta["val"].shape), NHWC, op.out)
    b.add("XNNMaxPooling2d", padding_top=padding[0], padding_bottom=padding[0], padding_left=padding[1],
          padding_right=padding[1], pooling_height=kernel[0], pooling_width=kernel[1], stride_height=stride[0],
          stride_width=stride[1], dilation_height=dilation[0], dilation_width=dilation[1], input_id=xin.id,
          output_id=out.id, flags=KEEP_DIMS)
    _publish(b, op, out)


def _emit_gap(b: GraphBuilder, op: QOp) -> None:
    xin = qconvert(b, qinput(b, op.inputs[0]), NHWC)
    n, c = xin.shape[0], xin.shape[1]
    pooled = new_qval(b, (n, c, 1, 1), NHWC, op.out)
    b.add("XNNGlobalAvgPooling2d", input_id=xin.id, output_id=pooled.id, flags=KEEP_DIMS)
    shape = tuple(op.last.meta["val"].shape)
    if len(shape) == 4:
        _publish(b, op, pooled)
        return
    out = new_qval(b, shape, NCHW, op.out)  # [N, 1, 1, C] and [N, C] share their bytes
    b.add("XNNStaticReshape", num_dims=len(shape), new_shape=list(shape), input_id=pooled.id, output_id=out.id,
          flags=0)
    _publish(b, op, out)


def _emit_reshape(b: GraphBuilder, op: QOp) -> None:
    src = qinput(b, op.inputs[0])
    shape = tuple(op.last.meta["val"].shape)
    if shape == src.shape:
        out = new_qval(b, shape, src.layout, op.out)
    else:
        src = qconvert(b, src, NCHW)
        out = new_qval(b, shape, NCHW, op.out)
    b.add("XNNStaticReshape", num_dims=len(out.dims), new_shape=out.dims, input_id=src.id, output_id=out.id,
          flags=0)
    _publish(b, op, out)


def _emit_clamp(b: GraphBuilder, op: QOp) -> None:
    src = qinput(b, op.inputs[0])
    out = new_qval(b, src.shape, src.layout, op.out)
    b.add("XNNClamp", minmax=op.minmax or (-math.inf, math.inf), input_id=src.id, output_id=out.id, flags=0)
    _publish(b, op, out)


EMITTERS = {"conv": _emit_conv, "linear": _emit_linear, "binary": _emit_binary, "maxpool": _emit_maxpool,
             "gap": _emit_gap, "reshape": _emit_reshape, "clamp": _emit_clamp}
"""Op kind of a :class:`~edgeport_xnnpack.preprocess.quant_values.QOp` -> its emitter."""
