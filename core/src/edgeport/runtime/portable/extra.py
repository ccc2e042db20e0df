"""More core-ATen kernels: scatter/gather family, padding modes, sorting, sampling, 3-d pooling, misc."""

from __future__ import annotations

import itertools
from math import prod

import numpy as np

from edgeport.errors import RuntimeExecutionError
from edgeport.runtime.kernel_utils import check_fits
from edgeport.runtime.portable._common import kernel, normalize_dim, normalize_dims, resize, store
from edgeport.runtime.portable.nn import _pool_out_size, _tuple
from edgeport.runtime.portable.shape import _copy_into


# ------------------------------------------------------------------------------------------- fills and views
@kernel("aten::fill.Scalar_out")
def fill_scalar_out(self, value, out):
    out = resize(out, self.shape) if out.shape != self.shape else out
    out.fill(value)
    return out


@kernel("aten::fill.Tensor_out")
def fill_tensor_out(self, value, out):
    if value.ndim != 0:
        raise RuntimeExecutionError(f"fill: value must be a 0-dim tensor, got shape {list(value.shape)}")
    return fill_scalar_out(self, value.item(), out)


@kernel("aten::empty_strided.out")
def empty_strided_out(size, stride, out):
    size = tuple(int(s) for s in size)
    return out if out.shape == size else resize(out, size)


@kernel("aten::as_strided_copy.out")
def as_strided_copy_out(self, size, stride, storage_offset, out):
    flat = np.ascontiguousarray(self).reshape(-1)
    off = int(storage_offset or 0)
    size = [int(s) for s in size]
    stride = [int(s) for s in stride]
    if len(size) != len(stride) or any(s < 0 for s in size) or any(s < 0 for s in stride):
        raise RuntimeExecutionError(f"as_strided: bad size {size} / stride {stride}")
    last = off + sum((n - 1) * st for n, st in zip(size, stride)) if all(size) else off
    if off < 0 or (prod(size) and last >= flat.size):
        raise RuntimeExecutionError(f"as_strided: size {size}, stride {stride}, offset {off} exceed the storage "
                                    f"of {flat.size} elements")
    view = np.lib.stride_tricks.as_strided(flat[off:], size, [s * flat.itemsize for s in stride], writeable=False)
    return _copy_into(out, view)


@kernel("aten::diagonal_copy.out")
def diagonal_copy_out(self, offset, dim1, dim2, out):
    d1, d2 = normalize_dim(dim1, self.ndim), normalize_dim(dim2, self.ndim)
    return _copy_into(out, np.diagonal(self, offset, d1, d2))


@kernel("aten::unfold_copy.out")
def unfold_copy_out(self, dimension, size, step, out):
    d = normalize_dim(dimension, max(self.ndim, 1))
    x = self.reshape(1) if self.ndim == 0 else self
    n = (x.shape[d] - size) // step + 1
    if size > x.shape[d] or step <= 0:
        raise RuntimeExecutionError(f"unfold: size {size} / step {step} do not fit dimension size {x.shape[d]}")
    win = np.lib.stride_tricks.sliding_window_view(x, size, axis=d)
    win = np.take(win, np.arange(0, n * step, step), axis=d)
    return _copy_into(out, win)


# ------------------------------------------------------------------------------------------- padding modes
def _pad_mode(self, padding, nd, mode, out):
    pads = [int(p) for p in padding]
    if len(pads) != 2 * nd:
        raise RuntimeExecutionError(f"{mode} pad: {len(pads)} padding values for {nd} dims")
    width = [(0, 0)] * (self.ndim - nd) + [(pads[2 * i], pads[2 * i + 1]) for i in reversed(range(nd))]
    if mode == "reflect":
        for (lo, hi), n in zip(width[self.ndim - nd:], self.shape[self.ndim - nd:]):
            if lo >= n or hi >= n:
                raise RuntimeExecutionError(f"reflection pad: padding ({lo}, {hi}) must be smaller than the size {n}")
    check_fits(out, [n + lo + hi for n, (lo, hi) in zip(self.shape, width)], f"{mode} pad")
    return store(out, np.pad(self, width, mode=mode))


for _nd in (1, 2, 3):
    def _mk(nd, mode):
        def fn(self, padding, out):
            return _pad_mode(self, padding, nd, mode, out)

        fn.__name__ = f"{mode}_pad{nd}d_out"
        return fn

    kernel(f"aten::reflection_pad{_nd}d.out")(_mk(_nd, "reflect"))
    kernel(f"aten::replication_pad{_nd}d.out")(_mk(_nd, "edge"))


# ------------------------------------------------------------------------------------------- scatter family
def _check_index(index, size, what):
    if index.size and (index.min() < -size or index.max() >= size):
        raise RuntimeExecutionError(f"{what}: an index is out of range for a dimension of size {size}")


def _scatter_positions(self, dim, index):
    d = normalize_dim(dim, self.ndim)
    _check_index(index, self.shape[d], "scatter")
    grids = list(np.meshgrid(*[np.arange(n) for n in index.shape], indexing="ij"))
    grids[d] = index
    return d, tuple(grids)


@kernel("aten::scatter.value_out")
def scatter_value_out(self, dim, index, value, out):
    res = self.copy()
    if index.size:
        _, pos = _scatter_positions(self, dim, index)
        res[pos] = value
    return store(out, res)


@kernel("aten::scatter.src_out")
def scatter_src_out(self, dim, index, src, out):
    res = self.copy()
    if index.size:
        _, pos = _scatter_positions(self, dim, index)
        res[pos] = src[tuple(slice(0, n) for n in index.shape)]
    return store(out, res)


@kernel("aten::scatter_add.out")
def scatter_add_out(self, dim, index, src, out):
    res = self.copy()
    if index.size:
        _, pos = _scatter_positions(self, dim, index)
        np.add.at(res, pos, src[tuple(slice(0, n) for n in index.shape)])
    return store(out, res)


@kernel("aten::scatter_reduce.two_out")
def scatter_reduce_out(self, dim, index, src, reduce, include_self, out):
    res = self.astype(np.float64 if self.dtype.kind == "f" else self.dtype, copy=True)
    if index.size:
        _, pos = _scatter_positions(self, dim, index)
        vals = src[tuple(slice(0, n) for n in index.shape)]
        touched = np.zeros(self.shape, bool)
        touched[pos] = True
        if reduce in ("sum", "mean"):
            if not include_self:
                res[touched] = 0
            np.add.at(res, pos, vals)
            if reduce == "mean":
                count = np.zeros(self.shape, np.int64)
                np.add.at(count, pos, 1)
                count += 1 if include_self else 0
                res = np.where(touched, res / np.maximum(count, 1), res)
                if self.dtype.kind in "iu":
                    res = np.floor(res)
        elif reduce == "prod":
            if not include_self:
                res[touched] = 1
            np.multiply.at(res, pos, vals)
        elif reduce in ("amax", "amin"):
            uf = np.maximum if reduce == "amax" else np.minimum
            if not include_self:
                res[touched] = -np.inf if reduce == "amax" else np.inf
            uf.at(res, pos, vals)
        else:
            raise RuntimeExecutionError(f"scatter_reduce: unknown reduce {reduce!r}")
    return store(out, res)


def _index_key(self, indices, what):
    key = []
    for d, ix in enumerate(indices):
        if ix is None:
            key.append(slice(None))
        elif ix.dtype == np.bool_:
            key.append(ix)
        else:
            _check_index(ix, self.shape[d], what)
            key.append(ix)
    return tuple(key)


@kernel("aten::index_put.out")
def index_put_out(self, indices, values, accumulate, out):
    res = self.copy()
    key = _index_key(self, indices, "index_put")
    if accumulate:
        np.add.at(res, key, values)
    else:
        res[key] = values
    return store(out, res)


@kernel("aten::select_scatter.out")
def select_scatter_out(self, src, dim, index, out):
    d = normalize_dim(dim, self.ndim)
    n = self.shape[d]
    if not -n <= index < n:
        raise RuntimeExecutionError(f"select_scatter: index {index} out of range for size {n}")
    res = self.copy()
    res[(slice(None),) * d + (index,)] = src
    return store(out, res)


@kernel("aten::slice_scatter.out")
def slice_scatter_out(self, src, dim, start, end, step, out):
    d = normalize_dim(dim, self.ndim)
    res = self.copy()
    res[(slice(None),) * d + (slice(start, end, step),)] = src
    return store(out, res)


@kernel("aten::masked_scatter.out")
def masked_scatter_out(self, mask, source, out):
    shape = np.broadcast_shapes(self.shape, mask.shape)
    res = np.array(np.broadcast_to(self, shape))
    m = np.broadcast_to(mask, shape)
    n = int(m.sum())
    if n > source.size:
        raise RuntimeExecutionError(f"masked_scatter: mask selects {n} elements, source has {source.size}")
    res[m] = source.reshape(-1)[:n]
    return store(out, res)


# ------------------------------------------------------------------------------------------- sorting & co.
def _sort(self, dim, descending, values, indices):
    if self.ndim == 0:
        return store(values, self), store(indices, np.zeros((), np.int64))
    d = normalize_dim(dim, self.ndim)
    key = self
    if descending:
        # stable descending: sort the reversed array ascending on negated keys keeps ties in order
        key = -self.astype(np.float64) if self.dtype.kind in "fiu" else ~self
    idx = np.argsort(key, axis=d, kind="stable")
    return store(values, np.take_along_axis(self, idx, axis=d)), store(indices, idx.astype(np.int64))


@kernel("aten::sort.values")
def sort_values(self, dim, descending, values, indices):
    return _sort(self, dim, descending, values, indices)


@kernel("aten::sort.values_stable")
def sort_values_stable(self, stable, dim, descending, values, indices):
    return _sort(self, dim, descending, values, indices)


@kernel("aten::nonzero.out")
def nonzero_out(self, out):
    return store(out, np.argwhere(self).astype(np.int64))


@kernel("aten::native_dropout.out")
def native_dropout_out(input, p, train, out0, out1):  # noqa: A002
    if train and p > 0:
        keep = np.random.default_rng().random(input.shape) >= p
        scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
        return store(out0, input * keep * scale), store(out1, keep)
    return store(out0, input), store(out1, np.ones(input.shape, bool))


@kernel("aten::var.out")
def var_out(self, dim, unbiased, keepdim, out):
    axes = None if self.ndim == 0 else normalize_dims(dim, self.ndim)
    return store(out, np.var(self, axis=axes, ddof=1 if unbiased else 0, keepdims=keepdim, dtype=np.float64))


@kernel("aten::var_mean.correction_out")
def var_mean_out(self, dim, correction, keepdim, out0, out1):
    axes = None if self.ndim == 0 else normalize_dims(dim, self.ndim)
    ddof = 1 if correction is None else correction
    return (store(out0, np.var(self, axis=axes, ddof=ddof, keepdims=keepdim, dtype=np.float64)),
            store(out1, np.mean(self, axis=axes, keepdims=keepdim, dtype=np.float64)))


@kernel("aten::_cdist_forward.out")
def cdist_forward_out(x1, x2, p, compute_mode, out):
    diff = np.abs(x1[..., :, None, :].astype(np.float64) - x2[..., None, :, :])
    if p == 0:
        res = (diff != 0).sum(-1)
    elif np.isinf(p):
        res = diff.max(-1)
    else:
        res = (diff ** p).sum(-1) ** (1.0 / p)
    return store(out, res)


@kernel("aten::_pdist_forward.out")
def pdist_forward_out(self, p, out):
    n = self.shape[0]
    i, j = np.triu_indices(n, 1)
    diff = np.abs(self[i].astype(np.float64) - self[j])
    if p == 0:
        res = (diff != 0).sum(-1)
    elif np.isinf(p):
        res = diff.max(-1) if diff.size else np.zeros(len(i))
    else:
        res = (diff ** p).sum(-1) ** (1.0 / p)
    return store(out, res)


@kernel("aten::rand.out")
def rand_out(size, out):
    out = resize(out, size)
    out[...] = np.random.default_rng().random(out.shape)
    return out


@kernel("aten::randn.out")
def randn_out(size, out):
    out = resize(out, size)
    out[...] = np.random.default_rng().standard_normal(out.shape)
    return out


@kernel("aten::randperm.out")
def randperm_out(n, out):
    out = resize(out, (n,))
    out[...] = np.random.default_rng().permutation(n)
    return out


for _fn in (rand_out, randn_out, randperm_out, native_dropout_out):
    _fn.pure = False  # never constant-folded at load


@kernel("aten::_local_scalar_dense", "aten::_local_scalar_dense.default")
def local_scalar_dense(self):
    if self.size != 1:
        raise RuntimeExecutionError(f"_local_scalar_dense: tensor has {self.size} elements, expected 1")
    return self.reshape(-1)[0].item()


@kernel("aten::sym_storage_offset", "aten::sym_storage_offset.default")
def sym_storage_offset(self):
    return 0


# ------------------------------------------------------------------------------------------- sampling
@kernel("aten::upsample_bilinear2d.vec_out")
def upsample_bilinear2d_vec_out(input, output_size, align_corners, scale_factors, out):  # noqa: A002
    H, W = input.shape[-2:]
    if output_size is not None:
        Ho, Wo = (int(s) for s in output_size)
        sh = sw = None
    else:
        sh, sw = scale_factors
        Ho, Wo = int(H * sh), int(W * sw)

    def coords(n_in, n_out, scale):
        if align_corners:
            if n_out == 1:
                return np.zeros(1)
            return np.arange(n_out) * ((n_in - 1) / (n_out - 1))
        ratio = (1.0 / scale) if scale else n_in / n_out
        return np.maximum((np.arange(n_out) + 0.5) * ratio - 0.5, 0)

    check_fits(out, input.shape[:-2] + (Ho, Wo), "upsample_bilinear2d")
    ys, xs = coords(H, Ho, sh), coords(W, Wo, sw)
    y0 = np.minimum(np.floor(ys).astype(np.int64), H - 1)
    x0 = np.minimum(np.floor(xs).astype(np.int64), W - 1)
    y1, x1 = np.minimum(y0 + 1, H - 1), np.minimum(x0 + 1, W - 1)
    wy, wx = (ys - y0)[:, None], (xs - x0)[None, :]
    x = input.astype(np.float64)
    top = x[..., y0[:, None], x0[None, :]] * (1 - wx) + x[..., y0[:, None], x1[None, :]] * wx
    bot = x[..., y1[:, None], x0[None, :]] * (1 - wx) + x[..., y1[:, None], x1[None, :]] * wx
    return store(out, top * (1 - wy) + bot * wy)


@kernel("aten::grid_sampler_2d.out")
def grid_sampler_2d_out(input, grid, interpolation_mode, padding_mode, align_corners, out):  # noqa: A002
    """Bilinear (mode 0) or nearest (mode 1) sampling with zeros (0) or border (1) padding."""
    if interpolation_mode not in (0, 1) or padding_mode not in (0, 1):
        raise RuntimeExecutionError(f"grid_sampler_2d: mode {interpolation_mode}/padding {padding_mode} unsupported")
    N, C, H, W = input.shape
    gx, gy = grid[..., 0].astype(np.float64), grid[..., 1].astype(np.float64)

    def unnorm(g, n):
        return ((g + 1) / 2) * (n - 1) if align_corners else ((g + 1) * n - 1) / 2

    ix, iy = unnorm(gx, W), unnorm(gy, H)
    if padding_mode == 1:
        ix, iy = np.clip(ix, 0, W - 1), np.clip(iy, 0, H - 1)
    x = input.astype(np.float64)
    n_idx = np.arange(N)[:, None, None]

    def sample(yy, xx):
        valid = (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
        yc, xc = np.clip(yy, 0, H - 1), np.clip(xx, 0, W - 1)
        v = x[n_idx, :, yc, xc]  # (N, Ho, Wo, C)
        return v * valid[..., None]

    if interpolation_mode == 1:
        res = sample(np.rint(iy).astype(np.int64), np.rint(ix).astype(np.int64))
    else:
        x0, y0 = np.floor(ix).astype(np.int64), np.floor(iy).astype(np.int64)
        wx, wy = (ix - x0)[..., None], (iy - y0)[..., None]
        res = (sample(y0, x0) * (1 - wx) * (1 - wy) + sample(y0, x0 + 1) * wx * (1 - wy)
               + sample(y0 + 1, x0) * (1 - wx) * wy + sample(y0 + 1, x0 + 1) * wx * wy)
    return store(out, res.transpose(0, 3, 1, 2))


# ------------------------------------------------------------------------------------------- 3-d pooling
def _pool3d_geometry(x, kernel_size, stride, padding, dilation, ceil_mode):
    k = _tuple(kernel_size, 3, "kernel_size")
    s = _tuple(stride, 3, "stride") if len(stride) else k
    p = _tuple(padding, 3, "padding")
    d = _tuple(dilation, 3, "dilation")
    osz = tuple(_pool_out_size(x.shape[-3 + i], k[i], s[i], p[i], d[i], ceil_mode) for i in range(3))
    if min(osz) <= 0:
        raise RuntimeExecutionError(f"pool3d: output size {osz} is not positive")
    return k, s, p, d, osz


def _windows3d(xp, k, s, d, osz):
    for t in itertools.product(*(range(kk) for kk in k)):
        yield t, xp[(Ellipsis,) + tuple(slice(t[i] * d[i], t[i] * d[i] + s[i] * (osz[i] - 1) + 1, s[i])
                                        for i in range(3))]


@kernel("aten::max_pool3d_with_indices.out")
def max_pool3d_with_indices_out(self, kernel_size, stride, padding, dilation, ceil_mode, out, indices):
    k, s, p, d, osz = _pool3d_geometry(self, kernel_size, stride, padding, dilation, ceil_mode)
    D, H, W = self.shape[-3:]
    hi = [max(0, (osz[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1 - (self.shape[-3 + i] + p[i])) for i in range(3)]
    lowest = -np.inf if self.dtype.kind == "f" else np.iinfo(self.dtype).min
    width = [(0, 0)] * (self.ndim - 3) + [(p[i], hi[i]) for i in range(3)]
    xp = np.pad(self, width, constant_values=lowest)
    best, arg = None, None
    offs = []
    for n, (t, v) in enumerate(_windows3d(xp, k, s, d, osz)):
        offs.append(tuple(t[i] * d[i] for i in range(3)))
        if best is None:
            best, arg = v.copy(), np.zeros(v.shape, np.int32)
            continue
        m = (v > best) | np.isnan(v)
        np.copyto(best, v, where=m)
        arg[m] = n
    off = np.array(offs, dtype=np.int64)
    base = [np.arange(osz[i], dtype=np.int64) * s[i] - p[i] for i in range(3)]
    z = base[0][:, None, None] + off[arg, 0]
    y = base[1][None, :, None] + off[arg, 1]
    x = base[2][None, None, :] + off[arg, 2]
    return store(out, best), store(indices, (z * H + y) * W + x)


@kernel("aten::avg_pool3d.out")
def avg_pool3d_out(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, out):
    k, s, p, d, osz = _pool3d_geometry(self, kernel_size, stride, padding, (1,), ceil_mode)
    sizes = self.shape[-3:]
    hi = [max(0, (osz[i] - 1) * s[i] + k[i] - (sizes[i] + p[i])) for i in range(3)]
    width = [(0, 0)] * (self.ndim - 3) + [(p[i], hi[i]) for i in range(3)]
    xp = np.pad(self.astype(np.float64), width)
    acc = None
    for _, v in _windows3d(xp, k, s, (1, 1, 1), osz):
        acc = v.copy() if acc is None else acc + v
    if divisor_override:
        return store(out, acc / divisor_override)
    div = np.ones(osz)
    for i in range(3):
        start = np.arange(osz[i]) * s[i] - p[i]
        end = np.minimum(start + k[i], sizes[i] + p[i])
        n = (end - start) if count_include_pad else (np.minimum(end, sizes[i]) - np.maximum(start, 0))
        div = div * n.reshape([-1 if j == i else 1 for j in range(3)])
    return store(out, acc / div)


@kernel("aten::_adaptive_avg_pool3d.out")
def adaptive_avg_pool3d_out(self, output_size, out):
    osz = _tuple(output_size, 3, "output_size")
    check_fits(out, self.shape[:-3] + osz, "adaptive_avg_pool3d")
    sizes = self.shape[-3:]
    res = np.empty(self.shape[:-3] + osz, dtype=np.float64)
    bounds = [[((o * n) // m, -((-(o + 1) * n) // m)) for o in range(m)] for n, m in zip(sizes, osz)]
    for idx in itertools.product(*(range(m) for m in osz)):
        sl = tuple(slice(*bounds[i][idx[i]]) for i in range(3))
        res[(Ellipsis,) + idx] = self[(Ellipsis,) + sl].mean(axis=(-3, -2, -1))
    return store(out, res)
