"""Reductions: sum, mean, amax/amin, any/all, argmax/argmin, max/min over a dim, var, prod, cumsum, topk."""

from __future__ import annotations

import numpy as np

from edgeport.errors import RuntimeExecutionError
from edgeport.runtime.portable._common import dtype_arg, kernel, normalize_dim, normalize_dims, resize, store


def _axes(x, dim):
    if x.ndim == 0:
        return None
    return normalize_dims(dim, x.ndim)


@kernel("aten::sum.IntList_out")
def sum_out(self, dim, keepdim, dtype, out):
    dt = dtype_arg(dtype) or (out.dtype if out.dtype != np.bool_ else None)
    return store(out, np.sum(self, axis=_axes(self, dim), keepdims=keepdim, dtype=dt))


@kernel("aten::sum.out")
def sum_all_out(self, dtype, out):
    return store(out, np.sum(self, dtype=dtype_arg(dtype) or out.dtype))


@kernel("aten::mean.out")
def mean_out(self, dim, keepdim, dtype, out):
    dt = dtype_arg(dtype) or out.dtype
    if dt.kind not in "fc":
        raise RuntimeExecutionError(f"mean: needs a floating point dtype, got {dt}")
    return store(out, np.mean(self, axis=_axes(self, dim), keepdims=keepdim, dtype=dt))


@kernel("aten::mean.dtype_out")
def mean_all_out(self, dtype, out):
    return store(out, np.mean(self, dtype=dtype_arg(dtype) or out.dtype))


def _reduce_nonempty(fn, name):
    def k(self, dim, keepdim, out):
        axes = _axes(self, dim)
        if self.size == 0:
            raise RuntimeExecutionError(f"{name}: cannot reduce an empty tensor")
        return store(out, fn(self, axis=axes, keepdims=keepdim))

    k.__name__ = f"{name}_out"
    return k


kernel("aten::amax.out")(_reduce_nonempty(np.max, "amax"))
kernel("aten::amin.out")(_reduce_nonempty(np.min, "amin"))


def _no_dims(dim) -> bool:
    """``any.dims``/``all.dims`` with an empty dim list reduce nothing (torch: elementwise ``bool``)."""
    return dim is not None and not isinstance(dim, int) and len(dim) == 0


@kernel("aten::any.out", "aten::any.dims_out")
def any_out(self, dim, keepdim, out):
    if type(dim) is int and self.dtype == np.bool_ and out.dtype == np.bool_ and 0 < self.size <= 4096:
        d = normalize_dim(dim, self.ndim)
        if self.ndim and out.shape == self.shape[:d] + ((1,) if keepdim else ()) + self.shape[d + 1:]:
            np.any(self, axis=d, keepdims=bool(keepdim), out=out)
            return out
    if _no_dims(dim):
        return store(out, self.astype(bool))
    axes = None if dim is None else (_axes(self, [dim]) if isinstance(dim, int) else _axes(self, dim))
    fast = _any_trailing(self, axes, keepdim, out)
    if fast is not None:
        return fast
    return store(out, np.any(self, axis=axes, keepdims=keepdim))


_WIDE = ((8, np.uint64), (4, np.uint32), (2, np.uint16))


def _any_trailing(self, axes, keepdim, out):
    """``any`` over trailing dims of a C-contiguous bool or integer tensor, a row of bytes at a time seen as
    wider integers (an element is nonzero iff one of its bytes is). ``None`` when that does not apply (floats:
    ``-0.0`` is false with a nonzero byte)."""
    nd = self.ndim
    if axes is None or self.dtype.kind not in "biu" or not self.flags.c_contiguous or self.size == 0:
        return None
    k = len(axes)
    if k == 0 or axes != tuple(range(nd - k, nd)):
        return None
    row = self.itemsize
    for d in self.shape[nd - k:]:
        row *= d
    width = next((w for w, _ in _WIDE if row % w == 0 and row > w), None)
    if width is None:
        return None
    wide = dict(_WIDE)[width]
    rows = self.reshape(-1).view(np.uint8).reshape(-1, row).view(wide)
    shape = self.shape[:nd - k] + ((1,) * k if keepdim else ())
    if out.shape != shape:
        out = resize(out, shape)
    acc = np.bitwise_or.reduce(rows, axis=1)
    if out.flags.c_contiguous:
        np.not_equal(acc, 0, out=out.reshape(-1), casting="unsafe")
    else:
        out[...] = (acc != 0).reshape(shape)
    return out


@kernel("aten::any.all_out")
def any_all_out(self, out):
    return store(out, np.any(self))


@kernel("aten::all.out", "aten::all.dims_out")
def all_out(self, dim, keepdim, out):
    if _no_dims(dim):
        return store(out, self.astype(bool))
    axes = None if dim is None else (_axes(self, [dim]) if isinstance(dim, int) else _axes(self, dim))
    return store(out, np.all(self, axis=axes, keepdims=keepdim))


@kernel("aten::all.all_out")
def all_all_out(self, out):
    return store(out, np.all(self))


def _arg(fn, name):
    def k(self, dim, keepdim, out):
        if self.size == 0:
            raise RuntimeExecutionError(f"{name}: cannot reduce an empty tensor")
        if dim is None:
            res = fn(self.reshape(-1))
            if keepdim:
                res = np.reshape(res, (1,) * self.ndim)
        else:
            res = fn(self, axis=normalize_dim(dim, self.ndim), keepdims=keepdim) if self.ndim else fn(self)
        return store(out, np.asarray(res, dtype=np.int64))

    k.__name__ = f"{name}_out"
    return k


kernel("aten::argmax.out")(_arg(np.argmax, "argmax"))
kernel("aten::argmin.out")(_arg(np.argmin, "argmin"))


def _minmax_dim(values_fn, arg_fn, name):
    def k(self, dim, keepdim, values, indices):
        if self.ndim == 0:
            return store(values, self), store(indices, np.zeros((), np.int64))
        d = normalize_dim(dim, self.ndim)
        idx = arg_fn(self, axis=d, keepdims=True)
        vals = np.take_along_axis(self, idx, axis=d)
        if not keepdim:
            idx = np.squeeze(idx, axis=d)
            vals = np.squeeze(vals, axis=d)
        return store(values, vals), store(indices, idx)

    k.__name__ = f"{name}_dim_out"
    return k


kernel("aten::max.dim_max")(_minmax_dim(np.max, np.argmax, "max"))
kernel("aten::min.dim_min")(_minmax_dim(np.min, np.argmin, "min"))


@kernel("aten::max.unary_out")
def max_unary_out(self, out):
    return store(out, np.max(self))


@kernel("aten::min.unary_out")
def min_unary_out(self, out):
    return store(out, np.min(self))


@kernel("aten::var.correction_out")
def var_correction_out(self, dim, correction, keepdim, out):
    ddof = 1 if correction is None else correction
    return store(out, np.var(self, axis=_axes(self, dim), ddof=ddof, keepdims=keepdim,
                             dtype=np.float64).astype(out.dtype))


@kernel("aten::prod.int_out")
def prod_int_out(self, dim, keepdim, dtype, out):
    return store(out, np.prod(self, axis=normalize_dim(dim, self.ndim) if self.ndim else None, keepdims=keepdim,
                              dtype=dtype_arg(dtype) or out.dtype))


@kernel("aten::prod.out")
def prod_out(self, dtype, out):
    return store(out, np.prod(self, dtype=dtype_arg(dtype) or out.dtype))


@kernel("aten::cumsum.out")
def cumsum_out(self, dim, dtype, out):
    if self.ndim == 0:
        return store(out, self)
    return store(out, np.cumsum(self, axis=normalize_dim(dim, self.ndim), dtype=dtype_arg(dtype) or out.dtype))


@kernel("aten::topk.values")
def topk_values(self, k, dim, largest, sorted, values, indices):  # noqa: A002
    d = normalize_dim(dim, self.ndim)
    n = self.shape[d] if self.ndim else 1
    if k > n:
        raise RuntimeExecutionError(f"topk: k={k} is larger than dimension size {n}")
    key = -self if largest else self
    idx = np.argsort(key, axis=d, kind="stable")
    idx = np.take(idx, np.arange(k), axis=d)
    vals = np.take_along_axis(self, idx, axis=d)
    return store(values, vals), store(indices, idx.astype(np.int64))
