"""Matrix products: mm, bmm, addmm, linear, baddbmm."""

from __future__ import annotations

import numpy as np

from edgeport.runtime.portable._common import kernel, resize, store


def _matmul_into(a, b, out):
    shape = a.shape[:-1] + b.shape[-1:] if a.ndim == 2 and b.ndim == 2 else np.broadcast_shapes(
        a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    if shape != out.shape:
        out = resize(out, shape)
    if out.dtype == a.dtype == b.dtype and out.flags.c_contiguous:
        np.matmul(a, b, out=out)
    else:
        np.copyto(out, np.matmul(a, b), casting="unsafe")
    return out


@kernel("aten::mm.out")
def mm_out(self, mat2, out):
    return _matmul_into(self, mat2, out)


@kernel("aten::bmm.out")
def bmm_out(self, mat2, out):
    return _matmul_into(self, mat2, out)


@kernel("aten::matmul.out")
def matmul_out(self, other, out):
    return store(out, np.matmul(self, other))


@kernel("aten::addmm.out")
def addmm_out(self, mat1, mat2, beta, alpha, out):
    out = _matmul_into(mat1, mat2, out)
    if alpha != 1:
        out *= alpha
    if beta != 0:
        np.add(out, self if beta == 1 else self * beta, out=out, casting="unsafe")
    return out


@kernel("aten::baddbmm.out")
def baddbmm_out(self, batch1, batch2, beta, alpha, out):
    out = _matmul_into(batch1, batch2, out)
    if alpha != 1:
        out *= alpha
    if beta != 0:
        np.add(out, self if beta == 1 else self * beta, out=out, casting="unsafe")
    return out


@kernel("aten::linear.out")
def linear_out(input, weight, bias, out):  # noqa: A002 - schema names
    if input.ndim == 1:
        res = input @ weight.T
        return store(out, res if bias is None else res + bias)
    shape = input.shape[:-1] + weight.shape[:1]
    if shape != out.shape:
        out = resize(out, shape)
    _matmul_into(input.reshape(-1, input.shape[-1]), weight.T, out.reshape(-1, shape[-1]))
    if bias is not None:
        np.add(out, bias, out=out, casting="unsafe")
    return out
