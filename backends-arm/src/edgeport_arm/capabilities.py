"""The Arm backends' one capability table, and the Ethos-U restrictions on top of it.

Torch-free: constraints read only ``node.args`` / ``node.kwargs`` and ``meta["val"]``. The table lists what the
TOSA lowering handles in float (``TOSA-1.0+FP``) or int8 (``TOSA-1.0+INT``, graphs from torchao's pt2e flow:
the ``quantized_decomposed`` quantize / dequantize ops are claimed too). Profile-dependent rules (which ops have
an int8 lowering) are :data:`INT8_UNSUPPORTED`; :func:`ethos_u_problem` adds what Vela 5.2.0 places on the NPU
from a TOSA graph (its ``tosa_supported_operators``): no MATMUL, REDUCE_* or activation TRANSPOSE on the NPU,
batch 1 for 4-D tensors outside elementwise/concat/reshape/pad, dimensions up to 65535, rank up to 4 (6 for
elementwise), depthwise multiplier 1 (or one input channel), average pooling without padding.
"""

from __future__ import annotations

from typing import Any

from edgeport.backend import CapabilityTable, OpCapability
from edgeport.node_helpers import int_pair as _pair
from edgeport.node_helpers import node_arg as arg
from edgeport.node_helpers import node_shape as shape_of
from edgeport.node_helpers import node_value as _val

_F = ("float32",)
_FI = ("float32", "int8")
_QUANT_IO = ("float32", "int8", "float64", "int32", "int64")
MAX_DIM = 65535


def _static(node: Any) -> str | None:
    for n in [node, *getattr(node, "all_input_nodes", [])]:
        if _val(n) is not None and hasattr(_val(n), "shape") and shape_of(n) is None:
            return f"dynamic shape on {getattr(n, 'name', n)}: TOSA graphs here are static (export without Dim)"
    return None


def _conv(node: Any) -> str | None:
    w, x = shape_of(node.args[1]), shape_of(node.args[0])
    if w is None or x is None or len(w) != 4:
        return "only 2-D convolutions with static shapes"
    if arg(node, 6, "transposed", False):
        return "transposed convolution is not lowered"
    groups = int(arg(node, 8, "groups", 1))
    if groups != 1 and not (groups == x[1] and w[1] == 1):
        return f"grouped convolution (groups={groups}) is neither regular nor depthwise"
    return _static(node)


def _max_pool(node: Any) -> str | None:
    if _pair(arg(node, 4, "dilation", 1)) != [1, 1]:
        return "dilated max pooling"
    if arg(node, 5, "ceil_mode", False):
        return "ceil_mode=True"
    if str(getattr(node.target, "__name__", "")).startswith("max_pool2d_with_indices") or "indices" in str(
            node.target):
        if any(u.args[1] != 0 for u in node.users):
            return "the indices output of max_pool2d_with_indices is used"
    return _static(node)


def _avg_pool(node: Any) -> str | None:
    if arg(node, 4, "ceil_mode", False):
        return "ceil_mode=True"
    if arg(node, 6, "divisor_override") is not None:
        return "divisor_override is set"
    if any(_pair(arg(node, 3, "padding", 0))) and arg(node, 5, "count_include_pad", True):
        return "padding counted in the average (count_include_pad=True); TOSA averages only the valid elements"
    return _static(node)


def _adaptive(node: Any) -> str | None:
    return None if list(node.args[1]) == [1, 1] else "adaptive average pooling to a size other than 1x1"


def _alpha(node: Any) -> str | None:
    return "alpha != 1" if arg(node, 2, "alpha", 1) != 1 else _static(node)


def _slice(node: Any) -> str | None:
    return "step != 1" if int(arg(node, 4, "step", 1)) != 1 else _static(node)


def _pad(node: Any) -> str | None:
    return "negative padding" if any(int(p) < 0 for p in node.args[1]) else _static(node)


def _per_tensor_int8(node: Any) -> str | None:
    args = node.args
    if len(args) < 6 or not all(isinstance(a, (int, float)) for a in args[1:5]):
        return "quantization parameters must be constants of the node (quantize_per_tensor.default)"
    return None


def _rank(limit: int) -> Any:
    def check(node: Any) -> str | None:
        s = shape_of(node)
        return f"rank {len(s)} > {limit}" if s is not None and len(s) > limit else _static(node)
    return check


_TABLE = (
    OpCapability("aten.convolution.default", _F, _conv, "CONV2D / DEPTHWISE_CONV2D (NHWC)"),
    OpCapability("aten.linear.default", _F, _static, "1x1 CONV2D"),
    OpCapability("aten.mm.default", _F, _static, "MATMUL"),
    OpCapability("aten.bmm.default", _F, _static, "MATMUL"),
    OpCapability("aten.add.Tensor", _F, _alpha, "ADD (int8: both inputs RESCALEd to int32)"),
    OpCapability("aten.sub.Tensor", _F, _alpha, "SUB"),
    OpCapability("aten.mul.Tensor", _F, _static, "MUL"),
    OpCapability("aten.mul.Scalar", _F, lambda n: _static(n) if isinstance(n.args[1], (int, float)) and n.args[1] > 0
                 else "only a positive constant scalar", "MUL (int8: a change of scale, no operator)"),
    OpCapability("aten.relu.default", _F, _static, "CLAMP (int8: fused into the next RESCALE's clamp)"),
    OpCapability("aten.hardtanh.default", _F, _static, "CLAMP"),
    OpCapability("aten.clamp.default", _F, _static, "CLAMP"),
    OpCapability("aten.sigmoid.default", _F, _static, "SIGMOID (int8: TABLE)"),
    OpCapability("aten.tanh.default", _F, _static, "TANH (int8: TABLE)"),
    OpCapability("aten.hardswish.default", _F, _static, "ADD/CLAMP/MUL (int8: TABLE)"),
    OpCapability("aten.gelu.default", _F, _static, "ERF or TANH arithmetic (int8: TABLE)"),
    OpCapability("aten.max_pool2d.default", _F, _max_pool, "MAX_POOL2D"),
    OpCapability("aten.max_pool2d_with_indices.default", _F, _max_pool, "MAX_POOL2D (values only)"),
    OpCapability("aten.avg_pool2d.default", _F, _avg_pool, "AVG_POOL2D"),
    OpCapability("aten._adaptive_avg_pool2d.default", _F, _adaptive, "AVG_POOL2D over H, W"),
    OpCapability("aten.mean.dim", _F, _static, "AVG_POOL2D (H, W) or REDUCE_SUM x 1/N"),
    OpCapability("aten._softmax.default", _F, _static, "float only: REDUCE_MAX, EXP, REDUCE_SUM, RECIPROCAL"),
    OpCapability("aten.native_layer_norm.default", _F, _static, "float only: REDUCE_SUM, RSQRT"),
    OpCapability("aten.view_copy.default", _F, _static, "RESHAPE"),
    OpCapability("aten._unsafe_view.default", _F, _static, "RESHAPE"),
    OpCapability("aten.squeeze_copy.dims", _F, _static, "RESHAPE"),
    OpCapability("aten.squeeze_copy.dim", _F, _static, "RESHAPE"),
    OpCapability("aten.unsqueeze_copy.default", _F, _static, "RESHAPE"),
    OpCapability("aten.clone.default", _F, _static, "no operator"),
    OpCapability("aten.permute_copy.default", _F, _static, "TRANSPOSE"),
    OpCapability("aten.cat.default", _F, _static, "CONCAT"),
    OpCapability("aten.slice_copy.Tensor", _F, _slice, "SLICE"),
    OpCapability("aten.select_copy.int", _F, _static, "SLICE + RESHAPE"),
    OpCapability("aten.constant_pad_nd.default", _F, _pad, "PAD"),
)
_QUANT = (
    OpCapability("quantized_decomposed.quantize_per_tensor.default", _FI, _per_tensor_int8, "RESCALE (+CLAMP)"),
    OpCapability("quantized_decomposed.dequantize_per_tensor.default", _FI, _per_tensor_int8, "no operator"),
    OpCapability("quantized_decomposed.dequantize_per_channel.default", _QUANT_IO, None, "weights only"),
)
QUANTIZE, DEQUANTIZE, DEQUANTIZE_PER_CHANNEL = (c.op for c in _QUANT)
INT8_UNSUPPORTED = {"aten._softmax.default": "int8 softmax is not lowered yet",
                    "aten.native_layer_norm.default": "int8 layer norm is not lowered yet"}
ETHOS_U_NO_NPU = {
    "aten.mm.default": "Vela runs TOSA MATMUL on the CPU, not the NPU",
    "aten.bmm.default": "Vela runs TOSA MATMUL on the CPU, not the NPU",
    "aten.permute_copy.default": "Vela puts a TRANSPOSE of activations on the CPU",
    "aten._softmax.default": "no int8 lowering", "aten.native_layer_norm.default": "no int8 lowering",
}
ALL_CAPABILITIES = CapabilityTable(_TABLE + _QUANT)


def capabilities() -> CapabilityTable:
    """The float ops (what the conformance suite checks on ``TOSABackend`` with ``TOSA-1.0+FP``)."""
    return CapabilityTable(_TABLE)


def ethos_u_problem(node: Any, name: str) -> str | None:
    """Why Vela would not place this node's TOSA operators on the NPU, or ``None``."""
    if name in ETHOS_U_NO_NPU:
        return ETHOS_U_NO_NPU[name]
    if name == "aten.mean.dim":
        s = shape_of(node.args[0])
        dims = sorted(int(d) % len(s) for d in (arg(node, 1, "dim") or range(len(s)))) if s else None
        if dims != [2, 3] or len(s) != 4:
            return "mean over axes other than H and W needs REDUCE_SUM, which Vela runs on the CPU"
    if name == "aten.avg_pool2d.default" and any(_pair(arg(node, 3, "padding", 0))):
        return "Vela supports average pooling without padding only"
    if name == "aten.convolution.default":
        w, x = shape_of(node.args[1]), shape_of(node.args[0])
        groups = int(arg(node, 8, "groups", 1))
        if w and x and groups > 1 and w[0] != groups and x[1] != 1:
            return "depthwise multiplier > 1 needs one input channel on Ethos-U"
    elementwise = name in ("aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor")
    free_rank = elementwise or name in ("aten.cat.default", "aten.view_copy.default", "aten._unsafe_view.default",
                                        "aten.constant_pad_nd.default", "aten.squeeze_copy.dims",
                                        "aten.squeeze_copy.dim", "aten.unsqueeze_copy.default", "aten.clone.default")
    activations = [node, *(a for a in node.args[:2] if hasattr(a, "meta") and elementwise or a is node.args[0])]
    for n in activations:
        s = shape_of(n)
        if s is None:
            continue
        if any(d > MAX_DIM for d in s):
            return f"tensor {n.name} has a dimension above {MAX_DIM}"
        if not free_rank and len(s) > 4:
            return f"tensor {n.name} has rank {len(s)} > 4"
        if not free_rank and not name.startswith("quantized_decomposed") and len(s) == 4 and s[0] != 1:
            return f"tensor {n.name} has batch {s[0]}: Ethos-U needs batch 1 for 4-D tensors"
    return None
