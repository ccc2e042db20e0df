"""XnnpackBackend's capability table: what the partitioner takes, what preprocess lowers, what the docs list.

Torch-free: constraints read only ``node.args``/``node.kwargs`` and ``meta["val"]`` shapes. Every op listed is
supported by ExecuTorch's XNNPACK delegate runtime (so edgeport-lowered programs run there). On edgeport's
runtime most run natively in this libXNNPACK; the ones marked *host* in ``notes`` (XNNPACK 2022 has no such
node) run as numpy steps inside the delegate. At most 6 dimensions; float32. Dynamic dims need an upper
bound and a lowering that holds at every size (:func:`edgeport_xnnpack._bounded.dynamic_problem`).

Quantized graphs (``XnnpackQuantizer`` + torchao's ``convert_pt2e``): the ``quantized_decomposed`` quantize /
dequantize ops are claimed too (int8, :data:`QUANTIZED_CAPABILITIES`; the partitioner uses
:data:`ALL_CAPABILITIES`). Preprocess turns ``dequantize -> op -> quantize`` patterns around
convolution, linear, add/sub/mul, max/global-average pooling, reshape and clamp into XNNPACK's int8 nodes and
the remaining quantize / dequantize nodes into ``XNNConvert`` nodes, so the float ops stay claimed as float32.
"""

from __future__ import annotations

import importlib
import math
import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any

from edgeport.backend import CapabilityTable, OpCapability
from edgeport_xnnpack._bounded import dynamic_problem, unbounded_problem

BACKEND_ID = "XnnpackBackend"
MAX_DIMS = 6
_F32 = ("float32",)


def shape(value: Any) -> tuple[int, ...] | None:
    """Static shape of a node's (first) tensor value, ``None`` if unknown or symbolic."""
    val = getattr(value, "meta", {}).get("val")
    if isinstance(val, (tuple, list)):
        val = val[0] if val else None
    dims = getattr(val, "shape", None)
    if dims is None:
        return None
    if any(type(d) is not int for d in dims):
        return None
    return tuple(dims)


def arg(node: Any, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _is_node(x: Any) -> bool:
    return hasattr(x, "meta") and hasattr(x, "op")


def rank(value: Any) -> int | None:
    """Rank of a node's (first) tensor value, static or not; ``None`` if it has none."""
    val = getattr(value, "meta", {}).get("val")
    if isinstance(val, (tuple, list)):
        val = val[0] if val else None
    dims = getattr(val, "shape", None)
    return None if dims is None else len(dims)


def _op_name(node: Any) -> str:
    """``"aten.add.Tensor"`` for an ``OpOverload`` target, or the ``OpOverload`` an edge op wraps."""
    target = node.target
    if type(target).__name__ != "OpOverload" and type(getattr(target, "_op", None)).__name__ == "OpOverload":
        target = target._op
    return str(target)


def _bounded_shapes(node: Any) -> str | None:
    """At most MAX_DIMS dimensions for the node and its tensor inputs; dynamic dims bounded and lowerable."""
    inputs = [a for a in node.all_input_nodes if _is_node(a)]
    for v in (node, *inputs):
        val = v.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        for t in vals:
            if hasattr(t, "shape") and len(t.shape) > MAX_DIMS:
                return f"rank {len(t.shape)} of {v.name!r} exceeds XNNPACK's {MAX_DIMS} dimensions"
    return unbounded_problem(node, inputs) or dynamic_problem(node, _op_name(node))


def _all(*checks: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def check(node: Any) -> str | None:
        for c in (_bounded_shapes, *checks):
            why = c(node)
            if why:
                return why
        return None
    check.__name__ = " + ".join(c.__name__ for c in (_bounded_shapes, *checks))
    return check


def _rank_is(*ranks: int, index: int = 0) -> Callable[[Any], str | None]:
    def check(node: Any) -> str | None:
        s = shape(node.args[index])
        if s is None or len(s) not in ranks:
            return f"input rank {None if s is None else len(s)} not in {ranks}"
        return None
    return check


def _conv(node: Any) -> str | None:
    x, w = shape(node.args[0]), shape(node.args[1])
    if x is None or len(x) != 4 or w is None:
        return "only 2-D convolutions (4-D input) are supported"
    if arg(node, 6, "transposed", False):
        return "transposed convolution is not supported"
    groups = arg(node, 8, "groups", 1)
    if x[1] % groups or w[0] % groups:
        return f"groups={groups} does not divide the channels"
    if any(p < 0 for p in arg(node, 4, "padding", [0, 0])):
        return "negative padding"
    return None


def _batch_norm(node: Any) -> str | None:
    s = shape(node.args[0])
    if s is None or len(s) != 4:
        return "batch norm is lowered for 4-D (NCHW) inputs only"
    if node.args[1] is None or node.args[2] is None:
        return "batch norm without affine weight/bias"
    for user in node.users:
        if user.target is not operator.getitem or user.args[1] != 0:
            return "batch norm statistics outputs are used"
    return None


def _getitem0_only(node: Any) -> str | None:
    val = node.args[0].meta.get("val")
    if getattr(val, "dtype", None) is None or str(val.dtype) != "torch.float32":
        return "input must be float32"
    for user in node.users:
        if user.target is not operator.getitem or user.args[1] != 0:
            return "the indices output is used"
    return None


def _pool(node: Any) -> str | None:
    s = shape(node.args[0])
    if s is None or len(s) != 4:
        return "only 4-D (NCHW) pooling"
    if arg(node, 5 if "max" in str(node.target) else 4, "ceil_mode", False):
        return "ceil_mode=True"
    return None


def _resize(node: Any) -> str | None:
    s, out = shape(node.args[0]), shape(node)
    if s is None or len(s) != 4 or out is None or len(out) != 4:
        return "only 4-D (NCHW) inputs with a static output size"
    return None


def _avg_pool(node: Any) -> str | None:
    why = _pool(node)
    if why:
        return why
    if arg(node, 6, "divisor_override") is not None:
        return "divisor_override"
    padding = arg(node, 3, "padding", [0, 0])
    if any(padding) and arg(node, 5, "count_include_pad", True):
        return "padding with count_include_pad=True (XNNPACK averages over valid pixels only)"
    return None


def _mean(node: Any) -> str | None:
    dims = arg(node, 1, "dim")
    r = rank(node.args[0])
    val = node.args[0].meta.get("val")
    if r and dims is not None and [d % r for d in dims] == [r - 1]:  # RMSNorm's mean(-1, keepdim=True)
        if not arg(node, 2, "keepdim", False):
            return "mean over the last dim without keepdim"
        last = val.shape[-1]
        return None if type(last) is int and last > 0 else "mean over a dynamic or empty last dim"
    s = shape(node.args[0])
    if s is None or len(s) != 4 or dims is None or sorted(d % 4 for d in dims) != [2, 3]:
        return "only the mean over H and W of a 4-D tensor (global average pooling) or over the last dim"
    return None


def _adaptive(node: Any) -> str | None:
    s = shape(node.args[0])
    out = list(node.args[1])
    if s is None or len(s) != 4:
        return "4-D input needed"
    if s[2] % out[0] or s[3] % out[1]:
        return f"output size {out} does not divide the input {list(s[2:])}"
    return None


def _softmax(node: Any) -> str | None:
    r = rank(node.args[0])
    if not r or node.args[1] % r != r - 1:
        return "softmax over the last dimension only"
    if arg(node, 2, "half_to_float", False):
        return "half_to_float"
    return None


def _alpha_one(node: Any) -> str | None:
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
    return None if alpha == 1 else f"alpha={alpha}"


def _no_rounding(node: Any) -> str | None:
    mode = node.kwargs.get("rounding_mode")
    return None if mode is None else f"rounding_mode={mode!r}"


def _layer_norm(node: Any) -> str | None:
    val = node.args[0].meta.get("val")
    s = tuple(getattr(val, "shape", ()))
    normalized = list(node.args[1])
    trailing = s[len(s) - len(normalized):] if normalized else ()
    if not normalized or any(type(d) is not int for d in trailing) or tuple(trailing) != tuple(normalized):
        return f"normalized shape {normalized} is not the (static) trailing dims of the input {list(s)}"
    if any(type(d) is int and d == 0 for d in s):
        return "empty input"
    stats = any(u.target is operator.getitem and u.args[1] for u in node.users)
    if (len(normalized) > 1 or stats) and sum(type(d) is not int for d in s) > 1:
        return "more than one dynamic leading dim with several normalized dims or mean / rstd outputs (their " \
               "reshapes would infer two dims)"
    for p in node.args[2:4]:
        if p is not None and shape(p) != tuple(normalized):
            return f"weight / bias of shape {shape(p)} instead of {tuple(normalized)}"
    for user in node.users:
        if user.target is not operator.getitem:
            return f"output used by {user.name} without a getitem"
    return None


def _linear(node: Any) -> str | None:
    w = shape(node.args[1])
    if w is None or len(w) != 2:
        return "linear needs a 2-D weight"
    return None


def _addmm(node: Any) -> str | None:
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return "beta/alpha other than 1"
    return None


def _bmm(node: Any) -> str | None:
    return None if rank(node.args[0]) == rank(node.args[1]) == 3 else "bmm needs 3-D operands"


#: a broadcasting expand is claimed up to this many copies of its input (concatenations: ``preprocess/ops/expand``)
EXPAND_MAX_COPIES = 16
#: ops a value passes through unchanged on its way to an expand (looked through to find what it expands)
_VIEW_OPS = ("view_copy", "_unsafe_view", "unsqueeze_copy", "squeeze_copy", "slice_copy", "select_copy",
             "alias_copy", "clone", "permute_copy")
#: the writes of a KV cache (what a cache's expand reads through)
_CACHE_WRITES = ("index_put", "index_put_", "index_copy", "index_copy_")


def _short_name(node: Any) -> str:
    """``view_copy`` of ``aten.view_copy.default``."""
    parts = _op_name(node).split(".")
    return parts[1] if len(parts) == 3 else ".".join(parts)


def _expand(node: Any) -> str | None:
    a, b = node.args[0].meta.get("val"), node.meta.get("val")
    if [str(d) for d in getattr(a, "shape", ())] == [str(d) for d in getattr(b, "shape", ())]:
        return None
    src, out = shape(node.args[0]), shape(node)
    if src is None or out is None:
        return "expand that broadcasts with dynamic dims"
    padded = (1,) * (len(out) - len(src)) + src
    if len(padded) != len(out) or any(i != o and i != 1 for i, o in zip(padded, out, strict=True)):
        return f"expand of {list(src)} to {list(out)}"
    copies = math.prod(o for i, o in zip(padded, out, strict=True) if i != o)
    if copies > EXPAND_MAX_COPIES:
        return f"expand into {copies} copies (over {EXPAND_MAX_COPIES}: a mask or a cache, left to the runtime)"
    origin = node.args[0]
    while _is_node(origin) and origin.op == "call_function" and _short_name(origin) in _VIEW_OPS:
        origin = origin.args[0]
    if not _is_node(origin) or origin.op != "call_function" or _short_name(origin) in _CACHE_WRITES:
        # a KV cache (a buffer, or the index_put updating it) or an input: edgeport's runtime keeps a cache's
        # expand persistent across decode steps, copying only the rows a step writes
        return "expand of a program input, buffer or cache"
    return None


def _slice(node: Any) -> str | None:
    if arg(node, 4, "step", 1) != 1:
        return "slice step other than 1"
    return None


def _cat(node: Any) -> str | None:
    tensors = node.args[0]
    if not 1 <= len(tensors) <= 32:
        return f"{len(tensors)} inputs"
    return None


def _pad(node: Any) -> str | None:
    pads = node.args[1]
    r = rank(node.args[0])
    if any(p < 0 for p in pads):
        return "negative (cropping) padding"
    if r is None or len(pads) > 2 * r:
        return "more padding entries than dimensions"
    return None


def _elu(node: Any) -> str | None:
    if arg(node, 2, "scale", 1) != 1 or arg(node, 3, "input_scale", 1) != 1:
        return "scale/input_scale other than 1"
    return None


def _gelu(node: Any) -> str | None:
    approximate = arg(node, 1, "approximate", "none")
    return None if approximate == "none" else f"approximate={approximate!r} (only the exact erf form)"


def _square(node: Any) -> str | None:
    return None if node.args[1] == 2 else f"exponent {node.args[1]} (only 2, as square)"


_QUANT_DTYPES = {"torch.int8": (-128, 127)}


#: int32 dequantizes: the quantizer's biases (constants; the partitioner checks that), added as they are
_BIAS_DTYPES = {**_QUANT_DTYPES, "torch.int32": (-(2**31), 2**31 - 1)}


def _qparams(node: Any, dtypes: dict[str, tuple[int, int]] = _QUANT_DTYPES) -> str | None:
    """Checks the (scale, zero_point, quant_min, quant_max, dtype) arguments of a per-tensor (de)quantize."""
    names = ("scale", "zero_point", "quant_min", "quant_max", "dtype")
    vals = [arg(node, 1 + i, n) for i, n in enumerate(names)]
    scale, zp, qmin, qmax, dtype = vals
    if str(dtype) not in dtypes:
        return f"quantized dtype {dtype} (only {' / '.join(d[6:] for d in dtypes)})"
    lo, hi = dtypes[str(dtype)]
    if not (isinstance(qmin, int) and isinstance(qmax, int) and lo <= qmin < qmax <= hi):
        return f"quant range [{qmin}, {qmax}] outside [{lo}, {hi}]"
    if _is_node(scale) or _is_node(zp):
        return "scale / zero point given as tensors"
    if not (isinstance(scale, float) and scale > 0 and scale < float("inf")):
        return f"scale {scale!r} is not a positive float"
    if not (isinstance(zp, int) and lo <= zp <= hi):
        return f"zero point {zp!r} outside [{lo}, {hi}]"
    return None


def _quantize(node: Any) -> str | None:
    why = _qparams(node)
    if why:
        return why
    for user in node.users:
        if getattr(user, "op", None) != "call_function" or "dequantize_per_tensor" not in str(user.target):
            return f"quantized value used by {getattr(user, 'name', user)} (not a dequantize): the delegate " \
                   "would output int8"
    return None


def _dequantize(node: Any) -> str | None:
    return _qparams(node, _BIAS_DTYPES)


def _dequantize_per_channel(node: Any) -> str | None:
    dtype = arg(node, 6, "dtype")
    if str(dtype) not in _BIAS_DTYPES:
        return f"quantized dtype {dtype} (only int8 / int32)"
    return None


def _dynamic(node: Any) -> str | None:
    from edgeport_xnnpack.preprocess.dynamic_quantized import (
        dynamic_pattern_reason,  # needs torch; so does node
    )

    return dynamic_pattern_reason(node)


def _cap(op: str, *checks: Callable[[Any], str | None], notes: str = "") -> OpCapability:
    return OpCapability(op, _F32, constraint=_all(*checks), notes=notes)


def _unary(ops: Sequence[tuple[str, str]]) -> list[OpCapability]:
    return [_cap(op, notes=note) for op, note in ops]


_HOST = "host step on edgeport's runtime (libXNNPACK 2022 has no node for it); native on ExecuTorch's"

CAPABILITIES = CapabilityTable((
    _cap("aten.convolution.default", _conv, notes="2-D; groups (depthwise when groups == in channels); "
         "fused with a following batch norm and relu/relu6/hardtanh/clamp"),
    _cap("aten._native_batch_norm_legit_no_training.default", _batch_norm,
         notes="folded into the preceding convolution, else a per-channel multiply-add"),
    _cap("aten.linear.default", _linear, notes="kept whole via ops_to_not_decompose; N-D input"),
    _cap("aten.addmm.default", _addmm, notes="as fully connected; constant weight packed, else " + _HOST),
    _cap("aten.mm.default", notes="as fully connected; a non-constant right operand runs as a " + _HOST),
    _cap("aten.bmm.default", _bmm, notes=_HOST),
    _cap("aten.add.Tensor", _alpha_one, notes="numpy broadcasting"),
    _cap("aten.sub.Tensor", _alpha_one, notes="numpy broadcasting"),
    _cap("aten.mul.Tensor", notes="numpy broadcasting"),
    _cap("aten.div.Tensor", _no_rounding, notes="numpy broadcasting"),
    _cap("aten.add.Scalar", _alpha_one), _cap("aten.sub.Scalar", _alpha_one),
    _cap("aten.mul.Scalar"), _cap("aten.div.Scalar"),
    _cap("aten.relu.default", notes="clamp; fused into the producer when possible"),
    _cap("aten.hardtanh.default", notes="clamp (relu6)"),
    _cap("aten.clamp.default", notes="scalar bounds"),
    _cap("aten.sigmoid.default"), _cap("aten.hardswish.default"),
    _cap("aten.leaky_relu.default"), _cap("aten.elu.default", _elu),
    _cap("aten.gelu.default", _gelu, notes="exact (erf) form; the 2022 library has no GELU node: a vectorized C "
         "host kernel inside the delegate (ExecuTorch's runtime runs its XNNGelu node)"),
    *_unary([("aten.abs.default", ""), ("aten.neg.default", ""), ("aten.floor.default", ""),
             ("aten.ceil.default", ""), ("aten.sqrt.default", "")]),
    _cap("aten.pow.Tensor_Scalar", _square, notes="exponent 2 only (square)"),
    OpCapability("aten.max_pool2d_with_indices.default", ("float32", "int64"),
                 constraint=_all(_pool, _getitem0_only), notes="float32 input; indices unused; no ceil_mode"),
    _cap("aten.max_pool2d.default", _pool, notes="no ceil_mode"),
    _cap("aten.avg_pool2d.default", _avg_pool, notes="no ceil_mode / divisor_override"),
    _cap("aten.mean.dim", _mean, notes="over H and W of a 4-D tensor: global average pooling; over the last dim "
         "(keepdim): fully connected with a constant 1/D filter"),
    _cap("aten.rsqrt.default", notes="square root, then 1 / it (the 2022 library has no reciprocal square root)"),
    _cap("aten._adaptive_avg_pool2d.default", _adaptive, notes="output size dividing the input"),
    _cap("aten.upsample_bilinear2d.vec", _resize, notes="4-D, static output size; align_corners either way"),
    _cap("aten._softmax.default", _softmax, notes="last dimension"),
    _cap("aten.native_layer_norm.default", _layer_norm, notes="over the trailing dims: two fully connected "
         "reductions (mean, variance + eps), subtract, square, square root, divide, multiply, add; mean / rstd "
         "outputs too"),
    _cap("aten.view_copy.default", notes="static reshape"),
    _cap("aten._unsafe_view.default"), _cap("aten.squeeze_copy.dims"), _cap("aten.squeeze_copy.dim"),
    _cap("aten.unsqueeze_copy.default"), _cap("aten.clone.default", notes="identity reshape"),
    _cap("aten.alias_copy.default", notes="identity reshape"),
    _cap("aten.expand_copy.default", _expand, notes="no-op, or broadcasting size-1 dims into at most "
         f"{EXPAND_MAX_COPIES} copies of a value computed in the graph (grouped-query attention's repeat_kv; not a "
         "cache or input): concatenations, " + _HOST),
    _cap("aten.permute_copy.default", notes="static transpose; on edgeport's runtime a 2-D transpose (e.g. NCHW <-> "
         "NHWC) runs on XNNPACK's channel-shuffle operator, one moving only size-1 dims is a reshape, others are "
         "host steps (libXNNPACK 2022 has no transpose node); native on ExecuTorch's"),
    _cap("aten.cat.default", _cat, notes="concatenate (chained for more than 5 inputs); " + _HOST),
    _cap("aten.slice_copy.Tensor", _slice, notes="step 1; " + _HOST),
    _cap("aten.select_copy.int", notes="slice + reshape; " + _HOST),
    _cap("aten.constant_pad_nd.default", _pad, notes="static constant pad"),
))


# The quantize / dequantize rows (int8), in a table of their own: ``CAPABILITIES`` (what ``capabilities()``
# registers) holds the float32 core ATen ops; XnnpackPartitioner uses both (``ALL_CAPABILITIES``).
_AFFINE_DTYPES = ("float32", "int8", "int32", "int64")
QUANTIZED_CAPABILITIES = CapabilityTable((
    OpCapability("quantized_decomposed.quantize_per_tensor.default", ("float32", "int8"),
                 constraint=_all(_quantize), notes="int8; absorbed into the int8 node before it, else "
                 "XNNConvert (float32 -> qint8); every user must be a dequantize"),
    OpCapability("quantized_decomposed.dequantize_per_tensor.default", ("int8", "int32", "float32"),
                 constraint=_all(_dequantize), notes="int8, of a delegated quantize or a constant; absorbed into "
                 "the int8 nodes reading it, else XNNConvert (qint8 -> float32); int32: a constant bias"),
    OpCapability("quantized_decomposed.dequantize_per_channel.default",
                 ("int8", "float32", "float64", "int32", "int64"), constraint=_all(_dequantize_per_channel),
                 notes="int8 constant weights (qcint8 filter of an int8 convolution / linear, else folded to "
                 "float32); int32 constant biases (qcint32, as they are)"),
    OpCapability("quantized_decomposed.choose_qparams.tensor", ("float32", "float64", "int64"),
                 constraint=_dynamic, notes="dynamic int8 (XnnpackQuantizer(dynamic=True)): with the quantize / "
                 "dequantize after it, an XNNConvert to qdint8 (per-row parameters at run time) feeding linears"),
    OpCapability("quantized_decomposed.quantize_per_tensor.tensor", ("float32", "float64", "int64", "int8"),
                 constraint=_dynamic, notes="dynamic int8: part of the qdint8 convert"),
    OpCapability("quantized_decomposed.dequantize_per_tensor.tensor", ("int8", "float64", "int64", "float32"),
                 constraint=_dynamic, notes="dynamic int8: read only by linears (qdint8 x qcint8 fully connected)"),
    OpCapability("torchao.choose_qparams_affine.default", _AFFINE_DTYPES, notes="torchao quantize_ "
                 "(Int8DynamicActivationIntxWeightConfig): per-token int8 parameters, part of the qdint8 convert; "
                 "the partitioner checks the whole linear pattern"),
    OpCapability("torchao.quantize_affine.default", _AFFINE_DTYPES, notes="torchao quantize_: part of the "
                 "qdint8 convert"),
    OpCapability("torchao.dequantize_affine.default", _AFFINE_DTYPES, notes="torchao quantize_: the qdint8 "
                 "input of a linear, or its weight (int8 per channel -> qcint8; int4 per group of 32k or per "
                 "channel -> qbint4 with bfloat16 scales); symmetric weights only"),
))
ALL_CAPABILITIES = CapabilityTable((*CAPABILITIES.ops, *QUANTIZED_CAPABILITIES.ops))


def register_quantized_ops() -> None:
    """Define the ``quantized_decomposed`` ops the table names, when torch is already imported.

    torch defines them in ``torch.ao.quantization.fx._decomposed``, which only quantization code imports; a
    reader that resolves the table's names to overloads needs them. Never imports torch itself, so this module
    stays torch-free for torch-free callers.
    """
    if "torch" in sys.modules:
        try:
            importlib.import_module("torch.ao.quantization.fx._decomposed")
        except ImportError:  # pragma: no cover - a torch without the quantized_decomposed library
            pass


def capabilities() -> CapabilityTable:
    """The float32 table (the factory ``BackendSpec.capabilities`` expects; the docs' op table and the
    conformance suite read it). The quantize / dequantize rows are documented in the docs' Quantization section."""
    return CAPABILITIES
