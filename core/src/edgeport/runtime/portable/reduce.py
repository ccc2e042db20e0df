"""Reductions: sum, mean, amax/amin, any/all, argmax/argmin, max/min over a dim, var, prod, cumsum, topk."""

from __future__ import annotations

import numpy as np

from edgeport.errors import RuntimeExecutionError
from edgeport.runtime.portable._common import dtype_arg, kernel, normalize_dim, normalize_dims, store


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


@kernel("aten::any.out", "aten::any.dims_out")
def any_out(self, dim, keepdim, out):
    axes = None if dim is None else (_axes(self, [dim]) if isinstance(dim, int) else _axes(self, dim))
    return store(out, np.any(self, axis=axes, keepdims=keepdim))


@kernel("aten::any.all_out")
def any_all_out(self, out):
    return store(out, np.any(self))


@kernel("aten::all.out", "aten::all.dims_out")
def all_out(self, dim, keepdim, out):
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
