"""Int8 lowering: ``dequantize -> op -> quantize`` patterns become XNNPACK's int8 (qs8 / qc8) nodes.

A graph quantized by :class:`~edgeport_xnnpack.quantizer.XnnpackQuantizer` (torchao ``convert_pt2e``) holds
float ops between ``quantized_decomposed`` quantize / dequantize nodes. :class:`QuantPlan` looks at each op
before lowering; it is lowered in int8 when

* every activation input is a ``dequantize_per_tensor`` (int8) of a value computed in the delegate,
* weights (convolution, linear) are ``dequantize_per_channel`` (axis 0) or ``dequantize_per_tensor`` of
  constant int8 data with zero points 0, and a bias is a float constant (quantized here to int32 with scale
  ``input_scale * weight_scale``),
* its result (after a fused relu / hardtanh / clamp, for convolution, linear and add/sub/mul) is read only by
  ``quantize_per_tensor`` nodes with one set of parameters, and is not an output of the delegate,
* ops that only move values (max pooling, reshape, standalone clamp) keep their input's parameters, and the
  scale ratios are within what XNNPACK's int8 kernels accept.

The op then reads and writes ``qint8`` values; the dequantize nodes before it and the quantize nodes after it
emit nothing. Weights become ``qcint8`` (per channel; ``channel_dim`` 0, or 3 for a depthwise filter) or
``qint8`` values, biases ``qcint32`` / ``qint32``. A linear is emitted as a 1x1 ``XNNConv2d`` between two free
reshapes: the 2022 libXNNPACK has no per-channel int8 fully connected (and both runtimes run int8 convolutions).

Everything else stays float32: a quantize node whose producer was not lowered in int8 becomes an
``XNNConvert`` (float32 -> qint8), a dequantize read by a float op (or leaving the delegate) an ``XNNConvert``
back, and a dequantize of constants is folded into a float32 constant. Int8 values never go through a host
step on edgeport's runtime: a layout change that moves bytes converts to float32 and back around the transpose.

The planning is in :mod:`~edgeport_xnnpack.preprocess.static_int8_plan`, the int8 nodes' emitters in
:mod:`~edgeport_xnnpack.preprocess.static_int8_emitters`; this module lowers the quantize / dequantize nodes that
stay (float32 <-> int8 conversions) and re-exports :class:`QuantPlan` and :func:`qconvert`.
"""

from __future__ import annotations

from typing import Any

from edgeport.errors import LoweringError
from edgeport_xnnpack.preprocess.builder import NCHW, NHWC, GraphBuilder, Val
from edgeport_xnnpack.preprocess.quant_values import DQ, DQC, Q, is_quantized, new_qval, per_tensor_params
from edgeport_xnnpack.preprocess.quant_values import new_value as _new_value
from edgeport_xnnpack.preprocess.registry import lowers
from edgeport_xnnpack.preprocess.static_int8_emitters import qconvert, qinput
from edgeport_xnnpack.preprocess.static_int8_plan import QuantPlan
from edgeport_xnnpack.schema.graph import FP32

__all__ = ["QuantPlan", "dequantize", "dequantize_per_channel", "qconvert", "quantize"]


# -- quantize / dequantize nodes that stay (float32 <-> int8 conversions) -------------------------------------
@lowers(Q)
def quantize(b: GraphBuilder, node: Any) -> None:
    params = per_tensor_params(node)
    if params is None:
        raise LoweringError(f"{node.name}: only int8 per-tensor quantization with scalar parameters")
    src = b.val(node.args[0])
    if is_quantized(b, src):
        raise LoweringError(f"{node.name}: quantizes a value that is already int8")
    plan = getattr(b, "quant_plan", None)
    if len(src.shape) == 4 and src.layout == NCHW and plan is not None and plan.wants_nhwc(node):
        src = b.convert(src, NHWC)  # transpose in float32, then quantize
    out = new_qval(b, src.shape, src.layout, params)
    b.add("XNNConvert", input_id=src.id, output_id=out.id, flags=0)
    b.set(node, out)


@lowers(DQ)
def dequantize(b: GraphBuilder, node: Any) -> None:
    if per_tensor_params(node) is None:
        raise LoweringError(f"{node.name}: only int8 per-tensor dequantization with scalar parameters")
    src = qinput(b, node)
    out = Val(-1, src.layout, src.shape)
    out.id = _new_value(b, FP32, src.dims, None)
    b.add("XNNConvert", input_id=src.id, output_id=out.id, flags=0)
    b.set(node, out)


@lowers(DQC)
def dequantize_per_channel(b: GraphBuilder, node: Any) -> None:
    raise LoweringError(f"{node.name}: per-channel dequantization of a non-constant (only weights are supported)")
