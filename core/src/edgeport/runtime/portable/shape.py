"""Data-movement kernels: views, permutes, concatenation, splitting, slicing, padding, indexing, copies."""

from __future__ import annotations

from functools import lru_cache
from math import prod

import numpy as np

from edgeport.errors import RuntimeExecutionError
from edgeport.runtime.kernel_utils import check_fits
from edgeport.runtime.portable._common import kernel, normalize_dim, resize, store


def _copy_into(out, value):
    """``store`` with a fast path for the static case."""
    if value.shape == out.shape:
        np.copyto(out, value, casting="unsafe")
        return out
    return store(out, value)


def infer_size(size, numel):
    size = [int(s) for s in size]
    neg = [i for i, s in enumerate(size) if s == -1]
    if len(neg) > 1:
        raise RuntimeExecutionError(f"view: only one dimension can be -1, got {size}")
    if neg:
        rest = prod(s for s in size if s != -1)
        if rest == 0 or numel % rest:
            raise RuntimeExecutionError(f"view: shape {size} is invalid for a tensor of {numel} elements")
        size[neg[0]] = numel // rest
    if prod(size) != numel:
        raise RuntimeExecutionError(f"view: shape {size} is invalid for a tensor of {numel} elements")
    return tuple(size)


@kernel("aten::view_copy.out", "aten::_unsafe_view.out", "aten::reshape.out")
def view_copy_out(self, size, out):
    return _copy_into(out, self.reshape(infer_size(size, self.size)))


@kernel("aten::alias_copy.out", "aten::lift_fresh_copy.out", "aten::detach_copy.out")
def alias_copy_out(self, out):
    return _copy_into(out, self)


@kernel("aten::clone.out")
def clone_out(self, memory_format, out):
    return _copy_into(out, self)


@kernel("aten::_to_copy.out")
def to_copy_out(self, non_blocking, memory_format, out):
    return _copy_into(out, self)


@kernel("dim_order_ops::_to_dim_order_copy.out", "dim_order_ops::_clone_dim_order.out")
def to_dim_order_copy_out(self, non_blocking, dim_order, out):
    # ``out`` already carries the requested dim order in its strides
    return _copy_into(out, self)


@kernel("aten::copy.out")
def copy_out(self, src, non_blocking, out):
    same = type(src) is np.ndarray and src.shape == self.shape
    return _copy_into(out, src if same else np.broadcast_to(src, self.shape))


copy_out.shape_only = (0,)  # only ``self``'s shape matters (common calls at load, ``runtime._cse``)


@kernel("aten::copy_", "aten::copy_.default")
def copy_inplace(self, src, non_blocking):
    """In-place ``self.copy_(src)`` (ExecuTorch emits it to write mutated buffers back)."""
    same = type(src) is np.ndarray and src.shape == self.shape
    np.copyto(self, src if same else np.broadcast_to(src, self.shape), casting="unsafe")
    return self


@kernel("aten::index_put_", "aten::index_put_.default")
def index_put_inplace(self, indices, values, accumulate):
    at = None if accumulate else _one_position(self, indices)
    if at is not None:  # a KV-cache write at one position or a run of them: a basic slice, same region
        self[at] = values
        return self
    from edgeport.runtime.portable.extra import _index_key  # (extra imports this module)

    key = _index_key(self, indices, "index_put_")
    if accumulate:
        np.add.at(self, key, values)
    else:
        self[key] = values
    return self


def _one_position(self, indices):
    """For indices that are all ``None`` but one 1-D integer tensor at dim ``d`` holding one in-range position,
    or consecutive ascending in-range positions from 0 or more (a prefill's cache positions), the basic-slicing
    key of the region fancy indexing would address; else ``None``."""
    key = []
    found = False
    for d, ix in enumerate(indices):
        if ix is None:
            key.append(slice(None))
            continue
        if found or type(ix) is not np.ndarray or ix.ndim != 1 or not ix.size or ix.dtype.kind not in "iu" \
                or d >= self.ndim:
            return None
        i, n, m = int(ix[0]), self.shape[d], ix.size
        if m == 1:
            if not -n <= i < n:
                return None  # the general path raises its error
            i %= n
        elif not (0 <= i and i + m <= n and int(ix[-1]) == i + m - 1
                  and np.arange(i, i + m, dtype=ix.dtype).tobytes() == ix.tobytes()):  # i, i + 1, ... exactly
            return None
        key.append(slice(i, i + m))
        found = True
    return tuple(key) if found else None


@kernel("aten::permute_copy.out")
def permute_copy_out(self, dims, out):
    return _copy_into(out, np.transpose(self, [normalize_dim(d, self.ndim) for d in dims]) if self.ndim else self)


@kernel("aten::transpose_copy.int_out")
def transpose_copy_out(self, dim0, dim1, out):
    if self.ndim == 0:
        return _copy_into(out, self)
    return _copy_into(out, np.swapaxes(self, normalize_dim(dim0, self.ndim), normalize_dim(dim1, self.ndim)))


@kernel("aten::t_copy.out")
def t_copy_out(self, out):
    return _copy_into(out, self.T)


@lru_cache(maxsize=1024)
def _expanded_shape(size: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ``expand(size)`` gives a tensor of ``shape``: -1 keeps the tensor's size (cached: a program's
    shapes repeat every run)."""
    lead = len(size) - len(shape)
    if lead < 0:
        raise RuntimeExecutionError(f"expand: size {list(size)} has fewer dims than the tensor ({len(shape)})")
    if -1 in size[:lead]:
        raise RuntimeExecutionError(f"expand: size {list(size)} gives -1 for a new leading dimension")
    return size[:lead] + tuple(int(d if s == -1 else s) for s, d in zip(size[lead:], shape))


@kernel("aten::expand_copy.out")
def expand_copy_out(self, size, implicit, out):
    if out.shape == tuple(size) and out.ndim >= self.ndim and out.dtype == self.dtype:
        np.copyto(out, self)  # every size is given (no -1): the broadcast to it, or the same ValueError
        return out
    shape = _expanded_shape(tuple(size), self.shape)
    if shape != out.shape:
        out = resize(out, shape)
    np.copyto(out, self, casting="unsafe")  # numpy broadcasting: expand's rules (ValueError when it cannot)
    return out


@kernel("aten::repeat.out")
def repeat_out(self, repeats, out):
    repeats = tuple(int(r) for r in repeats)
    if len(repeats) < self.ndim or any(r < 0 for r in repeats):
        raise RuntimeExecutionError(f"repeat: bad repeats {list(repeats)} for a tensor of rank {self.ndim}")
    x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    check_fits(out, [a * b for a, b in zip(x.shape, repeats)], "repeat")
    return _copy_into(out, np.tile(x, repeats))


def _cat_inputs(tensors):
    # torch's legacy rule: 1-D empty tensors are skipped
    kept = [t for t in tensors if not (t.ndim == 1 and t.size == 0)]
    return kept or list(tensors[:1])


@kernel("aten::cat.out")
def cat_out(tensors, dim, out):
    ts = _cat_inputs(tensors)
    if not ts:
        raise RuntimeExecutionError("cat: needs at least one tensor")
    d = normalize_dim(dim, ts[0].ndim)
    shape = list(ts[0].shape)
    shape[d] = sum(t.shape[d] for t in ts)
    shape = tuple(shape)
    if out.shape != shape:
        out = resize(out, shape)
    np.concatenate(ts, axis=d, out=out, casting="unsafe")
    return out


@kernel("aten::stack.out")
def stack_out(tensors, dim, out):
    if not tensors:
        raise RuntimeExecutionError("stack: needs at least one tensor")
    d = normalize_dim(dim, tensors[0].ndim + 1)
    return store(out, np.stack(tensors, axis=d))


def _store_list(outs, parts):
    if len(outs) != len(parts):
        raise RuntimeExecutionError(f"split: {len(parts)} pieces but {len(outs)} outputs")
    return [_copy_into(o, p) for o, p in zip(outs, parts)]


@kernel("aten::split_with_sizes_copy.out")
def split_with_sizes_copy_out(self, split_sizes, dim, out):
    d = normalize_dim(dim, self.ndim)
    sizes = [int(s) for s in split_sizes]
    if sum(sizes) != self.shape[d]:
        raise RuntimeExecutionError(f"split_with_sizes: sizes {sizes} do not add up to {self.shape[d]}")
    bounds = np.cumsum(sizes)[:-1]
    return _store_list(out, np.split(self, bounds, axis=d))


@kernel("aten::split_copy.Tensor_out")
def split_copy_out(self, split_size, dim, out):
    d = normalize_dim(dim, self.ndim)
    n = self.shape[d]
    split_size = int(split_size)
    bounds = list(range(split_size, n, split_size)) if split_size > 0 else []
    return _store_list(out, np.split(self, bounds, axis=d))


@kernel("aten::unbind_copy.int_out")
def unbind_copy_out(self, dim, out):
    d = normalize_dim(dim, self.ndim)
    return _store_list(out, [np.take(self, i, axis=d) for i in range(self.shape[d])])


@kernel("aten::select_copy.int_out")
def select_copy_out(self, dim, index, out):
    d = normalize_dim(dim, self.ndim)
    n = self.shape[d]
    if not -n <= index < n:
        raise RuntimeExecutionError(f"select: index {index} is out of range for dimension {d} of size {n}")
    return _copy_into(out, self[(slice(None),) * d + (index,)])


@kernel("aten::slice_copy.Tensor_out")
def slice_copy_out(self, dim, start, end, step, out):
    d = normalize_dim(dim, self.ndim)
    if step is not None and step <= 0:
        raise RuntimeExecutionError(f"slice: step must be positive, got {step}")
    return _copy_into(out, self[(slice(None),) * d + (slice(start, end, step),)])


@kernel("aten::narrow_copy.out")
def narrow_copy_out(self, dim, start, length, out):
    d = normalize_dim(dim, self.ndim)
    n = self.shape[d]
    if start < 0:
        start += n
    if not (0 <= start and start + length <= n and length >= 0):
        raise RuntimeExecutionError(f"narrow: start {start} + length {length} exceeds dimension size {n}")
    return _copy_into(out, self[(slice(None),) * d + (slice(start, start + length),)])


@kernel("aten::unsqueeze_copy.out")
def unsqueeze_copy_out(self, dim, out):
    d = normalize_dim(dim, self.ndim + 1)
    return _copy_into(out, self[(slice(None),) * d + (None,)])


@kernel("aten::squeeze_copy.dims_out")
def squeeze_copy_dims_out(self, dim, out):
    if self.ndim == 0:
        return _copy_into(out, self)
    axes = tuple(d for d in {normalize_dim(d, self.ndim) for d in dim} if self.shape[d] == 1)
    return _copy_into(out, np.squeeze(self, axis=axes) if axes else self)


@kernel("aten::squeeze_copy.dim_out")
def squeeze_copy_dim_out(self, dim, out):
    return squeeze_copy_dims_out(self, (dim,), out)


@kernel("aten::squeeze_copy.out")
def squeeze_copy_out(self, out):
    return _copy_into(out, np.squeeze(self))


@kernel("aten::flip.out")
def flip_out(self, dims, out):
    return _copy_into(out, np.flip(self, axis=tuple(normalize_dim(d, self.ndim) for d in dims)))


@kernel("aten::roll.out")
def roll_out(self, shifts, dims, out):
    if len(dims) == 0:
        return _copy_into(out, np.roll(self.reshape(-1), int(shifts[0])).reshape(self.shape))
    return _copy_into(out, np.roll(self, tuple(int(s) for s in shifts), axis=tuple(int(d) for d in dims)))


@kernel("aten::tril.out")
def tril_out(self, diagonal, out):
    return _copy_into(out, np.tril(self, diagonal))


@kernel("aten::triu.out")
def triu_out(self, diagonal, out):
    return _copy_into(out, np.triu(self, diagonal))


@kernel("aten::constant_pad_nd.out")
def constant_pad_nd_out(self, pad, value, out):
    pad = [int(p) for p in pad]
    if len(pad) % 2 or len(pad) // 2 > self.ndim:
        raise RuntimeExecutionError(f"constant_pad_nd: pad {pad} does not fit a tensor of rank {self.ndim}")
    shape = list(self.shape)
    src = [slice(None)] * self.ndim
    dst = [slice(None)] * self.ndim
    for i in range(len(pad) // 2):
        d = self.ndim - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        n = self.shape[d]
        new = n + lo + hi
        if new < 0:
            raise RuntimeExecutionError(f"constant_pad_nd: padding {pad} makes dimension {d} negative")
        shape[d] = new
        s0, s1 = max(0, -lo), n - max(0, -hi)
        dst[d] = slice(max(0, lo), max(0, lo) + max(0, s1 - s0))
        src[d] = slice(s0, max(s0, s1))
    shape = tuple(shape)
    if out.shape != shape:
        out = resize(out, shape)
    out.fill(value)
    out[tuple(dst)] = self[tuple(src)]
    return out


@kernel("aten::index.Tensor_out")
def index_out(self, indices, out):
    if len(indices) > self.ndim:
        raise RuntimeExecutionError(f"index: {len(indices)} indices for a tensor of rank {self.ndim}")
    key = []
    for d, ix in enumerate(indices):
        if ix is None:
            key.append(slice(None))
            continue
        if ix.dtype.kind in "iu":
            n = self.shape[d]
            if ix.size and (ix.min() < -n or ix.max() >= n):
                raise RuntimeExecutionError(f"index: an index is out of range for dimension {d} of size {n}")
        elif ix.dtype != np.bool_:
            raise RuntimeExecutionError(f"index: indices must be integer or bool tensors, got {ix.dtype}")
        key.append(ix)
    return store(out, self[tuple(key)])


@kernel("aten::index_select.out")
def index_select_out(self, dim, index, out):
    d = normalize_dim(dim, self.ndim)
    n = self.shape[d] if self.ndim else 1
    idx = index.reshape(-1)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise RuntimeExecutionError(f"index_select: an index is out of range for dimension {d} of size {n}")
    return store(out, np.take(self, idx, axis=d) if self.ndim else self)


@kernel("aten::gather.out")
def gather_out(self, dim, index, sparse_grad, out):
    d = normalize_dim(dim, self.ndim)
    return store(out, np.take_along_axis(self, index.astype(np.intp, copy=False), axis=d))


@kernel("aten::pixel_shuffle.out")
def pixel_shuffle_out(self, upscale_factor, out):
    r = int(upscale_factor)
    *lead, c, h, w = self.shape
    x = self.reshape(*lead, c // (r * r), r, r, h, w)
    n = len(lead)
    perm = list(range(n)) + [n, n + 3, n + 1, n + 4, n + 2]
    return _copy_into(out, x.transpose(perm).reshape(*lead, c // (r * r), h * r, w * r))


def _nearest_index(in_size, out_size, scale):
    # torch's nearest: src = floor(dst * (1/scale or in/out))
    ratio = (1.0 / scale) if scale else in_size / out_size
    return np.minimum((np.arange(out_size) * ratio).astype(np.int64), in_size - 1)


@kernel("aten::upsample_nearest2d.vec_out")
def upsample_nearest2d_vec_out(input, output_size, scale_factors, out):  # noqa: A002
    H, W = input.shape[-2:]
    if output_size is not None:
        Ho, Wo = (int(s) for s in output_size)
        sh = sw = None
    else:
        sh, sw = scale_factors
        Ho, Wo = int(H * sh), int(W * sw)
    check_fits(out, input.shape[:-2] + (Ho, Wo), "upsample_nearest2d")
    hi = _nearest_index(H, Ho, sh)
    wi = _nearest_index(W, Wo, sw)
    return store(out, input[..., hi[:, None], wi[None, :]])


@kernel("aten::upsample_nearest2d.out")
def upsample_nearest2d_out(self, output_size, scales_h, scales_w, out):
    H, W = self.shape[-2:]
    Ho, Wo = (int(s) for s in output_size)
    check_fits(out, self.shape[:-2] + (Ho, Wo), "upsample_nearest2d")
    hi = _nearest_index(H, Ho, scales_h)
    wi = _nearest_index(W, Wo, scales_w)
    return store(out, self[..., hi[:, None], wi[None, :]])
