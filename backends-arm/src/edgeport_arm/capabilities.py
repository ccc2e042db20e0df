"""The Arm backends' one capability table, and the Ethos-U restrictions on top of it.

Torch-free: constraints read only ``node.args`` / ``node.kwargs`` and ``meta["val"]``. The table lists what the
TOSA lowering handles in float (``TOSA-1.0+FP``) or int8 (``TOSA-1.0+INT``, graphs from torchao's pt2e flow:
the ``quantized_decomposed`` quantize / dequantize ops are claimed too). Profile-dependent rules (which ops have
an int8 lowering) are :data:`INT8_UNSUPPORTED`, and int16 activations (a16w8) are lowered for
:data:`INT16_SUPPORTED` only. :func:`ethos_u_problem` adds what Vela 5.2.0 places on the NPU from a TOSA graph,
measured per operator: int8 MATMUL, TRANSPOSE, REDUCE_SUM / REDUCE_MAX and TABLE run on the NPU of the U55 and
the U85 (the U55 within its 65536-element limits for TRANSPOSE and REDUCE_*); the MAC operators (convolution,
linear, pooling) need batch 1 for 4-D tensors and rank <= 4, the others rank <= 5; dimensions up to 65535;
depthwise multiplier 1 (or one input channel); average pooling without padding.
"""

from __future__ import annotations

import itertools
import math
from functools import partial
from typing import Any

from edgeport.backend import CapabilityTable, OpCapability
from edgeport.constraints import (
    adaptive_avg_pool_1x1,
    alpha_one,
    avg_pool2d,
    conv2d,
    first_problem,
    max_pool2d,
    non_negative_padding,
    static_shapes,
    unit_step,
)
from edgeport.node_helpers import int_pair as _pair
from edgeport.node_helpers import node_arg as arg
from edgeport.node_helpers import node_shape as shape_of

_F = ("float32",)
_FB = ("float32", "bool")
_FI = ("float32", "int8", "int16")
_QUANT_IO = ("float32", "int8", "int16", "float64", "int32", "int64")
MAX_DIM = 65535


_static = static_shapes("TOSA graphs here are static (export without Dim)")
_conv = first_problem(conv2d, _static)
_max_pool = first_problem(max_pool2d, _static)
_avg_pool = first_problem(partial(avg_pool2d, count_include_pad=False), _static)
_alpha = first_problem(alpha_one, _static)
_slice = first_problem(unit_step, _static)
_pad = first_problem(non_negative_padding, _static)


def _sum(node: Any) -> str | None:
    if arg(node, 3, "dtype") is not None:
        return "sum with an explicit dtype"
    return _static(node)


def _dtypes(node: Any, *wanted: tuple[int, str]) -> str | None:
    """Argument ``i`` has dtype ``d`` for each ``(i, d)``; a boolean one is computed in the graph (a bool graph
    input cannot enter a float TOSA delegate)."""
    for i, dtype in wanted:
        a = node.args[i] if i < len(node.args) else None
        val = getattr(a, "meta", {}).get("val")
        if getattr(val, "dtype", None) is None or str(val.dtype).removeprefix("torch.") != dtype:
            return f"argument {i} must be a {dtype} tensor"
        if dtype == "bool" and a.op == "placeholder":
            return f"argument {i} is a boolean graph input (a float TOSA delegate takes float32 inputs only)"
    return None


def _bilinear(node: Any) -> str | None:
    scales = arg(node, 3, "scale_factors")
    shapes = (shape_of(node.args[0]), shape_of(node))
    if any(s is None or len(s) != 4 for s in shapes):
        return "bilinear upsampling of a 4-D (N, C, H, W) tensor only"
    if scales is not None and any(float(f) * i != o for f, i, o in zip(scales, shapes[0][2:], shapes[1][2:])):
        return "scale factors that do not give the output size exactly (torch samples by the factor then)"
    return None


def _int8_upsample(node: Any) -> str | None:
    dims = shape_of(node.args[0])
    return None if dims is not None and tuple(dims[2:]) == (1, 1) else "int8 bilinear upsampling from a 1x1 map only"


def _per_tensor_int8(node: Any) -> str | None:
    args = node.args
    if len(args) < 6 or not all(isinstance(a, (int, float)) for a in args[1:5]):
        return "quantization parameters must be constants of the node (quantize_per_tensor.default)"
    return None


_TABLE = (
    OpCapability("aten.convolution.default", _F, _conv, "CONV2D / DEPTHWISE_CONV2D (NHWC)"),
    OpCapability("aten.linear.default", _F, _static, "1x1 CONV2D"),
    OpCapability("aten.mm.default", _F, _static, "MATMUL (int8: int32 result, one RESCALE)"),
    OpCapability("aten.addmm.default", _F, lambda n: _static(n) or (
        "beta or alpha other than 1" if n.kwargs.get("beta", 1) != 1 or n.kwargs.get("alpha", 1) != 1 else None),
        "MATMUL + ADD (float graphs only)"),
    OpCapability("aten.pow.Tensor_Scalar", _F, lambda n: _static(n) or (
        None if n.args[1] in (2, 3) and not isinstance(n.args[1], bool) else f"exponent {n.args[1]!r} (2 and 3 only)"),
        "MUL (squares and cubes; int8: in int32, rescaled once)"),
    OpCapability("aten.neg.default", _F, _static, "SUB from zero (int8: in int32, rescaled once)"),
    OpCapability("aten.expand_copy.default", _F, _static, "TILE (int8: the input's parameters)"),
    OpCapability("aten.silu.default", _F, _static, "SIGMOID + MUL (int8: TABLE)"),
    OpCapability("aten.bmm.default", _F, _static, "MATMUL (int8: int32 result, one RESCALE)"),
    OpCapability("aten.add.Tensor", _F, _alpha, "ADD (int8: both inputs RESCALEd to int32)"),
    OpCapability("aten.sub.Tensor", _F, _alpha, "SUB"),
    OpCapability("aten.mul.Tensor", _F, _static, "MUL"),
    OpCapability("aten.mul.Scalar", _F, lambda n: _static(n) if isinstance(n.args[1], (int, float)) and n.args[1] > 0
                 else "only a positive constant scalar", "MUL (int8: a change of scale, no operator)"),
    OpCapability("aten.add.Scalar", _F, lambda n: _static(n) if isinstance(n.args[1], (int, float))
                 and arg(n, 2, "alpha", 1) == 1 else "only a constant scalar, alpha 1",
                 "ADD of a constant (int8: in int32 on a finer scale)"),
    OpCapability("aten.relu.default", _F, _static, "CLAMP (int8: fused into the next RESCALE's clamp)"),
    OpCapability("aten.hardtanh.default", _F, _static, "CLAMP"),
    OpCapability("aten.clamp.default", _F, _static, "CLAMP"),
    OpCapability("aten.sigmoid.default", _F, _static, "SIGMOID (int8: TABLE)"),
    OpCapability("aten.tanh.default", _F, _static, "TANH (int8: TABLE)"),
    OpCapability("aten.hardswish.default", _F, _static, "ADD/CLAMP/MUL (int8: TABLE)"),
    OpCapability("aten.gelu.default", _F, _static, "ERF or TANH arithmetic (int8: TABLE)"),
    OpCapability("aten.exp.default", _F, _static, "EXP (int8: TABLE)"),
    OpCapability("aten.reciprocal.default", _F, _static, "RECIPROCAL (int8: TABLE)"),
    OpCapability("aten.rsqrt.default", _F, _static, "RSQRT (int8: TABLE)"),
    OpCapability("aten.amax.default", _F, _static, "REDUCE_MAX (int8: on the codes)"),
    OpCapability("aten.sum.dim_IntList", _F, _sum, "REDUCE_SUM (int8: in int32, rescaled once)"),
    OpCapability("aten.max_pool2d.default", _F, _max_pool, "MAX_POOL2D"),
    OpCapability("aten.max_pool2d_with_indices.default", _F, _max_pool, "MAX_POOL2D (values only)"),
    OpCapability("aten.avg_pool2d.default", _F, _avg_pool, "AVG_POOL2D"),
    OpCapability("aten._adaptive_avg_pool2d.default", _F, adaptive_avg_pool_1x1, "AVG_POOL2D over H, W"),
    OpCapability("aten.mean.dim", _F, _static, "AVG_POOL2D (H, W) or REDUCE_SUM x 1/N"),
    OpCapability("aten._softmax.default", _F, _static,
                 "REDUCE_MAX, EXP, REDUCE_SUM, RECIPROCAL (int8: the quantizer decomposes it into the ops of this table)"),
    OpCapability("aten.native_layer_norm.default", _F, _static,
                 "REDUCE_SUM, RSQRT (int8: the quantizer decomposes it into the ops of this table)"),
    OpCapability("aten.eq.Scalar", _FB, lambda n: _static(n) or _dtypes(n, (0, "float32")),
                 "EQUAL with a constant (float graphs only)"),
    OpCapability("aten.logical_not.default", _FB, lambda n: _static(n) or _dtypes(n, (0, "bool")),
                 "LOGICAL_NOT (float graphs only)"),
    OpCapability("aten.any.dim", _FB, lambda n: _static(n) or _dtypes(n, (0, "bool")),
                 "REDUCE_ANY (float graphs only)"),
    OpCapability("aten.where.self", _FB, lambda n: _static(n) or _dtypes(n, (0, "bool"), (1, "float32"),
                                                                         (2, "float32")),
                 "SELECT (float graphs only)"),
    *(OpCapability(op, _F, _static, "a constant of the input's shape (float graphs only)")
      for op in ("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default")),
    OpCapability("aten.upsample_bilinear2d.vec", _F, lambda n: _static(n) or _bilinear(n),
                 "RESIZE BILINEAR (int8: from a 1x1 map only, RESIZE NEAREST)"),
    OpCapability("aten._native_batch_norm_legit_no_training.default", _F, _static,
                 "MUL + ADD with folded per-channel constants (float graphs only)"),
    OpCapability("aten.view_copy.default", _F, _static, "RESHAPE"),
    OpCapability("aten._unsafe_view.default", _F, _static, "RESHAPE"),
    OpCapability("aten.squeeze_copy.dims", _F, _static, "RESHAPE"),
    OpCapability("aten.squeeze_copy.dim", _F, _static, "RESHAPE"),
    OpCapability("aten.unsqueeze_copy.default", _F, _static, "RESHAPE"),
    OpCapability("aten.clone.default", _F, _static, "no operator"),
    OpCapability("aten.alias_copy.default", _F, _static, "no operator"),
    OpCapability("aten.permute_copy.default", _F, _static, "TRANSPOSE"),
    OpCapability("aten.cat.default", _F, _static, "CONCAT"),
    OpCapability("aten.slice_copy.Tensor", _F, _slice, "SLICE"),
    OpCapability("aten.select_copy.int", _F, _static, "SLICE + RESHAPE"),
    OpCapability("aten.split_with_sizes_copy.default", _F, _static, "one SLICE per piece"),
    OpCapability("aten.constant_pad_nd.default", _F, _pad, "PAD"),
)
_QUANT = (
    OpCapability("quantized_decomposed.quantize_per_tensor.default", _FI, _per_tensor_int8, "RESCALE (+CLAMP)"),
    OpCapability("quantized_decomposed.dequantize_per_tensor.default", _FI, _per_tensor_int8, "no operator"),
    OpCapability("quantized_decomposed.dequantize_per_channel.default", _QUANT_IO, None, "weights only"),
)
QUANTIZE, DEQUANTIZE, DEQUANTIZE_PER_CHANNEL = (c.op for c in _QUANT)
INT8_UNSUPPORTED: dict[str, str] = {
    **dict.fromkeys(("aten.eq.Scalar", "aten.logical_not.default", "aten.any.dim", "aten.where.self"),
                    "no int8 lowering (boolean masks are lowered in float graphs only)"),
    **dict.fromkeys(("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default"),
                    "no int8 lowering (a float constant)"),
    "aten.addmm.default": "no int8 lowering (the Arm quantizers turn addmm with constant weights into linear; "
                          "this one was left in float)",
    "aten._softmax.default": "int8 softmax is lowered from its decomposition (EthosUQuantizer / TOSAQuantizer "
                             "decompose it before annotating); a whole softmax here was left in float",
    "aten.native_layer_norm.default": "int8 layer norm is lowered from its decomposition (EthosUQuantizer / "
                                      "TOSAQuantizer decompose it before annotating); a whole layer norm here was "
                                      "left in float",
    "aten._native_batch_norm_legit_no_training.default": "no int8 lowering of a batch norm (pt2e's prepare "
                                                         "folds one that follows a convolution into it); this one "
                                                         "was left in float",
}
# int8-only restrictions on top of the table's constraint
INT8_CONSTRAINTS = {"aten.upsample_bilinear2d.vec": _int8_upsample}
# ops lowered to one int8 TABLE: their output parameters come from the quantize that must follow them
INT8_TABLES = frozenset({
    "aten.sigmoid.default", "aten.tanh.default", "aten.hardswish.default", "aten.gelu.default", "aten.silu.default",
    "aten.exp.default", "aten.reciprocal.default", "aten.rsqrt.default",
})
# Vela 5.2.0 (regor) places int8 MATMUL, TRANSPOSE, REDUCE_SUM / REDUCE_MAX and TABLE on the NPU of both the
# U55 and the U85 (measured per operator); on the U55 within the size limits below (those ExecuTorch's U55
# support checks use).
ETHOS_U_NO_NPU = {
    "aten._softmax.default": "no int8 lowering of a whole softmax",
    "aten.native_layer_norm.default": "no int8 lowering of a whole layer norm",
}
# what the int16 (a16w8) lowering handles: int16 activations, int8 weights, int48 / int32 accumulators
INT16_SUPPORTED = frozenset({
    "aten.convolution.default", "aten.linear.default", "aten.add.Tensor", "aten.sub.Tensor", "aten.relu.default",
    "aten.hardtanh.default", "aten.clamp.default", "aten.view_copy.default", "aten._unsafe_view.default",
    "aten.squeeze_copy.dims", "aten.squeeze_copy.dim", "aten.unsqueeze_copy.default", "aten.clone.default",
    "aten.permute_copy.default",
})


def reads_or_writes_int16(node: Any) -> bool:
    """Whether a node of a pt2e graph works on int16 quantized activations (a16w8)."""
    def q16(n: Any) -> bool:
        return (getattr(n, "op", None) == "call_function" and "quantize_per_tensor" in str(n.target)
                and len(n.args) > 5 and str(n.args[5]) == "torch.int16")
    return q16(node) or any(q16(a) for a in getattr(node, "all_input_nodes", [])) or any(
        q16(u) for u in getattr(node, "users", {}))


_U55_MAX_PRODUCT = 65536
# operators Vela runs on its MAC engine: batch 1 for 4-D tensors and rank <= 4 (measured: the others -- MATMUL,
# TRANSPOSE, SLICE, TABLE, elementwise -- compile to the NPU with a batch above 1 and with rank 5 too)
_MAC_OPS = ("aten.convolution.default", "aten.linear.default", "aten.max_pool2d.default",
            "aten.max_pool2d_with_indices.default", "aten.avg_pool2d.default", "aten._adaptive_avg_pool2d.default",
            "aten.mean.dim")
_REDUCTIONS = ("aten.sum.dim_IntList", "aten.amax.default", "aten.mean.dim")
ALL_CAPABILITIES = CapabilityTable(_TABLE + _QUANT)


def capabilities() -> CapabilityTable:
    """The float ops (what the conformance suite checks on ``TOSABackend`` with ``TOSA-1.0+FP``)."""
    return CapabilityTable(_TABLE)


def _u55_problem(node: Any, name: str) -> str | None:
    """The Ethos-U55's size limits for TRANSPOSE and REDUCE_* (beyond them Vela may use the CPU)."""
    s = shape_of(node.args[0])
    if s is None:
        return None
    if name == "aten.permute_copy.default":
        # worst case over the physical order: any rank-2 dimensions together at most 65536 elements
        k = max(1, len(s) - 2)
        if any(math.prod(c) > _U55_MAX_PRODUCT for c in itertools.combinations(s, k)):
            return f"a transpose of shape {tuple(s)} exceeds the U55's {_U55_MAX_PRODUCT}-element limit"
    if name in _REDUCTIONS:
        dims = arg(node, 1, "dim")
        dims = list(range(len(s))) if not dims else ([dims] if isinstance(dims, int) else list(dims))
        for d in (int(d) % len(s) for d in dims):
            if max(math.prod(s[:d]), s[d], math.prod(s[d + 1:])) > _U55_MAX_PRODUCT:
                return f"a reduction over axis {d} of shape {tuple(s)} exceeds the U55's {_U55_MAX_PRODUCT} limit"
    return None


def ethos_u_problem(node: Any, name: str, target: str = "ethos-u55-128") -> str | None:
    """Why Vela would not place this node's TOSA operators on the NPU of ``target``, or ``None``."""
    if name in ETHOS_U_NO_NPU:
        return ETHOS_U_NO_NPU[name]
    if target.startswith("ethos-u55"):
        why = _u55_problem(node, name)
        if why:
            return why
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
                                        "aten.squeeze_copy.dim", "aten.unsqueeze_copy.default", "aten.clone.default",
                                        "aten.alias_copy.default")
    activations = [node, *(a for a in node.args[:2] if hasattr(a, "meta") and elementwise or a is node.args[0])]
    for n in activations:
        s = shape_of(n)
        if s is None:
            continue
        if any(d > MAX_DIM for d in s):
            return f"tensor {n.name} has a dimension above {MAX_DIM}"
        if not free_rank and len(s) > (4 if name in _MAC_OPS else 5):
            return f"tensor {n.name} has rank {len(s)} > {4 if name in _MAC_OPS else 5}"
        if name in _MAC_OPS and len(s) == 4 and s[0] != 1:
            return f"tensor {n.name} has batch {s[0]}: Ethos-U needs batch 1 for 4-D tensors"
    return None
