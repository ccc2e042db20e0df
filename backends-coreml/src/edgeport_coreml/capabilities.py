"""``CoreMLBackend``'s capability table: the edge-dialect ops coremltools 9.0's torch frontend converts.

Torch-free: constraints read only ``node.args`` / ``node.kwargs`` and ``meta["val"]``. Every row is checked by
lowering one-op programs (edgeport's conformance cases, several shapes and arguments per op) through
``coremltools.convert(..., convert_to="mlprogram")`` -- the slow ``backends-coreml/tests/test_conformance.py``;
the partitioner also asks coremltools' ``is_torch_fx_node_supported`` for each node, so a row never claims more
than the frontend has. Float32 tensors only: with float16 graph inputs coremltools 9.0 mixes fp16 tensors with
fp32 scalars and fails (``addmm``, ``leaky_relu``, ``hardtanh``); fp16 *compute* is the compile spec
``compute_precision="float16"``, with float32 inputs and outputs. Restrictions
follow what the frontend (or ExecuTorch's ``CoreMLPartitioner``) refuses: ``add``/``sub`` with ``alpha != 1``,
``argmax``/``argmin`` over the flattened input, ``max_pool2d_with_indices`` whose indices are used, batch norm's
saved statistics.
"""

from __future__ import annotations

from typing import Any

from edgeport.backend import CapabilityTable, OpCapability
from edgeport.constraints import alpha_one, first_output_only, first_problem, max_rank, no_half_to_float
from edgeport.node_helpers import node_arg as arg
from edgeport.node_helpers import node_shape as shape_of
from edgeport.node_helpers import node_value

_F = ("float32",)
_FB = ("float32", "bool")
#: integer tensors (token ids, positions, masks) convert as Core ML int32 (coremltools narrows int64)
_FI = ("float32", "int64", "int32")
_ANY = ("float32", "int64", "int32", "bool")
_B = ("bool",)
_MAX_RANK = 5


_rank = max_rank(_MAX_RANK, "Core ML tensors have rank 5 at most")


def _alpha(node: Any) -> str | None:
    return "alpha != 1 (coremltools has no scaled add/sub)" if alpha_one(node) else _rank(node)


def _float_input(node: Any) -> str | None:
    val = node_value(node.args[0]) if node.args else None
    dtype = str(getattr(val, "dtype", "")).removeprefix("torch.")
    if dtype != "float32":
        return f"input dtype {dtype or 'unknown'}: Core ML pooling takes float tensors only"
    return _values_only(node)


_values_only = first_problem(first_output_only, _rank)


_Q_TENSOR = "quantized_decomposed.quantize_per_tensor.default"
_DQ_TENSOR = "quantized_decomposed.dequantize_per_tensor.default"
_DQ_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"
#: pt2e quantization ops: they convert as patterns (coremltools' ``is_torch_fx_node_supported`` says no to them).
QUANT_OPS = (_Q_TENSOR, _DQ_TENSOR, _DQ_CHANNEL)
_Q8 = ("torch.int8", "torch.uint8")


def _target(node: Any) -> str:
    t = getattr(node, "target", None)
    return str(t) if t is not None else ""


def _quantize(node: Any) -> str | None:
    dtype = str(arg(node, 5, "dtype"))
    if dtype not in _Q8:
        return f"quantizes to {dtype}: Core ML's quantize op takes int8 / uint8"
    users = list(getattr(node, "users", {}))
    if not users or any(_target(u) != _DQ_TENSOR for u in users):
        return "a quantize whose result is not only dequantized (the delegate would return integer tensors)"
    return None


def _dequantize_tensor(node: Any) -> str | None:
    if str(arg(node, 5, "dtype")) not in _Q8:
        return f"dequantizes {arg(node, 5, 'dtype')}: int8 / uint8 only"
    if _target(node.args[0]) != _Q_TENSOR:
        return "dequantizes a tensor that no quantize in the graph made (an integer input)"
    return None


def _dequantize_channel(node: Any) -> str | None:
    if str(arg(node, 6, "dtype")) not in _Q8:
        return f"dequantizes {arg(node, 6, 'dtype')}: int8 / uint8 only"
    if any(getattr(a, "op", None) != "placeholder" for a in node.args[:3]):
        return "per-channel dequantize of a computed tensor: only constant (weight) tensors"
    return None


def _conv(node: Any) -> str | None:
    w = shape_of(node.args[1])
    if w is None or len(w) not in (3, 4, 5):
        return "only 1-D, 2-D and 3-D convolutions with static weight shapes"
    return _rank(node)


def _index_put(node: Any) -> str | None:
    """``index_put`` (a buffer write such as a KV cache update): scatter_nd; no accumulation, tensor indices."""
    if arg(node, 3, "accumulate", False):
        return "accumulate=True (Core ML's scatter_nd here overwrites)"
    indices = node.args[1] if len(node.args) > 1 else []
    if not indices or any(i is None for i in indices):
        return "indices with None entries (slices) are not converted"
    val = getattr(node, "meta", {}).get("val")
    if val is None or str(val.dtype) != "torch.float32":
        return "writes a non-float32 tensor (int64 is allowed for the indices only)"
    return _rank(node)


_softmax = first_problem(no_half_to_float, _rank)


_TABLE = (
    OpCapability("aten.convolution.default", _F, _conv, "conv / conv_transpose"),
    OpCapability("aten.index_put.default", ("float32", "int64"), _index_put, "scatter_nd (writes into a buffer: Core ML state "
                 "with take_over_mutable_buffer on iOS18+)"),
    OpCapability("aten.linear.default", _F, _rank, "linear"),
    OpCapability("aten.addmm.default", _F, _rank, "linear (bias + mat1 @ mat2)"),
    OpCapability("aten.mm.default", _F, _rank, "matmul"),
    OpCapability("aten.bmm.default", _F, _rank, "matmul"),
    OpCapability("aten.add.Tensor", _FI, _alpha, "add"),
    OpCapability("aten.sub.Tensor", _FI, _alpha, "sub"),
    OpCapability("aten.mul.Tensor", _FI, _rank, "mul"),
    OpCapability("aten.div.Tensor", _F, _rank, "real_div"),
    OpCapability("aten.add.Scalar", _FI, _alpha, "add"),
    OpCapability("aten.mul.Scalar", _FI, _rank, "mul"),
    OpCapability("aten.div.Scalar", _F, _rank, "real_div"),
    OpCapability("aten.maximum.default", _FI, _rank, "maximum"),
    OpCapability("aten.minimum.default", _FI, _rank, "minimum"),
    OpCapability("aten.pow.Tensor_Scalar", _F, _rank, "pow"),
    OpCapability("aten.relu.default", _F, _rank, "relu"),
    OpCapability("aten.hardtanh.default", _F, _rank, "clip (integer bounds made float first)"),
    OpCapability("aten.clamp.default", _F, _rank, "clip (integer bounds made float first)"),
    OpCapability("aten.sigmoid.default", _F, _rank, "sigmoid"),
    OpCapability("aten.tanh.default", _F, _rank, "tanh"),
    OpCapability("aten.hardswish.default", _F, _rank, "x * sigmoid_hard"),
    OpCapability("aten.hardsigmoid.default", _F, _rank, "sigmoid_hard"),
    OpCapability("aten.gelu.default", _F, _rank, "gelu (EXACT or TANH_APPROXIMATION)"),
    OpCapability("aten.leaky_relu.default", _F, _rank, "leaky_relu"),
    OpCapability("aten.elu.default", _F, _rank, "elu"),
    OpCapability("aten.exp.default", _F, _rank, "exp"),
    OpCapability("aten.log.default", _F, _rank, "log"),
    OpCapability("aten.sqrt.default", _F, _rank, "sqrt"),
    OpCapability("aten.rsqrt.default", _F, _rank, "rsqrt"),
    OpCapability("aten.abs.default", _FI, _rank, "abs"),
    OpCapability("aten.neg.default", _FI, _rank, "mul by -1"),
    OpCapability("aten.erf.default", _F, _rank, "erf"),
    OpCapability("aten.sin.default", _F, _rank, "sin"),
    OpCapability("aten.cos.default", _F, _rank, "cos"),
    OpCapability("aten.floor.default", _F, _rank, "floor"),
    OpCapability("aten.gt.Scalar", _ANY, _rank, "greater (bool result)"),
    OpCapability("aten.lt.Scalar", _ANY, _rank, "less (bool result)"),
    OpCapability("aten.where.self", _ANY, _rank, "select"),
    OpCapability("aten.max_pool2d_with_indices.default", ("float32", "int64"), _float_input,
                 "max_pool (values only)"),
    OpCapability("aten.max_pool2d.default", _F, _rank, "max_pool"),
    OpCapability("aten.avg_pool2d.default", _F, _rank, "avg_pool"),
    OpCapability("aten._adaptive_avg_pool2d.default", _F, _rank, "avg_pool / reduce_mean"),
    OpCapability("aten.mean.dim", _F, _rank, "reduce_mean"),
    OpCapability("aten.sum.dim_IntList", _F, _rank, "reduce_sum"),
    OpCapability("aten._softmax.default", _F, _softmax, "softmax"),
    OpCapability("aten._log_softmax.default", _F, _softmax, "softmax + log"),
    OpCapability("aten.native_layer_norm.default", _F, _values_only, "layer_norm (normalized output only)"),
    OpCapability("aten._native_batch_norm_legit_no_training.default", _F, _values_only,
                 "batch_norm (inference statistics)"),
    OpCapability("aten.view_copy.default", _ANY, _rank, "reshape"),
    OpCapability("aten.squeeze_copy.dims", _ANY, _rank, "squeeze"),
    OpCapability("aten.squeeze_copy.dim", _ANY, _rank, "squeeze"),
    OpCapability("aten.unsqueeze_copy.default", _ANY, _rank, "expand_dims"),
    OpCapability("aten.permute_copy.default", _ANY, _rank, "transpose"),
    OpCapability("aten.expand_copy.default", _ANY, _rank, "tile"),
    OpCapability("aten.clone.default", _ANY, _rank, "identity"),
    OpCapability("aten.alias_copy.default", _ANY, _rank, "identity"),
    OpCapability("aten.cat.default", _ANY, _rank, "concat"),
    OpCapability("aten.slice_copy.Tensor", _ANY, _rank, "slice_by_index"),
    OpCapability("aten.constant_pad_nd.default", _F, _rank, "pad (constant)"),
    OpCapability("aten.select_copy.int", _ANY, _rank, "gather (one index)"),
    OpCapability("aten.split_with_sizes_copy.default", _ANY, _rank, "split"),
    OpCapability("aten.index.Tensor", _ANY, _rank, "gather / gather_nd (advanced indexing)"),
    OpCapability("aten.gather.default", _ANY, _rank, "gather_along_axis"),
    OpCapability("aten.embedding.default", _FI, _rank, "gather (rows of the weight)"),
    OpCapability("aten.sub.Scalar", _FI, _alpha, "sub"),
    OpCapability("aten.eq.Scalar", _ANY, _rank, "equal (bool result)"),
    OpCapability("aten.eq.Tensor", _ANY, _rank, "equal (bool result)"),
    OpCapability("aten.ne.Scalar", _ANY, _rank, "not_equal (bool result)"),
    OpCapability("aten.ne.Tensor", _ANY, _rank, "not_equal (bool result)"),
    OpCapability("aten.ge.Scalar", _ANY, _rank, "greater_equal (bool result)"),
    OpCapability("aten.ge.Tensor", _ANY, _rank, "greater_equal (bool result)"),
    OpCapability("aten.le.Scalar", _ANY, _rank, "less_equal (bool result)"),
    OpCapability("aten.le.Tensor", _ANY, _rank, "less_equal (bool result)"),
    OpCapability("aten.gt.Tensor", _ANY, _rank, "greater (bool result)"),
    OpCapability("aten.lt.Tensor", _ANY, _rank, "less (bool result)"),
    OpCapability("aten.logical_not.default", _B, _rank, "logical_not"),
    OpCapability("aten.logical_and.default", _B, _rank, "logical_and"),
    OpCapability("aten.logical_or.default", _B, _rank, "logical_or"),
    OpCapability("aten.bitwise_and.Tensor", _B, _rank, "logical_and (bool tensors only)"),
    OpCapability("aten.bitwise_or.Tensor", _B, _rank, "logical_or (bool tensors only)"),
    OpCapability("aten.any.dim", _ANY, _rank, "reduce_max over a bool / integer tensor"),
    OpCapability("aten.cumsum.default", _ANY, _rank, "cumsum (a bool input is summed as integers)"),
    OpCapability("aten.upsample_bilinear2d.vec", _F, _rank, "upsample_bilinear / resize_bilinear"),
    OpCapability("aten.upsample_nearest2d.vec", _F, _rank, "upsample_nearest_neighbor"),
    OpCapability("aten.scalar_tensor.default", _ANY, None, "constant"),
    OpCapability("aten.full.default", _ANY, _rank, "fill (constant)"),
    OpCapability("aten.full_like.default", _ANY, _rank, "fill_like"),
    OpCapability("aten.arange.start_step", _FI, None, "range_1d"),
    OpCapability("aten._to_copy.default", _ANY, _rank, "cast"),
    OpCapability(_Q_TENSOR, ("float32", "int8", "uint8"), _quantize,
                 "quantize (pt2e activations; iOS17+); only when every user dequantizes"),
    OpCapability(_DQ_TENSOR, ("float32", "int8", "uint8"), _dequantize_tensor,
                 "dequantize (pt2e activations; iOS17+) of a quantize in the same graph"),
    OpCapability(_DQ_CHANNEL, ("float32", "int8", "uint8", "int64", "int32"), _dequantize_channel,
                 "constexpr_affine_dequantize / constexpr_blockwise_shift_scale (pt2e weights); constant input only"),
)
#: Ops ExecuTorch's CoreMLPartitioner refuses although coremltools claims them (kept out of the table).
KNOWN_BAD = {
    "aten.diagonal_copy.default": "coremltools converts it wrongly (ExecuTorch's _UNSUPPORTED_OP_TARGETS)",
    "aten.acosh.default": "ExecuTorch's _UNSUPPORTED_OP_TARGETS",
    "aten.asinh.default": "ExecuTorch's _UNSUPPORTED_OP_TARGETS",
    "aten.rand.default": "random numbers are not reproducible in Core ML",
}


def capabilities() -> CapabilityTable:
    return CapabilityTable(_TABLE)
