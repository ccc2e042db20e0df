"""``VulkanBackend``'s one capability table (torch-free: constraints read ``node.args`` and ``meta["val"]``).

Float32 tensors with static shapes only (``force_fp16`` stores them as fp16 on the device;
``max_pool2d_with_indices`` declares int64 indices, which must be unused). Each constraint
mirrors a limit of the shader library (:mod:`edgeport_vulkan.ops`) or of the executor's graph interpreter.

Zero-element tensors (a decoder's empty KV cache, ``torch.tensor([])`` concatenated with the first keys) are
taken by the data-movement operators only (``ZERO_ELEMENT_OPS``: aliases, copies, ``cat``, which skips them, as
torch does); any other operator reading or writing one is refused here with that reason.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from edgeport.backend import CapabilityTable, OpCapability
from edgeport.constraints import (
    adaptive_avg_pool_1x1,
    alpha_one,
    conv2d,
    first_output_only,
    first_problem,
    gelu_erf_or_tanh,
    no_half_to_float,
    non_negative_padding,
    positive_step,
    static_shapes,
)
from edgeport.node_helpers import node_arg as arg
from edgeport.node_helpers import node_shape as shape_of
from edgeport.node_helpers import node_value as _val
from edgeport_vulkan._plan_context import ZERO_ELEMENT_OPS
from edgeport_vulkan.capabilities_typed import typed_rows

_F = ("float32",)
MAX_RANK = 6


_DYNAMIC = "the Vulkan executor plans static shapes only"
_static_any = static_shapes(_DYNAMIC, max_rank=MAX_RANK)
_static_nonempty = static_shapes(_DYNAMIC, max_rank=MAX_RANK, empty="only data-movement operators (views, copies, "
                                 "cat) take empty tensors")


def _static(node: Any) -> str | None:
    target = getattr(node, "target", "")  # an OpOverload, or an edge op wrapping one in ``_op``
    movement = str(target) in ZERO_ELEMENT_OPS or str(getattr(target, "_op", "")) in ZERO_ELEMENT_OPS
    return (_static_any if movement else _static_nonempty)(node)


_conv = first_problem(partial(conv2d, groups="any", input_ranks=(3, 4)), _static)


def _max_pool(node: Any) -> str | None:
    if "with_indices" in str(node.target):
        x = _val(node.args[0])
        if str(getattr(x, "dtype", "")) != "torch.float32":
            return f"input dtype {getattr(x, 'dtype', None)} (float32 only)"
    return first_output_only(node, "indices") or _static(node)


_alpha = first_problem(alpha_one, _static)


def _trailing(node: Any) -> str | None:
    s = shape_of(node.args[0])
    if s is None:
        return _static(node)
    dims = arg(node, 1, "dim")
    dims = list(range(len(s))) if dims is None else ([dims] if isinstance(dims, int) else list(dims))
    norm = sorted({int(d) % max(len(s), 1) for d in dims})
    if norm != list(range(len(s) - len(norm), len(s))):
        return f"reduces dims {dims} of a rank-{len(s)} tensor; the shader reduces the last dim(s) only"
    if arg(node, 3, "dtype") is not None:
        return "dtype argument"
    return _static(node)


def _softmax(node: Any) -> str | None:
    s = shape_of(node.args[0])
    if s is not None and int(node.args[1]) % max(len(s), 1) != len(s) - 1:
        return f"softmax over dim {node.args[1]}; the shader normalizes the last dim only"
    return no_half_to_float(node) or _static(node)


_slice = first_problem(positive_step, _static)
_pad = first_problem(non_negative_padding, _static)
_gelu = first_problem(gelu_erf_or_tanh, _static)


def _pow(node: Any) -> str | None:
    e = node.args[1] if len(node.args) > 1 else None
    if not isinstance(e, (int, float)) or isinstance(e, bool) or e != e or abs(e) == float("inf"):
        return f"exponent {e!r} is not a finite number"
    return _static(node)


def _binary(node: Any) -> str | None:
    for a in node.args[:2]:
        if not hasattr(a, "meta") and not isinstance(a, (int, float)):
            return f"operand {a!r} is neither a tensor nor a number"
    return _static(node)


def _addmm(node: Any) -> str | None:
    if arg(node, 3, "beta", 1) != 1 or arg(node, 4, "alpha", 1) != 1:
        return "beta or alpha != 1"
    bias, out = shape_of(node.args[0]), shape_of(node)
    if bias is not None and out is not None and (not bias or bias[-1] != out[-1] or any(d != 1 for d in bias[:-1])):
        return f"bias of shape {list(bias)} is not a row of {out[-1]} (the shader adds one bias row)"
    return _static(node)


_adaptive = first_problem(adaptive_avg_pool_1x1, _static)


def _batch_norm(node: Any) -> str | None:
    x = shape_of(node.args[0])
    if x is None or len(x) < 2:
        return "batch norm needs a static input with a channel dimension"
    return first_output_only(node, "save_mean / save_invstd") or _static(node)


_layer_norm = first_problem(partial(first_output_only, what="mean / rstd"), _static)


_TABLE = (
    OpCapability("aten.convolution.default", _F, _conv, "conv2d shader: direct, groups incl. depthwise, + bias"),
    OpCapability("aten.linear.default", _F, _static, "matmul shader (x @ W^T + b)"),
    OpCapability("aten.addmm.default", _F, _addmm, "matmul shader (+ bias row)"),
    OpCapability("aten.mm.default", _F, _static, "matmul shader"),
    OpCapability("aten.bmm.default", _F, _static, "matmul shader (batched)"),
    OpCapability("aten.add.Tensor", _F, _alpha, "binary shader, N-D broadcasting"),
    OpCapability("aten.sub.Tensor", _F, _alpha, "binary shader"),
    OpCapability("aten.mul.Tensor", _F, _binary, "binary shader"),
    OpCapability("aten.div.Tensor", _F, _binary, "binary shader"),
    OpCapability("aten.add.Scalar", _F, _alpha, "binary shader (scalar operand)"),
    OpCapability("aten.sub.Scalar", _F, _alpha, "binary shader (scalar operand)"),
    OpCapability("aten.mul.Scalar", _F, _binary, "binary shader (scalar operand)"),
    OpCapability("aten.div.Scalar", _F, _binary, "binary shader (scalar operand)"),
    OpCapability("aten.relu.default", _F, _static, "unary shader"),
    OpCapability("aten.hardtanh.default", _F, _static, "unary shader (clamp)"),
    OpCapability("aten.clamp.default", _F, _static, "unary shader"),
    OpCapability("aten.sigmoid.default", _F, _static, "unary shader"),
    OpCapability("aten.tanh.default", _F, _static, "unary shader"),
    OpCapability("aten.hardswish.default", _F, _static, "unary shader"),
    OpCapability("aten.gelu.default", _F, _gelu, "unary shader (erf or tanh)"),
    OpCapability("aten.neg.default", _F, _static, "unary shader"),
    OpCapability("aten.abs.default", _F, _static, "unary shader"),
    OpCapability("aten.exp.default", _F, _static, "unary shader"),
    OpCapability("aten.sqrt.default", _F, _static, "unary shader"),
    OpCapability("aten.rsqrt.default", _F, _static, "unary shader"),
    OpCapability("aten.pow.Tensor_Scalar", _F, _pow, "unary shader (x * x for exponent 2)"),
    OpCapability("aten.silu.default", _F, _static, "unary shader"),
    OpCapability("aten.leaky_relu.default", _F, _static, "unary shader"),
    OpCapability("aten.maximum.default", _F, _static, "binary shader, N-D broadcasting"),
    OpCapability("aten.minimum.default", _F, _static, "binary shader, N-D broadcasting"),
    OpCapability("aten.max_pool2d.default", _F, _max_pool, "pool2d shader"),
    OpCapability("aten.max_pool2d_with_indices.default", (), _max_pool, "pool2d shader (values only)"),
    OpCapability("aten.avg_pool2d.default", _F, _static, "pool2d shader"),
    OpCapability("aten.mean.dim", _F, _trailing, "mean shader (trailing dims)"),
    OpCapability("aten._softmax.default", _F, _softmax, "softmax shader (last dim)"),
    OpCapability("aten._log_softmax.default", _F, _softmax, "softmax shader, log (last dim)"),
    OpCapability("aten._adaptive_avg_pool2d.default", _F, _adaptive, "mean shader over H, W"),
    OpCapability("aten.native_layer_norm.default", _F, _layer_norm, "layer_norm shader (mean/rstd not produced)"),
    OpCapability("aten._native_batch_norm_legit_no_training.default", _F, _batch_norm,
                 "constant statistics folded at load into a per-channel scale and shift (two binary dispatches)"),
    OpCapability("aten.view_copy.default", _F, _static, "no dispatch (buffer alias)"),
    OpCapability("aten._unsafe_view.default", _F, _static, "no dispatch (buffer alias)"),
    OpCapability("aten.squeeze_copy.dims", _F, _static, "no dispatch (buffer alias)"),
    OpCapability("aten.squeeze_copy.dim", _F, _static, "no dispatch (buffer alias)"),
    OpCapability("aten.unsqueeze_copy.default", _F, _static, "no dispatch (buffer alias)"),
    OpCapability("aten.clone.default", _F, _static, "no dispatch (buffer alias)"),
    OpCapability("aten.permute_copy.default", _F, _static, "permute shader"),
    OpCapability("aten.select_copy.int", _F, _static, "copy shader (offset)"),
    OpCapability("aten.expand_copy.default", _F, _static, "copy shader (zero strides)"),
    OpCapability("aten.split_with_sizes_copy.default", _F, _static, "copy shader per output"),
    OpCapability("aten.cat.default", _F, _static, "copy shader per input"),
    OpCapability("aten.slice_copy.Tensor", _F, _slice, "copy shader (strided)"),
    OpCapability("aten.constant_pad_nd.default", _F, _pad, "fill + copy shaders"),
)


def capabilities() -> CapabilityTable:
    return CapabilityTable(typed_rows(_TABLE, _static))  # + int / bool tensors: capabilities_typed
