"""Numpy implementations of the graph nodes this libXNNPACK cannot define (torch-free).

The 2022 snapshot of XNNPACK that Debian ships has no static transpose, concatenate, slice, batch matrix
multiply, copy, tanh, exp, ... nodes; ExecuTorch's XNNPACK delegate emits them (a transpose at every NCHW/NHWC
boundary). The executor runs them as host steps between XNNPACK runtimes, writing into preallocated buffers.
Each function checks the node's parameters against the shapes it was planned with and raises ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edgeport_xnnpack.schema.graph import CAT_INPUTS, XNode

HostFn = Callable[[Sequence[np.ndarray], np.ndarray], None]


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 refined with one Newton step: |error| < 1e-7 in float32
    a1, a2, a3, a4, a5, p = 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429, 0.3275911
    s = np.sign(x)
    ax = np.abs(x).astype(np.float64)
    t = 1.0 / (1.0 + p * ax)
    y = 1.0 - (((((a5 * t + a4) * t) + a3) * t + a2) * t + a1) * t * np.exp(-ax * ax)
    return (s * y).astype(x.dtype)


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "XNNTanh": np.tanh,
    "XNNExp": np.exp,
    "XNNLog": np.log,
    "XNNSin": np.sin,
    "XNNCos": np.cos,
    "XNNReciprocalSquareRoot": lambda x: 1.0 / np.sqrt(x),
    "XNNGelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "XNNCopy": lambda x: x,
}

# node kinds the executor can run on the host
HOST_KINDS = frozenset({"XNNStaticTranspose", "XNNStaticSlice", "XNNBatchMatrixMultiply", "XNNFullyConnected",
                        *CAT_INPUTS, *_UNARY})


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def make_host_fn(node: XNode, in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]) -> HostFn:
    """A function ``fn(inputs, out)`` computing ``node`` into ``out``; validates parameters now."""
    kind = node.kind
    rank = len(out_shape)
    if kind == "XNNStaticTranspose":
        perm = [int(p) for p in node.get("perm")]
        _check(sorted(perm) == list(range(len(in_shapes[0]))), f"bad permutation {perm} for rank {len(in_shapes[0])}")
        _check(tuple(in_shapes[0][p] for p in perm) == out_shape, f"transpose {perm} of {in_shapes[0]} != {out_shape}")

        def transpose(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
            np.copyto(out, xs[0].transpose(perm))
        return transpose
    if kind in CAT_INPUTS:
        axis = int(node.get("axis"))
        _check(axis < rank, f"concatenate axis {axis} out of range for rank {rank}")
        _check(all(len(s) == rank for s in in_shapes), "concatenate inputs differ in rank")
        _check(sum(s[axis] for s in in_shapes) == out_shape[axis], "concatenate sizes do not add up")

        def concatenate(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
            np.concatenate(list(xs), axis=axis, out=out)
        return concatenate
    if kind == "XNNStaticSlice":
        offsets, sizes = [int(v) for v in node.get("offsets")], [int(v) for v in node.get("sizes")]
        shape = in_shapes[0]
        _check(len(offsets) == len(sizes) == len(shape), "slice offsets/sizes do not match the input rank")
        sizes = [s if s else d - o for s, d, o in zip(sizes, shape, offsets, strict=True)]  # 0 = to the end
        _check(all(o + s <= d for o, s, d in zip(offsets, sizes, shape, strict=True)), "slice out of bounds")
        _check(tuple(sizes) == out_shape, f"slice sizes {sizes} != output shape {out_shape}")
        index = tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))

        def slice_(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
            np.copyto(out, xs[0][index])
        return slice_
    if kind in ("XNNBatchMatrixMultiply", "XNNFullyConnected"):
        transpose_b = bool(node.get("flags") & 1)
        if kind == "XNNFullyConnected":
            transpose_b = not transpose_b  # the filter is [out, in] unless XNN_FLAG_TRANSPOSE_WEIGHTS
        has_bias = len(in_shapes) > 2
        a, b = in_shapes[0], in_shapes[1]
        _check(len(a) >= 1 and len(b) >= 2, "matrix multiply needs a matrix operand")
        k_b = b[-1] if transpose_b else b[-2]
        flat = kind == "XNNFullyConnected" and bool(node.get("flags") & 4)  # XNN_FLAG_TENSORFLOW_RESHAPE_2D
        _check(math.prod(a) % max(k_b, 1) == 0 if flat else a[-1] == k_b,
               f"matrix multiply inner sizes differ: {a} x {b}")
        lo, hi = node.output_min_max or (-math.inf, math.inf)

        def matmul(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
            rhs = np.swapaxes(xs[1], -1, -2) if transpose_b else xs[1]
            res = np.matmul(xs[0].reshape(-1, k_b) if flat else xs[0], rhs)
            if has_bias:
                res = res + xs[2]
            np.copyto(out, res.reshape(out.shape))
            if lo > -math.inf or hi < math.inf:
                np.clip(out, lo, hi, out=out)
        return matmul
    fn = _UNARY.get(kind)
    if fn is None:
        raise ValueError(f"no host implementation of {kind}")
    _check(in_shapes[0] == out_shape, f"{kind}: input {in_shapes[0]} and output {out_shape} shapes differ")

    def unary(xs: Sequence[np.ndarray], out: np.ndarray, fn: Any = fn) -> None:
        np.copyto(out, fn(xs[0]), casting="same_kind")
    return unary
