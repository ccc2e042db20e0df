"""``QnnBackend``'s capability table: edge ops -> QNN ``qti.aisw`` ops (float32 on the HTP).

Torch-free: constraints read only ``node.args`` / ``node.kwargs`` and ``meta["val"]``. The table says what the
lowering handles; the partitioner additionally asks the real backend (``backendValidateOpConfig``) about each
candidate node (:mod:`edgeport_qnn.partitioner`), so nothing the HTP refuses is claimed.
"""

from __future__ import annotations

from typing import Any

from edgeport.backend import CapabilityTable, OpCapability
from edgeport.constraints import (
    adaptive_avg_pool_1x1,
    alpha_one,
    avg_pool2d,
    conv2d,
    first_output_only,
    first_problem,
    gelu_erf_or_tanh,
    max_pool2d,
    max_rank,
    no_half_to_float,
    non_negative_padding,
    positive_step,
    static_shapes,
)
from edgeport.node_helpers import node_arg as arg
from edgeport.node_helpers import node_shape as shape_of

_F = ("float32",)


_static = static_shapes("QNN graphs here are static (export without Dim)")
_alpha = first_problem(alpha_one, _static)
_conv = first_problem(conv2d, _static)
_max_pool = first_problem(max_pool2d, _static)
_avg_pool = first_problem(avg_pool2d, _static)


def _expand(node: Any) -> str | None:
    src, out = shape_of(node.args[0]), shape_of(node)
    if src is None or out is None or len(src) > len(out) or len(out) > 4:
        return "expand of a dynamic shape or to more than 4 dimensions"
    lead = (1,) * (len(out) - len(src)) + tuple(src)
    if any(s != o and s != 1 for s, o in zip(lead, out)):
        return f"expand {list(src)} -> {list(out)}"
    return None


_softmax = first_problem(no_half_to_float, _static)
_layer_norm = first_problem(first_output_only, _static)


def _batch_norm(node: Any) -> str | None:
    s = shape_of(node.args[0])
    if s is None or len(s) != 4:
        return "batch norm of a non-4-D input"
    return first_output_only(node)


# a 5-D Reshape/Transpose validates on its own but can fail when the HTP prepares a larger graph
_rank = first_problem(max_rank(4), _static)


def _leaky(node: Any) -> str | None:
    slope = float(arg(node, 1, "negative_slope", 0.01))
    return None if 0.0 <= slope <= 1.0 else f"negative_slope {slope} outside [0, 1]"


def _pow(node: Any) -> str | None:
    e = node.args[1] if len(node.args) > 1 else None
    if not isinstance(e, (int, float)) or float(e) not in _POW_EXPONENTS:
        return f"exponent {e!r}: lowered only for {sorted(_POW_EXPONENTS)} (exact products, sqrt, rsqrt, reciprocal)"
    return _static(node)


_POW_EXPONENTS = frozenset({1.0, 2.0, 3.0, 0.5, -0.5, -1.0})


def _addmm(node: Any) -> str | None:
    beta, alpha = arg(node, 3, "beta", 1), arg(node, 4, "alpha", 1)
    if beta != 1 or alpha != 1:
        return f"addmm with beta={beta}, alpha={alpha} (only 1, 1)"
    return _static(node)


def _resize(node: Any) -> str | None:
    s = shape_of(node)
    if s is None or len(s) != 4:
        return "upsampling of a non-4-D tensor"
    return _static(node)


_pad = first_problem(non_negative_padding, _rank)
_slice = first_problem(positive_step, _rank)


_TABLE = (
    OpCapability("aten.add.Tensor", _F, _alpha, "ElementWiseAdd; broadcasting, constants"),
    OpCapability("aten.sub.Tensor", _F, _alpha, "ElementWiseSubtract"),
    OpCapability("aten.mul.Tensor", _F, _static, "ElementWiseMultiply"),
    OpCapability("aten.div.Tensor", _F, _static, "ElementWiseDivide"),
    OpCapability("aten.add.Scalar", _F, _alpha, "ElementWiseAdd with a static scalar"),
    OpCapability("aten.sub.Scalar", _F, _alpha, "ElementWiseSubtract with a static scalar"),
    OpCapability("aten.mul.Scalar", _F, _static, "ElementWiseMultiply with a static scalar"),
    OpCapability("aten.div.Scalar", _F, _static, "ElementWiseDivide with a static scalar"),
    OpCapability("aten.maximum.default", _F, _static, "ElementWiseMaximum"),
    OpCapability("aten.minimum.default", _F, _static, "ElementWiseMinimum"),
    OpCapability("aten.relu.default", _F, _static, "Relu"),
    OpCapability("aten.hardtanh.default", _F, _static, "ReluMinMax (relu6)"),
    OpCapability("aten.clamp.default", _F, _static, "ReluMinMax (both bounds) or ElementWiseMaximum/Minimum"),
    OpCapability("aten.leaky_relu.default", _F, _leaky, "ElementWiseMaximum(x, slope * x); 0 <= slope <= 1"),
    OpCapability("aten.exp.default", _F, _static, "ElementWiseExp"),
    OpCapability("aten.abs.default", _F, _static, "ElementWiseAbs"),
    OpCapability("aten.neg.default", _F, _static, "ElementWiseNeg"),
    OpCapability("aten.sqrt.default", _F, _static, "ElementWiseSquareRoot"),
    OpCapability("aten.reciprocal.default", _F, _static, "ElementWiseDivide (1 / x)"),
    OpCapability("aten.sign.default", _F, _static, "ElementWiseSign"),
    OpCapability("aten.sin.default", _F, _static, "ElementWiseSin"),
    OpCapability("aten.cos.default", _F, _static, "ElementWiseCos"),
    OpCapability("aten.pow.Tensor_Scalar", _F, _pow, "exponent 1, 2, 3 (products), 0.5 / -0.5 (SquareRoot / Rsqrt), -1"),
    OpCapability("aten.rsqrt.default", _F, _static, "ElementWiseRsqrt"),
    OpCapability("aten.sigmoid.default", _F, _static, "Sigmoid"),
    OpCapability("aten.tanh.default", _F, _static, "Tanh"),
    OpCapability("aten.hardswish.default", _F, _static, "HardSwish (kept whole)"),
    OpCapability("aten.gelu.default", _F, gelu_erf_or_tanh, "from fp32 elementwise ops (erf: A&S 7.1.26; tanh form: Tanh), kept whole"),
    OpCapability("aten.linear.default", _F, _static, "FullyConnected (kept whole); constant weights"),
    OpCapability("aten.addmm.default", _F, _addmm, "FullyConnected (constant mat2 and bias) or MatMul + ElementWiseAdd"),
    OpCapability("aten.mm.default", _F, _static, "MatMul"),
    OpCapability("aten.bmm.default", _F, _static, "MatMul (batched)"),
    OpCapability("aten.convolution.default", _F, _conv, "Conv2d / DepthWiseConv2d, NHWC; constant weights"),
    OpCapability("aten.max_pool2d.default", _F, _max_pool, "PoolMax2d (kept whole)"),
    OpCapability("aten.max_pool2d_with_indices.default", _F, _max_pool, "PoolMax2d; indices unused"),
    OpCapability("aten.avg_pool2d.default", _F, _avg_pool, "PoolAvg2d"),
    OpCapability("aten._adaptive_avg_pool2d.default", _F, adaptive_avg_pool_1x1, "ReduceMean over H, W; 1x1 only"),
    OpCapability("aten.mean.dim", _F, _static, "ReduceMean"),
    OpCapability("aten.upsample_bilinear2d.vec", _F, _resize, "ResizeBilinear, NHWC (half-pixel centres or aligned corners)"),
    OpCapability("aten.upsample_nearest2d.vec", _F, _resize, "ResizeNearestNeighbor, NHWC"),
    OpCapability("aten._softmax.default", _F, _softmax, "Softmax (other axes: Transpose around it)"),
    OpCapability("aten._log_softmax.default", _F, _softmax, "LogSoftmax (other axes: Transpose around it)"),
    OpCapability("aten.native_layer_norm.default", _F, _layer_norm, "ReduceMean + elementwise + Rsqrt (fp32); constant weight and bias"),
    OpCapability("aten._native_batch_norm_legit_no_training.default", _F, _batch_norm,
                 "Batchnorm (NHWC, folded scale and shift); 4-D"),
    OpCapability("aten.view_copy.default", _F, _rank, "Reshape"),
    OpCapability("aten.squeeze_copy.dims", _F, _rank, "Reshape"),
    OpCapability("aten.unsqueeze_copy.default", _F, _rank, "Reshape"),
    OpCapability("aten.expand_copy.default", _F, _expand, "Tile (after a Reshape to the output's rank); up to 4-D"),
    OpCapability("aten.split_with_sizes_copy.default", _F, _rank, "one StridedSlice per piece"),
    OpCapability("aten.permute_copy.default", _F, _rank, "Transpose"),
    OpCapability("aten.cat.default", _F, _static, "Concat"),
    OpCapability("aten.constant_pad_nd.default", _F, _pad, "Pad (constant); non-negative padding"),
    OpCapability("aten.clone.default", _F, _rank, "Reshape (a copy)"),
    OpCapability("aten.select_copy.int", _F, _rank, "StridedSlice + Reshape"),
    OpCapability("aten.slice_copy.Tensor", _F, _slice, "StridedSlice; step >= 1"),
)

_QIO = ("float32", "uint8", "int8", "int16", "uint16", "float64", "int32", "int64")


def _full_range(node: Any) -> str | None:
    import torch

    ranges = {(torch.uint8, 0, 255), (torch.int8, -128, 127), (torch.int32, 0, 65535), (torch.uint16, 0, 65535),
              (torch.int16, -32768, 32767)}
    per_channel = "per_channel" in str(node.target)
    qmin, qmax, dtype = node.args[4:7] if per_channel else node.args[3:6]
    if per_channel and dtype in (torch.int8, torch.int16):
        return None
    if (dtype, int(qmin), int(qmax)) not in ranges:
        return (f"quantization range [{qmin}, {qmax}] of {dtype}: full-range uint8 / int8 / int16, or [0, 65535] "
                "in int32 (16-bit activations)")
    return None


_QUANT = (
    OpCapability("quantized_decomposed.quantize_per_tensor.default", _QIO, _full_range,
                 "Quantize (or nothing, after an op that runs quantized)"),
    OpCapability("quantized_decomposed.dequantize_per_tensor.default", _QIO, _full_range,
                 "no operator for quantized consumers; Dequantize for float ones"),
    OpCapability("quantized_decomposed.dequantize_per_channel.default", _QIO, _full_range,
                 "int8 / int16 per-channel weights of conv / linear (QNN per-axis)"),
)
QUANTIZE, DEQUANTIZE, DEQUANTIZE_PER_CHANNEL = (c.op for c in _QUANT)
#: the float table plus pt2e's quantize / dequantize nodes (what the partitioner uses)
ALL_CAPABILITIES = CapabilityTable(_TABLE + _QUANT)

#: weights that must be constants, by op: argument positions
CONSTANT_ARGS = {"aten.convolution.default": (1, 2), "aten.linear.default": (1, 2),
                 "aten.native_layer_norm.default": (2, 3),
                 "aten._native_batch_norm_legit_no_training.default": (1, 2, 3, 4)}


def capabilities() -> CapabilityTable:
    """The float ops (what the conformance suite checks); quantize/dequantize are in :data:`ALL_CAPABILITIES`."""
    return CapabilityTable(_TABLE)
