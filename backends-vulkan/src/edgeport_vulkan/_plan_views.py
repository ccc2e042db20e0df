"""Planning of the data-movement operators of a ``VkGraph`` (views, permute, select, expand, split, cat, slice,
pad) into aliases and copy dispatches; see :mod:`edgeport_vulkan._plan`. Every one moves float, int32 and bool
tensors alike (int32 / bool through the ``*_i32`` builds of the shaders); its output has its input's kind."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ._launch import contiguous_strides, pad6
from ._plan_context import (
    FLOAT,
    PlanContext,
    check_nargs,
    dispatch_groups,
)
from .schema import (
    ValueList,
)


# -- data movement ------------------------------------------------------------------------------------------------
def _shader(name: str, kind: int) -> str:
    return name if kind == FLOAT else name + "_i32"


def _view(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 2, 3)
    ctx.typed(args[0])
    ctx.alias(args[-1], args[0])


def _permute(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 3)
    x, kind = ctx.typed(args[0])
    perm = [ctx.dim(d, len(x)) for d in ctx.ints(args[1], "dims")]
    if sorted(perm) != list(range(len(x))):
        raise ctx.fail(f"{perm} is not a permutation of {len(x)} dims")
    shape = tuple(x[d] for d in perm)
    ctx.out_typed(args[-1], shape, kind)
    src = contiguous_strides(x)
    n = math.prod(x)
    if n == 0:
        return
    cshape, (sst, _) = ctx.coalesce(shape, [src[d] for d in perm], contiguous_strides(shape))
    ctx.dispatch(_shader("permute", kind), [args[0], args[-1]], "14i", [n, len(cshape), *pad6(cshape), *pad6(sst, 0)],
                 dispatch_groups(n, 256))


def _copy(ctx: PlanContext, src: int, dst: int, shape: Any, src_off: int, src_str: Any, dst_off: int, dst_str: Any) -> None:
    n = math.prod(shape)
    if n == 0:
        return
    cshape, (ss, ds) = ctx.coalesce(shape, src_str, dst_str)
    ctx.dispatch(_shader("copy", ctx.plan.kinds.get(src, FLOAT)), [src, dst], "22i", [n, len(cshape), src_off, dst_off, *pad6(cshape), *pad6(ss, 0),
                                             *pad6(ds, 0)], dispatch_groups(n, 256))


def _select(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 4)
    x, kind = ctx.typed(args[0])
    if not x:
        raise ctx.fail("select on a 0-dim tensor")
    d = ctx.dim(ctx.int_(args[1], "dim"), len(x))
    index = ctx.int_(args[2], "index")
    if not -x[d] <= index < x[d]:
        raise ctx.fail(f"index {index} is out of range for size {x[d]}")
    index %= x[d]
    shape = x[:d] + x[d + 1:]
    ctx.out_typed(args[-1], shape, kind)
    st = contiguous_strides(x)
    _copy(ctx, args[0], args[-1], shape or (1,), index * st[d], (st[:d] + st[d + 1:]) or [1], 0,
          contiguous_strides(shape) or [1])


def _expand(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 3, 4)
    x, kind = ctx.typed(args[0])
    size = ctx.ints(args[1], "size")
    if len(size) < len(x):
        raise ctx.fail(f"size {size} has fewer dims than the input {list(x)}")
    lead = len(size) - len(x)
    full = (1,) * lead + tuple(x)
    shape = tuple(f if s == -1 else s for s, f in zip(size, full))
    if any(s < 0 or (f != 1 and f != s) for s, f in zip(shape, full)):
        raise ctx.fail(f"cannot expand {list(x)} to {size}")
    ctx.out_typed(args[-1], shape, kind)
    st = [0] * lead + contiguous_strides(x)
    _copy(ctx, args[0], args[-1], shape, 0, [0 if f == 1 else s for f, s in zip(full, st)], 0,
          contiguous_strides(shape))


def _split(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 4)
    x, kind = ctx.typed(args[0])
    sizes = ctx.ints(args[1], "split_sizes")
    d = ctx.dim(ctx.int_(args[2], "dim"), len(x))
    outs = ctx.value(args[-1])
    if not x or not isinstance(outs, ValueList) or len(outs.items) != len(sizes):
        raise ctx.fail("outputs must be a ValueList with one tensor per split size")
    if any(s < 0 for s in sizes) or sum(sizes) != x[d]:
        raise ctx.fail(f"split sizes {sizes} do not add up to dim {d} of {list(x)}")
    st = contiguous_strides(x)
    offset = 0
    for vid, size in zip(outs.items, sizes, strict=True):
        shape = (*x[:d], size, *x[d + 1:])
        ctx.out_typed(vid, shape, kind)
        _copy(ctx, args[0], vid, shape, offset * st[d], st, 0, contiguous_strides(shape))
        offset += size


def _cat(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 3)
    lst = ctx.value(args[0])
    if not isinstance(lst, ValueList) or not lst.items:
        raise ctx.fail("tensors must be a non-empty ValueList")
    typed = [(vid, *ctx.typed(vid)) for vid in lst.items]
    kind = typed[0][2]
    if any(k != kind for _, _, k in typed):
        raise ctx.fail("inputs of different element kinds")
    xs = [(vid, s) for vid, s, _ in typed]
    # torch.cat skips 1-D empty tensors whatever the others' rank (a (0,) placeholder, e.g. an empty KV cache)
    kept = [(vid, s) for vid, s in xs if s != (0,)]
    xs = kept or xs[:1]
    rank = len(xs[0][1])
    d = ctx.dim(ctx.int_(args[1], "dim"), rank)
    for vid, s in xs:
        if len(s) != rank or s[:d] + s[d + 1:] != xs[0][1][:d] + xs[0][1][d + 1:]:
            raise ctx.fail(f"input {vid} shape {list(s)} does not match {list(xs[0][1])} outside dim {d}")
    shape = (*xs[0][1][:d], sum(s[d] for _, s in xs), *xs[0][1][d + 1:])
    ctx.out_typed(args[-1], shape, kind)
    ostr = contiguous_strides(shape)
    offset = 0
    for vid, s in xs:
        _copy(ctx, vid, args[-1], s, 0, contiguous_strides(s), offset * ostr[d], ostr)
        offset += s[d]


def _slice(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 6)
    x, kind = ctx.typed(args[0])
    d = ctx.dim(ctx.int_(args[1], "dim"), len(x))
    start = None if ctx.is_null(args[2]) else ctx.int_(args[2], "start")
    end = None if ctx.is_null(args[3]) else ctx.int_(args[3], "end")
    step = ctx.int_(args[4], "step")
    if step < 1:
        raise ctx.fail(f"step {step}")
    lo, hi, _ = slice(start, end, step).indices(x[d])
    length = max(0, -(-(hi - lo) // step))
    shape = (*x[:d], length, *x[d + 1:])
    ctx.out_typed(args[-1], shape, kind)
    st = contiguous_strides(x)
    _copy(ctx, args[0], args[-1], shape, lo * st[d], [s * step if i == d else s for i, s in enumerate(st)], 0,
          contiguous_strides(shape))


def _pad(ctx: PlanContext, args: list[int]) -> None:
    check_nargs(ctx, args, 4)
    x, kind = ctx.typed(args[0])
    pads = ctx.ints(args[1], "pad")
    value = ctx.num(args[2], "value")
    if len(pads) % 2 or len(pads) // 2 > len(x) or any(p < 0 for p in pads):
        raise ctx.fail(f"pad {pads}")
    before, after = [0] * len(x), [0] * len(x)
    for i in range(len(pads) // 2):
        before[len(x) - 1 - i], after[len(x) - 1 - i] = pads[2 * i], pads[2 * i + 1]
    shape = tuple(s + b + a for s, b, a in zip(x, before, after))
    ctx.out_typed(args[-1], shape, kind)
    total = math.prod(shape)
    ostr = contiguous_strides(shape)
    ctx.dispatch(_shader("fill", kind), [args[-1]], "if", [total, value], dispatch_groups(total, 256))
    _copy(ctx, args[0], args[-1], x, 0, contiguous_strides(x), sum(b * s for b, s in zip(before, ostr)), ostr)


VIEW_HANDLERS: dict[str, Callable[[PlanContext, list[int]], None]] = {
    "aten.view_copy.default": _view, "aten._unsafe_view.default": _view, "aten.squeeze_copy.dims": _view,
    "aten.squeeze_copy.dim": _view, "aten.unsqueeze_copy.default": _view, "aten.clone.default": _view,
    "aten.permute_copy.default": _permute, "aten.cat.default": _cat, "aten.slice_copy.Tensor": _slice,
    "aten.constant_pad_nd.default": _pad, "aten.select_copy.int": _select, "aten.expand_copy.default": _expand,
    "aten.split_with_sizes_copy.default": _split,
    "aten.alias_copy.default": _view,
    "et_vk.prepack.default": _view,  # ExecuTorch: a constant copied into its texture layout; here an alias
}
