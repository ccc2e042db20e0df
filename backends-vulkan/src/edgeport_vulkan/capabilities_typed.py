"""``VulkanBackend``'s capability rows for int32 / bool tensors (torch-free, like :mod:`edgeport_vulkan.capabilities`).

Data movement and ``add`` / ``sub`` / ``mul`` / ``div`` / ``maximum`` / ``minimum`` take int64 / int32 and bool
tensors besides float32 (:data:`WIDENED`), and integer arithmetic, comparisons, logical / bitwise ops, ``where``,
casts, ``full`` / ``arange`` / ``scalar_tensor`` and indexing (``embedding``, ``index_select``, ``index.Tensor``,
``gather``) are added (:func:`typed_rows`). The device computes them as int32 words, as ExecuTorch's Vulkan delegate
does: an int64 graph input outside int32 is refused at the run, a constant or an integer argument outside it here.
An index out of range fails the run (the gather shader flags it). ``force_fp16`` graphs keep them on the CPU
(:func:`fp16_refusal`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from edgeport.backend import OpCapability
from edgeport.node_helpers import node_arg as arg
from edgeport.node_helpers import node_shape as shape_of
from edgeport.node_helpers import node_value as _val

Constraint = Callable[[Any], "str | None"]
_F = ("float32",)
_I = ("int64", "int32", "bool")
_FI = ("float32", *_I)
INT32_RANGE = (-(2**31), 2**31 - 1)
#: rows of the float table that take integer / bool tensors as well
WIDENED = frozenset({
    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor", "aten.add.Scalar", "aten.sub.Scalar",
    "aten.mul.Scalar", "aten.div.Scalar", "aten.maximum.default", "aten.minimum.default",
    "aten.view_copy.default", "aten._unsafe_view.default", "aten.squeeze_copy.dims", "aten.squeeze_copy.dim",
    "aten.unsqueeze_copy.default", "aten.clone.default", "aten.permute_copy.default", "aten.select_copy.int",
    "aten.expand_copy.default", "aten.split_with_sizes_copy.default", "aten.cat.default", "aten.slice_copy.Tensor",
    "aten.constant_pad_nd.default",
})
_ARITH = ("add", "sub", "mul", "div", "maximum", "minimum")
#: ops whose rows use the word-storage shaders (``ewise``, ``gather``) even on float tensors
WORD_OPS = frozenset({"aten.cumsum.default", "aten.any.dim", "aten.any.dims", "aten.where.self", "aten._to_copy.default", "aten.scalar_tensor.default", "aten.full.default",
                      "aten.full_like.default", "aten.arange.start_step", "aten.embedding.default",
                      "aten.index_select.default", "aten.index.Tensor", "aten.gather.default"})


def _dtype(node: Any) -> str:
    return str(getattr(_val(node), "dtype", "")).removeprefix("torch.")


def _int_args(node: Any) -> str | None:
    for a in node.args:
        if isinstance(a, int) and not isinstance(a, bool) and not INT32_RANGE[0] <= a <= INT32_RANGE[1]:
            return f"integer {a} is outside int32, the Vulkan delegate's integer type"
    return None


def _index_dtype(idx: Any) -> str | None:
    if _dtype(idx) not in ("int64", "int32"):
        return f"index tensor of dtype {_dtype(idx) or None} (integer indices only)"
    return None


def _embedding(node: Any) -> str | None:
    return _index_dtype(node.args[1])


def _index_select(node: Any) -> str | None:
    s = shape_of(node.args[2])
    if s is not None and len(s) > 1:
        return f"index of shape {list(s)} is not 1-D"
    return _index_dtype(node.args[2])


def _gather(node: Any) -> str | None:
    if arg(node, 3, "sparse_grad", False):
        return "sparse_grad"
    return _index_dtype(node.args[2])


def _index(node: Any) -> str | None:
    given = [t for t in node.args[1] if t is not None]
    if len(given) != 1:
        return f"{len(given)} index tensors (the gather shader takes one, the other dims None)"
    return _index_dtype(given[0])


def _cast(node: Any) -> str | None:
    if _dtype(node) not in _FI:
        return f"cast to {_dtype(node)} (float32, int64 / int32 and bool only)"
    fmt = node.kwargs.get("memory_format")
    if fmt is not None and str(fmt) not in ("torch.preserve_format", "torch.contiguous_format"):
        return f"memory_format {fmt}"
    return None


def _arange(node: Any) -> str | None:
    if _dtype(node) in ("int64", "int32"):
        bounds = [a for a in node.args if isinstance(a, int | float) and not isinstance(a, bool)]
        if any(not INT32_RANGE[0] <= b <= INT32_RANGE[1] for b in bounds):
            return f"arange bounds {bounds} outside int32"
    return _int_args(node)


def _cumsum(node: Any) -> str | None:
    if _dtype(node) not in ("float32", "int64", "int32"):
        return f"cumsum into {_dtype(node)}"
    if _dtype(node.args[0]) == "float32" and _dtype(node) != "float32":
        return "cumsum of floats into integers"
    return None


def _any_dims(node: Any) -> str | None:
    dims = node.args[1] if len(node.args) > 1 else None
    s = shape_of(node.args[0])
    if (dims is None or len(dims) != 1) and (s is None or len(s) > 1):
        return f"any over dims {dims} (one dim only)"
    return None


def _upsample(node: Any) -> str | None:
    s = shape_of(node.args[0])
    if s is None or len(s) != 4:
        return "only 4-D (NCHW) inputs"
    if node.args[1] is None or (len(node.args) > 3 and node.args[3] is not None):
        return "scale_factors instead of an output size"
    return None


def _bitwise(node: Any) -> str | None:
    if any(isinstance(a, float) for a in node.args):
        return "a float operand of a bitwise op"
    return None


def _both(check: Constraint, base: Constraint) -> Constraint:
    def constraint(node: Any) -> str | None:
        return check(node) or base(node)

    constraint.__name__ = f"{getattr(check, '__name__', 'check')} + {getattr(base, '__name__', 'check')}"
    return constraint


def typed_rows(table: tuple[OpCapability, ...], static: Constraint) -> tuple[OpCapability, ...]:
    """``table`` with the :data:`WIDENED` rows taking int / bool tensors too, plus the rows for int / bool ops;
    ``static`` is the table's shape check (static, rank, empty tensors)."""
    def widen(c: OpCapability) -> OpCapability:
        if c.op not in WIDENED:
            return c
        if c.op.split(".")[1] in _ARITH:  # torch has no subtraction of bools
            return dataclasses.replace(c, dtypes=_FI if not c.op.startswith("aten.sub.") else _FI[:3],
                                       constraint=_both(_int_args, c.constraint or static),
                                       notes=f"{c.notes}; int / bool operands: ewise shader")
        return dataclasses.replace(c, dtypes=_FI, notes=f"{c.notes}; int / bool: its int32 build"
                                   if "shader" in c.notes else c.notes)

    widened = tuple(widen(c) for c in table)
    ints = _both(_int_args, static)
    return widened + (
        OpCapability("aten.alias_copy.default", _FI, static, "no dispatch (buffer alias)"),
        OpCapability("aten.sin.default", _F, static, "unary shader"),
        OpCapability("aten.cos.default", _F, static, "unary shader"),
        *(OpCapability(f"aten.{op}.{o}", _FI, ints, "ewise shader: comparison, out bool (int32 when both operands "
                       "are integers)") for op in ("eq", "ne", "lt", "le", "gt", "ge") for o in ("Tensor", "Scalar")),
        *(OpCapability(f"aten.logical_{op}.default", _FI, static, "ewise shader: logical op (operands != 0)")
          for op in ("and", "or", "xor", "not")),
        *(OpCapability(f"aten.bitwise_{op}.{o}", _I, _both(_bitwise, ints),
                       "ewise shader: bitwise op on int32 / bool words") for op in ("and", "or", "xor")
          for o in ("Tensor", "Scalar")),
        OpCapability("aten.bitwise_not.default", _I, static, "ewise shader: bitwise op on int32 / bool words"),
        OpCapability("aten.where.self", _FI, static, "ewise shader: select, N-D broadcasting"),
        OpCapability("aten._to_copy.default", _FI, _both(_cast, static),
                     "ewise shader: cast (float -> int truncates toward zero, -> bool is != 0)"),
        OpCapability("aten.scalar_tensor.default", _FI, ints, "ewise shader: a constant"),
        OpCapability("aten.full.default", _FI, ints, "ewise shader: a broadcast constant"),
        OpCapability("aten.full_like.default", _FI, ints, "ewise shader: a broadcast constant"),
        OpCapability("aten.arange.start_step", _FI, _both(_arange, static),
                     "values made at load, copied by the ewise shader"),
        OpCapability("aten.embedding.default", _FI, _both(_embedding, static),
                     "gather shader: rows of the weight (an out-of-range index fails the run)"),
        OpCapability("aten.index_select.default", _FI, _both(_index_select, static), "gather shader (1-D index)"),
        OpCapability("aten.index.Tensor", _FI, _both(_index, static),
                     "gather shader (one integer index tensor, negative indices wrap)"),
        OpCapability("aten.gather.default", _FI, _both(_gather, static), "gather shader (index of the input's rank)"),
        OpCapability("aten.cumsum.default", _FI, _both(_cumsum, static),
                     "scan shader: one invocation per line (int32 sums wrap at 32 bits)"),
        OpCapability("aten.any.dim", _FI, static, "scan shader: any along one dim"),
        OpCapability("aten.any.dims", _FI, _both(_any_dims, static), "scan shader: any along one dim"),
        # float only, added with these rows (the last op ExecuTorch delegates on the architecture suite's CNNs)
        OpCapability("aten.upsample_bilinear2d.vec", _F, _both(_upsample, static),
                     "upsample shader (bilinear, either align_corners, NCHW, output size given)"),
    )


def fp16_refusal(node: Any, name: str) -> str | None:
    """Why ``node`` (operator ``name``) stays on the CPU under ``force_fp16`` (int / bool tensors, word-storage
    shaders), else None."""
    if name in WORD_OPS:
        return f"force_fp16: {name} runs on 32-bit word storage, which an fp16 graph does not have"
    for n in [node, *getattr(node, "all_input_nodes", [])]:
        vals = _val(n)
        for v in vals if isinstance(vals, tuple | list) else [vals]:
            dt = str(getattr(v, "dtype", "")).removeprefix("torch.")
            if dt in _I and not (name.startswith("aten.max_pool2d_with_indices") and n is node):
                return f"force_fp16: {getattr(n, 'name', n)} is {dt}; an fp16 graph computes float tensors only"
    return None
