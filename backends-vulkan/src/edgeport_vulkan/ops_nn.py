"""Convolution, pooling and data-movement ops (permute, cat, slice, pad) for :mod:`edgeport_vulkan.ops`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._launch import (
    Launch,
    check_array,
    check_dim,
    check_float,
    check_inputs,
    check_int,
    check_ints,
    check_numel,
    coalesce,
    contiguous_strides,
    pad6,
)

__all__ = ["NN_OPS", "cat", "conv2d", "pad", "permute", "slice_"]


def _batched4(x: Any, name: str) -> tuple[np.ndarray, bool]:
    """A (N, C, H, W) view of a 3-D or 4-D input, and whether it was unbatched."""
    x = check_array(x, f"{name} input", (3, 4))
    return (x.reshape(1, *x.shape), True) if x.ndim == 3 else (x, False)


def conv2d(inputs: list[Any], stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
           output_min: float = -math.inf, output_max: float = math.inf) -> np.ndarray:
    """torch.nn.functional.conv2d (NCHW, OIHW weight), with an optional fused clamp(output_min, output_max)."""
    x, w, bias = check_inputs(inputs, "conv2d", 2, 3)
    x, unbatched = _batched4(x, "conv2d")
    w = check_array(w, "conv2d weight", 4)
    n, c, h, wd = x.shape
    oc, cpg, kh, kw = w.shape
    g = check_int(groups, "conv2d groups", 1)
    sh, sw = check_ints(stride, 2, "conv2d stride", 1)
    ph, pw = check_ints(padding, 2, "conv2d padding", 0)
    dh, dw = check_ints(dilation, 2, "conv2d dilation", 1)
    lo = check_float(output_min, "conv2d output_min")
    hi = check_float(output_max, "conv2d output_max")
    if c % g or oc % g or cpg != c // g or c == 0 or oc == 0:
        raise ValueError(f"conv2d: input {x.shape}, weight {w.shape} and groups={g} are inconsistent")
    if kh == 0 or kw == 0 or lo > hi:
        raise ValueError(f"conv2d: empty kernel {w.shape} or output_min > output_max")
    if bias is not None and check_array(bias, "conv2d bias", 1).shape != (oc,):
        raise ValueError(f"conv2d: bias must have shape ({oc},), got {bias.shape}")
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise ValueError(f"conv2d: output would be empty ({oh}x{ow}) for input {x.shape} and weight {w.shape}")
    for v in (ph, pw, dh * kh, dw * kw, h + 2 * ph, wd + 2 * pw):
        check_int(v, "conv2d padded size", 0, 2**30)
    shape = (n, oc, oh, ow)
    total = check_numel(shape, "conv2d output")
    result_shape = shape[1:] if unbatched else shape
    if total == 0:
        return np.zeros(result_shape, np.float32)
    with Launch() as ln:
        out = ln.alloc(total)
        bb = ln.upload(bias) if bias is not None else ln.dummy()
        ocb = next(b for b in (8, 4, 2, 1) if (oc // g) % b == 0)  # output channels per invocation
        ln.add("conv2d", [ln.upload(x), ln.upload(w), bb, out], "17i2f",
               [n, c, h, wd, oc, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, g, int(bias is not None), lo, hi],
               ln.groups_1d(total // ocb, 64), spec=(ocb,))
        return ln.run(out, result_shape)


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    num = size + 2 * p - d * (k - 1) - 1
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool(op: int, name: str) -> Callable[..., np.ndarray]:
    def fn(inputs: list[Any], kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
           ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None
           ) -> np.ndarray:
        (x,) = check_inputs(inputs, name, 1)
        x, unbatched = _batched4(x, name)
        n, c, h, w = x.shape
        kh, kw = check_ints(kernel_size, 2, f"{name} kernel_size", 1)
        sh, sw = check_ints(kernel_size if stride is None or stride == [] else stride, 2, f"{name} stride", 1)
        ph, pw = check_ints(padding, 2, f"{name} padding", 0)
        dh, dw = check_ints(dilation, 2, f"{name} dilation", 1)
        if op == 1 and (dh, dw) != (1, 1):
            raise ValueError("avg_pool2d has no dilation")
        if 2 * ph > dh * (kh - 1) + 1 or 2 * pw > dw * (kw - 1) + 1:
            raise ValueError(f"{name}: padding {padding!r} must be at most half the (effective) kernel size")
        div = 0 if divisor_override is None else check_int(divisor_override, f"{name} divisor_override", 1)
        if h == 0 or w == 0:
            raise ValueError(f"{name}: empty spatial dims in {x.shape}")
        oh = _pool_out(h, kh, sh, ph, dh, bool(ceil_mode))
        ow = _pool_out(w, kw, sw, pw, dw, bool(ceil_mode))
        if oh <= 0 or ow <= 0:
            raise ValueError(f"{name}: output would be empty ({oh}x{ow}) for input {x.shape}")
        shape = (n, c, oh, ow)
        total = check_numel(shape, f"{name} output")
        result_shape = shape[1:] if unbatched else shape
        if total == 0:
            return np.zeros(result_shape, np.float32)
        with Launch() as ln:
            out = ln.alloc(total)
            ln.add("pool2d", [ln.upload(x), out], "15i",
                   [n * c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, int(bool(count_include_pad)), div],
                   ln.groups_1d(total, 64), spec=(op,))
            return ln.run(out, result_shape)
    return fn


def permute(inputs: list[Any], dims: Sequence[int]) -> np.ndarray:
    (x,) = check_inputs(inputs, "permute", 1)
    x = check_array(x, "permute input")
    if not isinstance(dims, Sequence) or len(dims) != x.ndim:
        raise ValueError(f"permute: dims must list all {x.ndim} dims, got {dims!r}")
    perm = [check_dim(d, x.ndim, "permute dim") for d in dims]
    if sorted(perm) != list(range(x.ndim)):
        raise ValueError(f"permute: {dims!r} is not a permutation of {x.ndim} dims")
    shape = tuple(x.shape[d] for d in perm)
    if x.size == 0:
        return np.zeros(shape, np.float32)
    src = contiguous_strides(x.shape)
    cshape, (sst, dst) = coalesce(shape, [src[d] for d in perm], contiguous_strides(shape))
    with Launch() as ln:
        out = ln.alloc(x.size)
        if dst != contiguous_strides(cshape):  # cannot happen for a contiguous output; kept as a guard
            raise ValueError("permute: internal stride error")
        ln.add("permute", [ln.upload(x), out], "14i", [x.size, len(cshape), *pad6(cshape), *pad6(sst, 0)],
               ln.groups_1d(x.size, 256))
        return ln.run(out, shape)


def _copy(ln: Launch, src: Any, dst: Any, shape: Sequence[int], src_off: int, src_str: Sequence[int],
          dst_off: int, dst_str: Sequence[int]) -> None:
    n = math.prod(shape)
    if n == 0:
        return
    cshape, (ss, ds) = coalesce(shape, src_str, dst_str)
    ln.add("copy", [src, dst], "22i", [n, len(cshape), src_off, dst_off, *pad6(cshape), *pad6(ss, 0), *pad6(ds, 0)],
           ln.groups_1d(n, 256))


def cat(inputs: list[Any], dim: int = 0) -> np.ndarray:
    if not 1 <= len(inputs) <= 255:
        raise ValueError(f"cat: 1..255 inputs, got {len(inputs)}")
    xs = [check_array(x, f"cat input {i}", (1, 6)) for i, x in enumerate(inputs)]
    d = check_dim(dim, xs[0].ndim, "cat dim")
    for i, x in enumerate(xs):
        if x.ndim != xs[0].ndim or x.shape[:d] + x.shape[d + 1:] != xs[0].shape[:d] + xs[0].shape[d + 1:]:
            raise ValueError(f"cat: input {i} shape {x.shape} does not match {xs[0].shape} outside dim {d}")
    shape = (*xs[0].shape[:d], sum(x.shape[d] for x in xs), *xs[0].shape[d + 1:])
    total = check_numel(shape, "cat output")
    if total == 0:
        return np.zeros(shape, np.float32)
    ostr = contiguous_strides(shape)
    with Launch() as ln:
        out = ln.alloc(total)
        offset = 0
        for x in xs:
            if x.size:
                _copy(ln, ln.upload(x), out, x.shape, 0, contiguous_strides(x.shape), offset * ostr[d], ostr)
            offset += x.shape[d]
        return ln.run(out, shape)


def slice_(inputs: list[Any], dim: int = 0, start: int | None = None, end: int | None = None,
           step: int = 1) -> np.ndarray:
    """x[..., start:end:step, ...] along ``dim`` (Python slice semantics, step > 0)."""
    (x,) = check_inputs(inputs, "slice", 1)
    x = check_array(x, "slice input", (1, 6))
    d = check_dim(dim, x.ndim, "slice dim")
    step = check_int(step, "slice step", 1)
    start = None if start is None else check_int(start, "slice start")
    end = None if end is None else check_int(end, "slice end")
    lo, hi, _ = slice(start, end, step).indices(x.shape[d])
    length = max(0, -(-(hi - lo) // step))
    shape = (*x.shape[:d], length, *x.shape[d + 1:])
    if math.prod(shape) == 0:
        return np.zeros(shape, np.float32)
    st = contiguous_strides(x.shape)
    src_str = [s * step if i == d else s for i, s in enumerate(st)]
    with Launch() as ln:
        out = ln.alloc(math.prod(shape))
        _copy(ln, ln.upload(x), out, shape, lo * st[d], src_str, 0, contiguous_strides(shape))
        return ln.run(out, shape)


def pad(inputs: list[Any], pad: Sequence[int], value: float = 0.0, mode: str = "constant") -> np.ndarray:
    """torch.nn.functional.pad, constant mode, non-negative pads (last dim first: (left, right, top, bottom...))."""
    (x,) = check_inputs(inputs, "pad", 1)
    x = check_array(x, "pad input")
    if mode != "constant":
        raise ValueError(f"pad: only mode='constant' is supported, got {mode!r}")
    if not isinstance(pad, Sequence) or len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise ValueError(f"pad: expected an even number (<= {2 * x.ndim}) of pads, got {pad!r}")
    pads = [check_int(p, "pad", 0, 2**30) for p in pad]
    value = check_float(value, "pad value")
    before, after = [0] * x.ndim, [0] * x.ndim
    for i in range(len(pads) // 2):
        before[x.ndim - 1 - i], after[x.ndim - 1 - i] = pads[2 * i], pads[2 * i + 1]
    shape = tuple(s + b + a for s, b, a in zip(x.shape, before, after))
    total = check_numel(shape, "pad output")
    if total == 0:
        return np.zeros(shape, np.float32)
    ostr = contiguous_strides(shape)
    with Launch() as ln:
        out = ln.alloc(total)
        ln.add("fill", [out], "if", [total, value], ln.groups_1d(total, 256))
        if x.size:
            _copy(ln, ln.upload(x), out, x.shape, 0, contiguous_strides(x.shape),
                  sum(b * s for b, s in zip(before, ostr)), ostr)
        return ln.run(out, shape)


NN_OPS: dict[str, Callable[..., np.ndarray]] = {
    "conv2d": conv2d, "max_pool2d": _pool(0, "max_pool2d"), "avg_pool2d": _pool(1, "avg_pool2d"),
    "permute": permute, "cat": cat, "slice": slice_, "pad": pad,
}
