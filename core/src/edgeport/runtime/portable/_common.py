"""Shared pieces of the portable kernels: the op table, fast elementwise helpers, dtype arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgeport.program.schema import numpy_dtype
from edgeport.runtime.kernel_utils import broadcast_shape, normalize_dim, normalize_dims, resize, store

__all__ = ["KERNELS", "kernel", "ew", "ew_unary", "dtype_arg", "store", "resize", "normalize_dim",
           "normalize_dims", "np_float"]

#: op name ("aten::add.out") -> kernel
KERNELS: dict[str, Callable[..., Any]] = {}

_nd = np.ndarray


def kernel(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the portable kernel of each op name given."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            if name in KERNELS:
                raise RuntimeError(f"portable kernel {name} defined twice")
            KERNELS[name] = fn
        return fn

    return deco


def ew(uf: np.ufunc, out: np.ndarray, a: Any, b: Any) -> np.ndarray:
    """``out = uf(a, b)`` with broadcasting, writing in place; resizes ``out`` when the result is smaller
    than the planned shape (dynamic shapes)."""
    shape = out.shape
    if (a.__class__ is not _nd or a.shape == shape) and (b.__class__ is not _nd or b.shape == shape):
        if a.__class__ is _nd or b.__class__ is _nd:
            uf(a, b, out=out, casting="unsafe")
            return out
    res_shape = broadcast_shape(np.shape(a), np.shape(b))
    if res_shape != shape:
        out = resize(out, res_shape)
    uf(a, b, out=out, casting="unsafe")
    return out


def ew_unary(uf: np.ufunc, out: np.ndarray, a: np.ndarray) -> np.ndarray:
    if a.shape != out.shape:
        out = resize(out, a.shape)
    uf(a, out=out, casting="unsafe")
    return out


def dtype_arg(code: int | None) -> np.dtype | None:
    """numpy dtype of an optional ``ScalarType`` argument."""
    return None if code is None else numpy_dtype(code)


def np_float(x: np.ndarray) -> np.ndarray:
    """``x`` as a floating array (integers and bools become float32, as torch's default dtype)."""
    return x if x.dtype.kind in "fc" else x.astype(np.float32)
