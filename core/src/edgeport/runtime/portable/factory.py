"""Tensor factories: full, zeros, ones, arange, scalar_tensor, empty."""

from __future__ import annotations

import math

import numpy as np

from edgeport.errors import RuntimeExecutionError
from edgeport.runtime.portable._common import kernel, resize


def _fill(out, shape, value):
    shape = tuple(int(s) for s in shape)
    if out.shape != shape:
        out = resize(out, shape)
    out.fill(value)
    return out


@kernel("aten::full.out")
def full_out(size, fill_value, out):
    return _fill(out, size, fill_value)


@kernel("aten::full_like.out")
def full_like_out(self, fill_value, memory_format, out):
    if out.shape != self.shape:
        out = resize(out, self.shape)
    out.fill(fill_value)
    return out


@kernel("aten::zeros.out")
def zeros_out(size, out):
    return _fill(out, size, 0)


@kernel("aten::ones.out")
def ones_out(size, out):
    return _fill(out, size, 1)


@kernel("aten::zeros_like.out")
def zeros_like_out(self, memory_format, out):
    return _fill(out, self.shape, 0)


@kernel("aten::ones_like.out")
def ones_like_out(self, memory_format, out):
    return _fill(out, self.shape, 1)


@kernel("aten::empty.out")
def empty_out(size, memory_format, out):
    size = tuple(int(s) for s in size)
    return out if out.shape == size else resize(out, size)


@kernel("aten::scalar_tensor.out")
def scalar_tensor_out(s, out):
    out[...] = s
    return out


@kernel("aten::arange.start_out")
def arange_start_out(start, end, step, out):
    if step == 0:
        raise RuntimeExecutionError("arange: step must be nonzero")
    n = math.ceil((end - start) / step)
    if n < 0:
        raise RuntimeExecutionError(f"arange: upper bound and step of ({start}, {end}, {step}) disagree")
    if out.shape != (n,):
        out = resize(out, (n,))
    if out.dtype.kind in "iu" and isinstance(start, int) and isinstance(end, int) and isinstance(step, int):
        out[...] = np.arange(start, start + n * step, step, dtype=np.int64)[:n]
    else:
        out[...] = start + np.arange(n, dtype=np.float64) * step
    return out


@kernel("aten::arange.out")
def arange_out(end, out):
    return arange_start_out(0, end, 1, out)
