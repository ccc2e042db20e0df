"""Planning of the operators on int32 and bool tensors (and mixed with float ones) of a ``VkGraph``: integer
arithmetic, comparisons, logical and bitwise ops, ``where``, casts, constants made on the device (``full``,
``arange``, ``scalar_tensor``) through the ``ewise`` shader, and indexing (``embedding``, ``index_select``,
``index.Tensor``, ``gather``) through the ``gather`` shader, ``cumsum`` and ``any`` through the ``scan`` shader. See :mod:`edgeport_vulkan._plan`.

Device tensors are 32-bit words: float32 bits, int32 values (``int64`` tensors are lowered as INT32, as
ExecuTorch's Vulkan delegate does; the executor refuses inputs outside the int32 range), bools as 0 / 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ._launch import contiguous_strides, pad6
from ._plan_context import (
    BOOL,
    FLOAT,
    INT,
    KIND_NAMES,
    PlanContext,
    check_nargs,
    dispatch_groups,
)
from .schema import Bool, Double, Int, Null, ValueList, VkTensor

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

_ARITH = {"add": 0, "sub": 1, "mul": 2, "div": 3, "maximum": 4, "minimum": 5}
_COMPARE = {"eq": 10, "ne": 11, "lt": 12, "le": 13, "gt": 14, "ge": 15}
_LOGICAL = {"logical_and": 20, "logical_or": 21, "logical_xor": 22, "logical_not": 23}
_BITWISE = {"bitwise_and": 30, "bitwise_or": 31, "bitwise_xor": 32, "bitwise_not": 33}
WHERE, CAST = 40, 41


def kind_of(ctx: PlanContext, vid: int) -> int:
    return ctx.plan.kinds.get(vid, FLOAT)


def ewise(ctx: PlanContext, op: int, operands: list[int], out: int, out_kind: int | None = None,
          shape: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """One ``ewise`` dispatch: ``operands`` (tensor or synthetic ids, 1..3) broadcast to the output's shape
    (``shape``, else their broadcast shape); the output's declared kind must be ``out_kind`` when given."""
    dims = [() if vid < 0 and ctx.plan.dims[vid] == (1,) else ctx.plan.dims[vid] for vid in operands]
    try:
        full = tuple(np.broadcast_shapes(*dims, *([shape] if shape is not None else [])))
    except ValueError:
        raise ctx.fail(f"shapes {[list(d) for d in dims]} do not broadcast") from None
    if shape is not None and full != tuple(shape):
        raise ctx.fail(f"operands {[list(d) for d in dims]} do not broadcast to {list(shape)}")
    _, kind = ctx.out_typed(out, full, out_kind)
    n = math.prod(full)

    def bstrides(d: tuple[int, ...]) -> list[int]:
        lead = len(full) - len(d)
        st = [0] * lead + contiguous_strides(d)
        return [0 if s == 1 else t for s, t in zip((1,) * lead + tuple(d), st)]

    ops = list(operands)
    while len(ops) < 3:
        ops.append(ops[0])  # unused binding; stride 0 below
    strides = [bstrides(dims[i]) if i < len(operands) else [0] * len(full) for i in range(3)]
    cshape, (sa, sb, sc) = ctx.coalesce(full, *strides)
    kinds = [kind_of(ctx, v) for v in ops]
    ctx.dispatch("ewise", [*ops, out], "25i", [n, *pad6(cshape), *pad6(sa, 0), *pad6(sb, 0), *pad6(sc, 0)],
                 dispatch_groups(n, 256), (op, len(cshape), *kinds, kind))
    return full


def scalar_operand(ctx: PlanContext, vid: int, what: str = "scalar operand") -> int:
    """A tensor operand as is, or a Scalar argument as a one-element synthetic of its own kind."""
    v = ctx.value(vid)
    if isinstance(v, VkTensor):
        ctx.typed(vid)
        return vid
    if isinstance(v, Bool):
        return ctx.synthetic(np.array([int(v.bool_val)]), BOOL)
    if isinstance(v, Int):
        i = int(v.int_val)
        if not INT32_MIN <= i <= INT32_MAX:
            raise ctx.fail(f"{what} {i} is outside the int32 range of device tensors")
        return ctx.synthetic(np.array([i]), INT)
    if isinstance(v, Double):
        return ctx.synthetic(np.array([float(v.double_val)], np.float32))
    raise ctx.fail(f"{what} (value {vid}) is a {type(v).__name__}, expected a tensor or a number")


def _base(name: str) -> str:
    return name.split(".")[1]


# -- elementwise --------------------------------------------------------------------------------------------------
def typed_binary(ctx: PlanContext, args: list[int]) -> None:
    """add / sub / mul / div / maximum / minimum with an int32 or bool operand or output."""
    base = _base(ctx.op)
    has_alpha = base in ("add", "sub")
    check_nargs(ctx, args, 3, 4 if has_alpha else 3)
    if has_alpha and len(args) == 4 and not ctx.is_null(args[2]) and ctx.num(args[2], "alpha") != 1:
        raise ctx.fail("alpha != 1 is not supported")
    a, b = scalar_operand(ctx, args[0]), scalar_operand(ctx, args[1])
    out_kind = ctx.typed_dims(args[-1], ctx.tensor_decl(args[-1]))[1]
    if out_kind != FLOAT and FLOAT in (kind_of(ctx, a), kind_of(ctx, b)):
        raise ctx.fail(f"a float operand with a {KIND_NAMES[out_kind]} output")
    if base == "div" and out_kind != FLOAT:
        raise ctx.fail("true division into an integer output")
    if base == "sub" and BOOL in (kind_of(ctx, a), kind_of(ctx, b)) and out_kind == BOOL:
        raise ctx.fail("subtraction of bools")
    ewise(ctx, _ARITH[base], [a, b], args[-1])


def _compare(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 3)
    a, b = scalar_operand(ctx, args[0]), scalar_operand(ctx, args[1])
    ewise(ctx, _COMPARE[_base(ctx.op)], [a, b], args[-1], BOOL)


def _logical(ctx: PlanContext, args: list[int]) -> None:
    base = _base(ctx.op)
    unary = base == "logical_not"
    check_nargs(ctx, args, 2 if unary else 3)
    operands = [scalar_operand(ctx, v) for v in args[:-1]]
    ewise(ctx, _LOGICAL[base], operands, args[-1], BOOL)


def _bitwise(ctx: PlanContext, args: list[int]) -> None:
    base = _base(ctx.op)
    check_nargs(ctx, args, 2 if base == "bitwise_not" else 3)
    operands = [scalar_operand(ctx, v) for v in args[:-1]]
    if any(kind_of(ctx, v) == FLOAT for v in operands):
        raise ctx.fail("bitwise operators take int32 and bool tensors only")
    out_kind = BOOL if all(kind_of(ctx, v) == BOOL for v in operands) else INT
    ewise(ctx, _BITWISE[base], operands, args[-1], out_kind)


def _where(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 4)
    cond, a, b = (scalar_operand(ctx, v) for v in args[:3])
    ewise(ctx, WHERE, [cond, a, b], args[-1])


def _to_copy(ctx: PlanContext, args: list[int]) -> None:
    """``_to_copy`` (and ``_to_dim_order_copy`` with the contiguous order): a cast to the output's kind."""
    check_nargs(ctx, args, 2, 8)
    if ctx.op.startswith("dim_order_ops.") and len(args) > 2 and not ctx.is_null(args[-2]):
        order = ctx.ints(args[-2], "dim_order")
        if order != sorted(order):
            raise ctx.fail(f"dim_order {order} is not contiguous")
    dims, _ = ctx.typed(args[0])
    ewise(ctx, CAST, [args[0]], args[-1], None, dims)


# -- constants made on the device ---------------------------------------------------------------------------------
def _number(ctx: PlanContext, vid: int, what: str) -> int | float | bool:
    v = ctx.value(vid)
    if isinstance(v, Bool):
        return bool(v.bool_val)
    if isinstance(v, Int):
        return int(v.int_val)
    return ctx.num(vid, what)


def _as_kind(ctx: PlanContext, values: np.ndarray, kind: int) -> np.ndarray:
    if kind == FLOAT:
        return values.astype(np.float32)
    if kind == BOOL:
        return (values != 0).astype(np.int32)
    if values.size and (np.any(~np.isfinite(values.astype(np.float64))) or values.min() < INT32_MIN
                        or values.max() > INT32_MAX):
        raise ctx.fail("a constant is outside the int32 range of device tensors")
    return np.trunc(values).astype(np.int32)


def _fill(ctx: PlanContext, out: int, value: int | float | bool, shape: tuple[int, ...]) -> None:
    kind = ctx.typed_dims(out, ctx.tensor_decl(out))[1]
    src = ctx.synthetic(_as_kind(ctx, np.array([value], np.float64 if isinstance(value, float) else np.int64),
                                 kind), kind)
    ewise(ctx, CAST, [src], out, kind, shape)


def _scalar_tensor(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 2, 6)
    _fill(ctx, args[-1], _number(ctx, args[0], "s"), ())


def _full(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 3, 7)
    size = tuple(ctx.ints(args[0], "size"))
    if any(s < 0 for s in size):
        raise ctx.fail(f"size {list(size)}")
    _fill(ctx, args[-1], _number(ctx, args[1], "fill_value"), size)


def _full_like(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 3, 8)
    dims, _ = ctx.typed(args[0])
    if len(args) == 8 and not ctx.is_null(args[-2]):
        raise ctx.fail("a memory_format argument")
    _fill(ctx, args[-1], _number(ctx, args[1], "fill_value"), dims)


def _arange(ctx: PlanContext, args: list[int]) -> None:
    if ctx.op == "aten.arange.default":
        check_nargs(ctx, args, 2, 6)
        start, end, step = 0, _number(ctx, args[0], "end"), 1
    else:
        check_nargs(ctx, args, 4, 8)
        start, end, step = (_number(ctx, args[i], w) for i, w in ((0, "start"), (1, "end"), (2, "step")))
    if step == 0 or not all(math.isfinite(v) for v in (start, end, step)):
        raise ctx.fail(f"arange({start}, {end}, {step})")
    length = max(0, math.ceil((end - start) / step))
    kind = ctx.typed_dims(args[-1], ctx.tensor_decl(args[-1]))[1]
    exact = all(isinstance(v, int) for v in (start, end, step))
    values = np.arange(length, dtype=np.int64 if exact else np.float64) * step + start
    src = ctx.synthetic(_as_kind(ctx, values, kind), kind)
    ewise(ctx, CAST, [src], args[-1], kind, (length,))


# -- indexing -------------------------------------------------------------------------------------------------------
def _index_tensor(ctx: PlanContext, vid: int, what: str = "indices") -> tuple[int, ...]:
    dims, kind = ctx.typed(vid, what)
    if kind != INT:
        raise ctx.fail(f"{what} tensor {vid} is {KIND_NAMES[kind]}; indices must be integers")
    return dims


def _gather_rows(ctx: PlanContext, src: int, idx: int, out: int, outer: int, size: int, inner: int,
                 shape: tuple[int, ...], wrap: bool) -> None:
    """``out[o, j, k] = src[o, idx[j], k]`` over (outer, size, inner) with out ``shape``."""
    _, kind = ctx.out_typed(out, shape, kind_of(ctx, src))
    n, nidx = math.prod(shape), math.prod(ctx.plan.dims[idx])
    if n == 0:
        return
    if size == 0:
        raise ctx.fail("indexing into an empty dimension")
    ctx.dispatch("gather", [src, idx, out, ctx.status()], "18i",
                 [n, size, inner, nidx, 0, 0, *pad6([]), *pad6([], 0)], dispatch_groups(n, 256), (0, int(wrap)))


def _embedding(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 3, 6)
    w, _ = ctx.typed(args[0], "weight")
    idx = _index_tensor(ctx, args[1])
    if len(w) != 2:
        raise ctx.fail(f"weight of shape {list(w)} is not 2-D")
    _gather_rows(ctx, args[0], args[1], args[-1], 1, w[0], w[1], (*idx, w[1]), False)


def _index_select(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 4)
    x, _ = ctx.typed(args[0])
    d = ctx.dim(ctx.int_(args[1], "dim"), len(x))
    idx = _index_tensor(ctx, args[2], "index")
    if len(idx) > 1:
        raise ctx.fail(f"index of shape {list(idx)} is not 1-D")
    x = x or (1,)
    _gather_rows(ctx, args[0], args[2], args[-1], math.prod(x[:d]), x[d], math.prod(x[d + 1:]),
                 (*x[:d], math.prod(idx), *x[d + 1:]) if ctx.plan.dims[args[0]] else tuple(idx), False)


def _index(ctx: PlanContext, args: list[int]) -> None:
    """``index.Tensor`` with one index tensor (integer, any shape) at one dim, the others ``None``."""
    check_nargs(ctx, args, 3)
    x, _ = ctx.typed(args[0])
    lst = ctx.value(args[1])
    if not isinstance(lst, ValueList):
        raise ctx.fail("indices must be a ValueList")
    given = [(d, vid) for d, vid in enumerate(lst.items) if not isinstance(ctx.value(vid), Null)]
    if len(given) != 1 or len(lst.items) > len(x):
        raise ctx.fail(f"{len(given)} index tensors over {len(lst.items)} dims of a rank-{len(x)} tensor; only one "
                       "index tensor is supported")
    d, vid = given[0]
    idx = _index_tensor(ctx, vid)
    _gather_rows(ctx, args[0], vid, args[-1], math.prod(x[:d]), x[d], math.prod(x[d + 1:]),
                 (*x[:d], *idx, *x[d + 1:]), True)


def _gather(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 4, 5)
    x, _ = ctx.typed(args[0])
    d = ctx.dim(ctx.int_(args[1], "dim"), len(x))
    idx = _index_tensor(ctx, args[2], "index")
    if len(idx) != len(x) or any(i > s for k, (i, s) in enumerate(zip(idx, x)) if k != d):
        raise ctx.fail(f"index of shape {list(idx)} does not fit input {list(x)} outside dim {d}")
    _, kind = ctx.out_typed(args[-1], idx, kind_of(ctx, args[0]))
    n = math.prod(idx)
    if n == 0:
        return
    if x[d] == 0:
        raise ctx.fail("gathering from an empty dimension")
    if len(x) > 6:
        raise ctx.fail("more than 6 dims")
    ctx.dispatch("gather", [args[0], args[2], args[-1], ctx.status()], "18i",
                 [n, x[d], 1, n, len(x), d, *pad6(idx), *pad6(contiguous_strides(x), 0)], dispatch_groups(n, 256),
                 (1, 0))


# -- scans and reductions along one dim ----------------------------------------------------------------------------
def _lines(ctx: PlanContext, x: tuple[int, ...], d: int) -> tuple[int, int, int]:
    return math.prod(x[:d]), (x[d] if x else 1), math.prod(x[d + 1:])


def _cumsum(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 3, 4)
    x, kind = ctx.typed(args[0])
    d = ctx.dim(ctx.int_(args[1], "dim"), len(x))
    _, out_kind = ctx.out_typed(args[-1], x)
    if out_kind == BOOL or (kind == FLOAT and out_kind != FLOAT):
        raise ctx.fail(f"cumsum of {KIND_NAMES[kind]} into {KIND_NAMES[out_kind]}")
    outer, length, inner = _lines(ctx, x, d)
    ctx.dispatch("scan", [args[0], args[-1]], "3i", [outer * inner, length, inner],
                 dispatch_groups(outer * inner, 64), (0, kind, out_kind))


def _any(ctx: PlanContext, args: list[int]) -> None:
    """``any`` over one dim (``any.dim``, ``any.dims`` with one dim) or over everything (``any.default``)."""
    x, kind = ctx.typed(args[0])
    if ctx.op == "aten.any.default":
        check_nargs(ctx, args, 2)
        outer, length, inner, shape = 1, math.prod(x), 1, ()
    else:
        check_nargs(ctx, args, 4)
        dims = ctx.ints(args[1], "dim") if not ctx.is_null(args[1]) else list(range(len(x)))
        if len(dims) != 1 and len(x) > 1:
            raise ctx.fail(f"any over dims {dims}: one dim only")
        d = ctx.dim(dims[0], len(x)) if dims else 0
        outer, length, inner = _lines(ctx, x, d)
        keep = ctx.flag(args[2], "keepdim")
        shape = tuple(1 if i == d else s for i, s in enumerate(x)) if keep else x[:d] + x[d + 1:]
    ctx.out_typed(args[-1], shape, BOOL)
    ctx.dispatch("scan", [args[0], args[-1]], "3i", [outer * inner, length, inner],
                 dispatch_groups(outer * inner, 64), (1, kind, BOOL))


TYPED_HANDLERS: dict[str, Callable[[PlanContext, list[int]], None]] = {
    **{f"aten.{op}.{o}": _compare for op in _COMPARE for o in ("Tensor", "Scalar")},
    **{f"aten.{op}.default": _logical for op in _LOGICAL},
    **{f"aten.{op}.{o}": _bitwise for op in ("bitwise_and", "bitwise_or", "bitwise_xor") for o in ("Tensor", "Scalar")},
    "aten.bitwise_not.default": _bitwise,
    "aten.where.self": _where, "aten._to_copy.default": _to_copy,
    "dim_order_ops._to_dim_order_copy.default": _to_copy,
    "aten.scalar_tensor.default": _scalar_tensor, "aten.full.default": _full, "aten.full_like.default": _full_like,
    "aten.arange.start_step": _arange, "aten.arange.default": _arange,
    "aten.embedding.default": _embedding, "aten.index_select.default": _index_select, "aten.index.Tensor": _index,
    "aten.gather.default": _gather, "aten.cumsum.default": _cumsum,
    "aten.any.dim": _any, "aten.any.dims": _any, "aten.any.default": _any,
}
