"""Neural-network portable kernels: convolution, pooling, normalization, softmax, embedding.

Convolution is vectorised: 1x1 convolutions are one matrix product, depthwise convolutions accumulate one
strided view per kernel tap, everything else goes through im2col (a strided view copied once) and a batched
matrix product written straight into the planned output. No Python loop runs over pixels.
"""

from __future__ import annotations

import itertools
from math import prod

import numpy as np
from numpy.lib.stride_tricks import as_strided

from edgeport.errors import RuntimeExecutionError
from edgeport.runtime.kernel_utils import check_fits
from edgeport.runtime.portable._common import kernel, normalize_dim, resize, store


def _tuple(v, n, name):
    v = tuple(int(x) for x in v)
    if len(v) == 1 and n > 1:
        v = v * n
    if len(v) != n:
        raise RuntimeExecutionError(f"{name} has {len(v)} entries, expected {n}")
    return v


def _pad_spatial(x, pads_lo, pads_hi, value=0.0):
    """Pad the trailing len(pads) dims of ``x`` (constant ``value``)."""
    if not any(pads_lo) and not any(pads_hi):
        return x
    lead = x.ndim - len(pads_lo)
    shape = x.shape[:lead] + tuple(s + lo + hi for s, lo, hi in zip(x.shape[lead:], pads_lo, pads_hi))
    xp = np.full(shape, value, dtype=x.dtype)
    xp[(Ellipsis,) + tuple(slice(lo, lo + s) for lo, s in zip(pads_lo, x.shape[lead:]))] = x
    return xp


def _bias_view(bias, ndim):
    return bias.reshape((1, -1) + (1,) * (ndim - 2))


# --------------------------------------------------------------------------------------------- convolution
@kernel("aten::convolution.out")
def convolution_out(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, out):  # noqa: A002
    nsp = weight.ndim - 2
    if nsp < 1 or input.ndim != nsp + 2:
        raise RuntimeExecutionError(
            f"convolution: input of rank {input.ndim} and weight of rank {weight.ndim} do not match")
    stride = _tuple(stride, nsp, "stride")
    padding = _tuple(padding, nsp, "padding")
    dilation = _tuple(dilation, nsp, "dilation")
    groups = int(groups)
    if transposed:
        output_padding = _tuple(output_padding, nsp, "output_padding") if len(output_padding) else (0,) * nsp
        res = _conv_transpose(input, weight, stride, padding, dilation, output_padding, groups)
        if bias is not None:
            res += _bias_view(bias, res.ndim)
        return store(out, res)
    N, C = input.shape[:2]
    Cout = weight.shape[0]
    if C != weight.shape[1] * groups or Cout % groups:
        raise RuntimeExecutionError(
            f"convolution: input has {C} channels, weight {list(weight.shape)} with groups={groups}")
    osp = tuple((input.shape[2 + i] + 2 * padding[i] - dilation[i] * (weight.shape[2 + i] - 1) - 1) // stride[i] + 1
                for i in range(nsp))
    if min(osp) <= 0:
        raise RuntimeExecutionError(f"convolution: output spatial size {osp} is not positive")
    shape = (N, Cout) + osp
    if out.shape != shape:
        out = resize(out, shape)
    direct = out.dtype == input.dtype == weight.dtype and out.flags.c_contiguous
    target = out if direct else np.empty(shape, dtype=np.result_type(input, weight))
    _conv_forward(input, weight, stride, padding, dilation, groups, osp, target)
    if bias is not None:
        np.add(target, _bias_view(bias, target.ndim), out=target, casting="unsafe")
    if not direct:
        np.copyto(out, target, casting="unsafe")
    return out


def _conv_forward(x, w, stride, padding, dilation, groups, osp, out):
    N, C = x.shape[:2]
    Cout = w.shape[0]
    K = w.shape[2:]
    nsp = len(K)
    P = prod(osp)
    if groups == 1 and all(k == 1 for k in K) and not any(padding):
        xs = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)] if any(
            s != 1 for s in stride) else x
        np.matmul(w.reshape(Cout, C), xs.reshape(N, C, P), out=out.reshape(N, Cout, P))
        return
    if groups == C and Cout == C and nsp == 2:
        if osp[0] * osp[1] <= 2 * C:
            _depthwise2d_nhwc(x, w, stride, padding, dilation, osp, out)
        else:
            _depthwise2d(_pad_spatial(x, padding, padding), w, stride, dilation, osp, out)
        return
    xp = _pad_spatial(x, padding, padding)
    G = groups
    Cg, Og = C // G, Cout // G
    sN, sC = xp.strides[:2]
    ssp = xp.strides[2:]
    patches = as_strided(
        xp,
        shape=(N, G, Cg) + tuple(K) + osp,
        strides=(sN, sC * Cg, sC) + tuple(ssp[i] * dilation[i] for i in range(nsp))
        + tuple(ssp[i] * stride[i] for i in range(nsp)),
        writeable=False,
    )
    cols = patches.reshape(N, G, Cg * prod(K), P)
    np.matmul(w.reshape(G, Og, Cg * prod(K)), cols, out=out.reshape(N, G, Og, P))


def _depthwise2d(xp, w, stride, dilation, osp, out):
    (sh, sw), (dh, dw), (Ho, Wo) = stride, dilation, osp
    kh, kw = w.shape[2:]
    wt = w.reshape(w.shape[0], kh * kw)
    tmp = np.empty_like(out)
    first = True
    for i in range(kh):
        for j in range(kw):
            view = xp[:, :, i * dh: i * dh + sh * (Ho - 1) + 1: sh, j * dw: j * dw + sw * (Wo - 1) + 1: sw]
            tap = wt[:, i * kw + j].reshape(1, -1, 1, 1)
            if first:
                np.multiply(view, tap, out=out)
                first = False
            else:
                np.multiply(view, tap, out=tmp)
                out += tmp


def _depthwise2d_nhwc(x, w, stride, padding, dilation, osp, out, block_elems=32768):
    """Depthwise convolution in channels-last order: each tap is a multiply-add over rows of C contiguous
    values (small feature maps with many channels), computed in row blocks that stay in cache."""
    N, C, H, W = x.shape
    (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = stride, padding, dilation, osp
    kh, kw = w.shape[2:]
    xp = np.zeros((N, H + 2 * ph, W + 2 * pw, C), dtype=out.dtype)
    xp[:, ph:ph + H, pw:pw + W, :] = x.transpose(0, 2, 3, 1)
    acc = np.empty((N, Ho, Wo, C), dtype=out.dtype)
    wt = np.ascontiguousarray(w.reshape(C, kh * kw).T)
    rb = max(1, block_elems // max(1, Wo * C))
    tmp = np.empty((N, min(rb, Ho), Wo, C), dtype=out.dtype)
    for r0 in range(0, Ho, rb):
        r1 = min(Ho, r0 + rb)
        a = acc[:, r0:r1]
        t = tmp[:, :r1 - r0]
        for i in range(kh):
            for j in range(kw):
                v = xp[:, i * dh + sh * r0: i * dh + sh * (r1 - 1) + 1: sh, j * dw: j * dw + sw * (Wo - 1) + 1: sw, :]
                if i == 0 and j == 0:
                    np.multiply(v, wt[0], out=a)
                else:
                    np.multiply(v, wt[i * kw + j], out=t)
                    a += t
    np.copyto(out, acc.transpose(0, 3, 1, 2))


def _conv_transpose(x, w, stride, padding, dilation, output_padding, groups):
    N, Cin = x.shape[:2]
    S = x.shape[2:]
    K = w.shape[2:]
    nsp = len(K)
    G = groups
    Cig, Og = Cin // G, w.shape[1]
    if Cin != w.shape[0]:
        raise RuntimeExecutionError(f"transposed convolution: input has {Cin} channels, weight {list(w.shape)}")
    wt = w.reshape(G, Cig, Og * prod(K)).transpose(0, 2, 1)
    cols = np.matmul(wt, x.reshape(N, G, Cig, prod(S)))  # (N, G, Og*prodK, prodS)
    cols = cols.reshape((N, G, Og) + tuple(K) + tuple(S))
    full = tuple((S[i] - 1) * stride[i] + dilation[i] * (K[i] - 1) + 1 for i in range(nsp))
    osp = tuple(full[i] - 2 * padding[i] + output_padding[i] for i in range(nsp))
    if min(osp) <= 0:
        raise RuntimeExecutionError(f"transposed convolution: output size {osp} is not positive")
    if any(op >= max(st, dl) for op, st, dl in zip(output_padding, stride, dilation)):
        raise RuntimeExecutionError(f"transposed convolution: output_padding {output_padding} must be smaller than "
                                    f"stride {stride} or dilation {dilation}")
    buf = np.zeros((N, G, Og) + tuple(full[i] + output_padding[i] for i in range(nsp)), dtype=cols.dtype)
    for k in itertools.product(*(range(kk) for kk in K)):
        sl = tuple(slice(k[i] * dilation[i], k[i] * dilation[i] + stride[i] * (S[i] - 1) + 1, stride[i])
                   for i in range(nsp))
        buf[(slice(None),) * 3 + sl] += cols[(slice(None),) * 3 + k]
    crop = tuple(slice(padding[i], padding[i] + osp[i]) for i in range(nsp))
    return buf[(slice(None),) * 3 + crop].reshape((N, G * Og) + osp)


# --------------------------------------------------------------------------------------------- pooling
def _pool_out_size(L, k, s, p, d, ceil_mode):
    num = L + 2 * p - d * (k - 1) - 1
    o = (num + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= L + p:
        o -= 1
    return o


def _pool_args(x, kernel_size, stride, padding, dilation, ceil_mode):
    k = _tuple(kernel_size, 2, "kernel_size")
    s = _tuple(stride, 2, "stride") if len(stride) else k
    p = _tuple(padding, 2, "padding")
    d = _tuple(dilation, 2, "dilation")
    if any(pp * 2 > kk for pp, kk in zip(p, k)):
        raise RuntimeExecutionError(f"pooling: padding {p} must be at most half of kernel size {k}")
    H, W = x.shape[-2:]
    Ho = _pool_out_size(H, k[0], s[0], p[0], d[0], ceil_mode)
    Wo = _pool_out_size(W, k[1], s[1], p[1], d[1], ceil_mode)
    if Ho <= 0 or Wo <= 0:
        raise RuntimeExecutionError(f"pooling: output size {(Ho, Wo)} is not positive for input {(H, W)}")
    return k, s, p, d, Ho, Wo


def _taps(xp, k, s, d, Ho, Wo):
    for i in range(k[0]):
        for j in range(k[1]):
            yield i, j, xp[..., i * d[0]: i * d[0] + s[0] * (Ho - 1) + 1: s[0],
                           j * d[1]: j * d[1] + s[1] * (Wo - 1) + 1: s[1]]


@kernel("aten::max_pool2d_with_indices.out")
def max_pool2d_with_indices_out(self, kernel_size, stride, padding, dilation, ceil_mode, out, indices):
    """Separable: the max over each window's columns first, then over its rows (2 x k passes instead of
    k x k). ``indices`` may be ``None`` when the program never reads them (see ``optional_outs``)."""
    x = self
    k, s, p, d, Ho, Wo = _pool_args(x, kernel_size, stride, padding, dilation, ceil_mode)
    H, W = x.shape[-2:]
    hi_h = max(0, (Ho - 1) * s[0] + d[0] * (k[0] - 1) + 1 - (H + p[0]))
    hi_w = max(0, (Wo - 1) * s[1] + d[1] * (k[1] - 1) + 1 - (W + p[1]))
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = _pad_spatial(x, p, (hi_h, hi_w), lowest)
    shape = x.shape[:-2] + (Ho, Wo)
    out = resize(out, shape) if out.shape != shape else out
    want_idx = indices is not None
    # stage 1: max over the kernel's columns, for every padded row
    cols = [xp[..., :, j * d[1]: j * d[1] + s[1] * (Wo - 1) + 1: s[1]] for j in range(k[1])]
    hmax = cols[0].copy()
    for c in cols[1:]:
        np.maximum(hmax, c, out=hmax)  # propagates NaN like torch
    # stage 2: max over the kernel's rows
    rows = [hmax[..., i * d[0]: i * d[0] + s[0] * (Ho - 1) + 1: s[0], :] for i in range(k[0])]
    np.copyto(out, rows[0], casting="unsafe")
    for r in rows[1:]:
        np.maximum(out, r, out=out, casting="unsafe")
    if not want_idx:
        return out, None
    indices = resize(indices, shape) if indices.shape != shape else indices
    # torch scans each window row-major and keeps the first maximum, but the last NaN. Here: the smallest row
    # whose column-max equals the maximum, then in that row the smallest column holding it (for a NaN window,
    # the largest row and column holding a NaN).
    best = out if out.dtype == x.dtype else out.astype(x.dtype)
    nan = np.isnan(best) if x.dtype.kind == "f" else None
    if nan is not None and not nan.any():
        nan = None
    ii = np.zeros(shape, dtype=np.int64)
    for i in reversed(range(k[0])):
        np.copyto(ii, i, where=rows[i] == best)
    if nan is not None:
        for i in range(k[0]):
            np.copyto(ii, i, where=nan & np.isnan(rows[i]))
    jj = np.zeros(shape, dtype=np.int64)
    row_sel = np.arange(Ho, dtype=np.int64)[:, None] * s[0] + ii * d[0]  # padded row of the max
    picked = [np.take_along_axis(cols[j], row_sel, axis=-2) for j in range(k[1])]
    for j in reversed(range(k[1])):
        np.copyto(jj, j, where=picked[j] == best)
    if nan is not None:
        for j in range(k[1]):
            np.copyto(jj, j, where=nan & np.isnan(picked[j]))
    r = row_sel - p[0]
    c = np.arange(Wo, dtype=np.int64)[None, :] * s[1] + jj * d[1] - p[1]
    np.copyto(indices, r * W + c, casting="unsafe")
    return out, indices


max_pool2d_with_indices_out.optional_outs = (7,)  # the indices


@kernel("aten::max_pool2d.out")
def max_pool2d_out(self, kernel_size, stride, padding, dilation, ceil_mode, out):
    return max_pool2d_with_indices_out(self, kernel_size, stride, padding, dilation, ceil_mode, out, None)[0]


@kernel("aten::avg_pool2d.out")
def avg_pool2d_out(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, out):
    x = self
    k, s, p, d, Ho, Wo = _pool_args(x, kernel_size, stride, padding, (1,), ceil_mode)
    H, W = x.shape[-2:]
    hi_h = max(0, (Ho - 1) * s[0] + k[0] - (H + p[0]))
    hi_w = max(0, (Wo - 1) * s[1] + k[1] - (W + p[1]))
    acc_dtype = x.dtype if x.dtype.kind == "f" else np.float64
    xp = _pad_spatial(x.astype(acc_dtype, copy=False), p, (hi_h, hi_w), 0)
    acc = None
    for _, _, view in _taps(xp, k, s, (1, 1), Ho, Wo):
        if acc is None:
            acc = view.copy()
        else:
            acc += view
    if divisor_override:
        acc /= divisor_override
    else:
        acc /= _avg_divisor(H, W, Ho, Wo, k, s, p, count_include_pad).astype(acc_dtype)
    return store(out, acc)


def _avg_divisor(H, W, Ho, Wo, k, s, p, count_include_pad):
    def axis(L, n_out, kk, ss, pp):
        start = np.arange(n_out) * ss - pp
        end = np.minimum(start + kk, L + pp)
        size = end - start
        cstart = np.maximum(start, 0)
        cend = np.minimum(end, L)
        return size, cend - cstart

    sh, ch = axis(H, Ho, k[0], s[0], p[0])
    sw, cw = axis(W, Wo, k[1], s[1], p[1])
    if count_include_pad:
        return sh[:, None] * sw[None, :]
    return ch[:, None] * cw[None, :]


@kernel("aten::_adaptive_avg_pool2d.out", "aten::adaptive_avg_pool2d.out")
def adaptive_avg_pool2d_out(self, output_size, out):
    x = self
    Ho, Wo = _tuple(output_size, 2, "output_size")
    H, W = x.shape[-2:]
    lead = x.shape[:-2]
    if Ho <= 0 or Wo <= 0:
        raise RuntimeExecutionError(f"adaptive_avg_pool2d: output size {(Ho, Wo)} must be positive")
    check_fits(out, lead + (Ho, Wo), "adaptive_avg_pool2d")
    if H % Ho == 0 and W % Wo == 0:
        res = x.reshape(lead + (Ho, H // Ho, Wo, W // Wo)).mean(axis=(-3, -1))
        return store(out, res)
    # integral image over float64, then box sums
    ii = np.zeros(lead + (H + 1, W + 1), dtype=np.float64)
    np.cumsum(np.cumsum(x, axis=-2, dtype=np.float64), axis=-1, out=ii[..., 1:, 1:])
    hs = (np.arange(Ho) * H) // Ho
    he = -((-(np.arange(Ho) + 1) * H) // Ho)
    ws = (np.arange(Wo) * W) // Wo
    we = -((-(np.arange(Wo) + 1) * W) // Wo)
    box = (ii[..., he[:, None], we[None, :]] - ii[..., hs[:, None], we[None, :]]
           - ii[..., he[:, None], ws[None, :]] + ii[..., hs[:, None], ws[None, :]])
    area = (he - hs)[:, None] * (we - ws)[None, :]
    return store(out, box / area)


# --------------------------------------------------------------------------------------------- normalization
def _bn_eval(x, weight, bias, mean, var, eps, out):
    invstd = 1.0 / np.sqrt(var.astype(np.float32 if var.dtype == np.float16 else var.dtype) + eps)
    scale = invstd if weight is None else invstd * weight
    shift = -mean * scale
    if bias is not None:
        shift = shift + bias
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if out.shape != x.shape:
        out = resize(out, x.shape)
    np.multiply(x, scale.reshape(shape), out=out, casting="unsafe")
    np.add(out, shift.reshape(shape), out=out, casting="unsafe")
    return out, invstd


def _bn_train(x, weight, bias, running_mean, running_var, momentum, eps, out, save_mean, save_invstd):
    axes = (0,) + tuple(range(2, x.ndim))
    xf = x.astype(np.float64)
    mean = xf.mean(axis=axes)
    var = xf.var(axis=axes)
    invstd = 1.0 / np.sqrt(var + eps)
    out, _ = _bn_eval(x, weight, bias, mean, var, eps, out)
    n = x.size // x.shape[1]
    if running_mean is not None and running_mean.flags.writeable:
        running_mean *= 1 - momentum
        running_mean += momentum * mean
    if running_var is not None and running_var.flags.writeable:
        running_var *= 1 - momentum
        running_var += momentum * var * n / max(n - 1, 1)
    save_mean = store(save_mean, mean)
    save_invstd = store(save_invstd, invstd)
    return out, save_mean, save_invstd


@kernel("aten::_native_batch_norm_legit_no_training.out")
def batch_norm_no_training_out(input, weight, bias, running_mean, running_var, momentum, eps, out0, out1, out2):  # noqa: A002
    out0, _ = _bn_eval(input, weight, bias, running_mean, running_var, eps, out0)
    return out0, out1, out2


@kernel("aten::native_batch_norm.out", "aten::_native_batch_norm_legit.out")
def native_batch_norm_out(input, weight, bias, running_mean, running_var, training, momentum, eps,  # noqa: A002
                          out, save_mean, save_invstd):
    if training or running_mean is None:
        return _bn_train(input, weight, bias, running_mean, running_var, momentum, eps, out, save_mean,
                         save_invstd)
    out, invstd = _bn_eval(input, weight, bias, running_mean, running_var, eps, out)
    return out, save_mean, save_invstd


@kernel("aten::_native_batch_norm_legit.no_stats_out")
def batch_norm_no_stats_out(input, weight, bias, training, momentum, eps, out, save_mean, save_invstd):  # noqa: A002
    return _bn_train(input, weight, bias, None, None, momentum, eps, out, save_mean, save_invstd)


@kernel("aten::native_layer_norm.out")
def native_layer_norm_out(input, normalized_shape, weight, bias, eps, out0, out1, out2):  # noqa: A002
    x = input
    k = len(normalized_shape)
    if tuple(x.shape[x.ndim - k:]) != tuple(normalized_shape):
        raise RuntimeExecutionError(
            f"layer_norm: input shape {list(x.shape)} does not end with normalized_shape {list(normalized_shape)}")
    axes = tuple(range(x.ndim - k, x.ndim))
    acc = x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)
    mean = acc.mean(axis=axes, keepdims=True)
    xc = acc - mean
    var = np.mean(xc * xc, axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xc *= rstd
    if weight is not None:
        xc *= weight
    if bias is not None:
        xc += bias
    return store(out0, xc), store(out1, mean), store(out2, rstd)


@kernel("aten::native_group_norm.out")
def native_group_norm_out(input, weight, bias, N, C, HxW, group, eps, out0, out1, out2):  # noqa: A002
    x = input
    g = x.reshape(N, group, -1).astype(np.float64)
    mean = g.mean(axis=-1)
    var = g.var(axis=-1)
    rstd = 1.0 / np.sqrt(var + eps)
    y = ((g - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return store(out0, y), store(out1, mean), store(out2, rstd)


# --------------------------------------------------------------------------------------------- softmax
def _softmax(x, dim, out, log):
    dim = normalize_dim(dim, x.ndim)
    if x.ndim == 0:
        return store(out, np.zeros((), x.dtype) if log else np.ones((), x.dtype))
    if out.shape != x.shape:
        out = resize(out, x.shape)
    m = x.max(axis=dim, keepdims=True)
    if out.dtype == x.dtype:
        np.subtract(x, m, out=out)
        e = out
    else:
        e = x - m
    if log:
        s = np.exp(e).sum(axis=dim, keepdims=True)
        res = np.subtract(e, np.log(s), out=e)
    else:
        np.exp(e, out=e)
        res = np.divide(e, e.sum(axis=dim, keepdims=True), out=e)
    if res is not out:
        np.copyto(out, res, casting="unsafe")
    return out


@kernel("aten::_softmax.out")
def softmax_out(self, dim, half_to_float, out):
    return _softmax(self, dim, out, log=False)


@kernel("aten::softmax.int_out")
def softmax_int_out(self, dim, dtype, out):
    return _softmax(self, dim, out, log=False)


@kernel("aten::_log_softmax.out")
def log_softmax_out(self, dim, half_to_float, out):
    return _softmax(self, dim, out, log=True)


@kernel("aten::log_softmax.int_out")
def log_softmax_int_out(self, dim, dtype, out):
    return _softmax(self, dim, out, log=True)


# --------------------------------------------------------------------------------------------- embedding
_UNSIGNED = {np.dtype(np.int64): np.uint64, np.dtype(np.int32): np.uint32}
#: up to this many indices are range-checked as a Python list (~1 us) rather than by a numpy reduction (~3 us)
_FEW_INDICES = 256


@kernel("aten::embedding.out")
def embedding_out(weight, indices, padding_idx, scale_grad_by_freq, sparse, out):
    unsigned = _UNSIGNED.get(indices.dtype)
    if unsigned is not None and indices.size == 1:  # one token (a decode step)
        bad = not 0 <= indices.item() < weight.shape[0]
    elif unsigned is not None and indices.size <= _FEW_INDICES:  # a short prompt: Python's min / max of a list
        values = indices.ravel().tolist()
        bad = bool(values) and (min(values) < 0 or max(values) >= weight.shape[0])
    elif unsigned is not None:  # one reduction: seen unsigned, a negative index is larger than any row count
        bad = indices.size and int(indices.view(unsigned).max()) >= weight.shape[0]
    else:
        bad = indices.size and (indices.min() < 0 or indices.max() >= weight.shape[0])
    if bad:
        raise RuntimeExecutionError(
            f"embedding: index out of range [0, {weight.shape[0]}) (got {int(indices.min())}..{int(indices.max())})")
    shape = indices.shape + weight.shape[1:]
    if out.shape != shape:
        out = resize(out, shape)
    if out.dtype == weight.dtype and out.flags.c_contiguous:
        np.take(weight, indices, axis=0, out=out, mode="clip")  # checked above; "clip" writes out unbuffered
    else:
        np.copyto(out, np.take(weight, indices, axis=0), casting="unsafe")
    return out
