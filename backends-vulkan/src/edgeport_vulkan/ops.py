"""numpy-facing ops on the Vulkan device: ``run_op(name, inputs, **attrs) -> np.ndarray``.

Inputs are C-contiguous float32 arrays (at most 6 dims); everything is validated before any buffer is created,
and errors are ``ValueError``. Semantics follow ``torch.nn.functional`` / numpy broadcasting.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._launch import (
    FP16_STORAGE,
    Launch,
    check_array,
    check_dim,
    check_float,
    check_inputs,
    check_ints,
    check_numel,
    coalesce,
    contiguous_strides,
    pad6,
)
from .device import VulkanDevice
from .ops_nn import NN_OPS

__all__ = ["OPS", "run_op"]

OpFn = Callable[..., np.ndarray]
OPS: dict[str, OpFn] = {}


def run_op(name: str, inputs: Sequence[np.ndarray | None], *, force_fp16: bool = False,
           **attrs: Any) -> np.ndarray:
    """Runs op ``name`` on the Vulkan device (see ``OPS`` for the names) and returns a new float32 array.

    ``force_fp16``: keep the tensors in fp16 on the device (arithmetic stays fp32 in the shaders); inputs and
    result are still float32 arrays. Needs ``VulkanDevice.get().info.fp16_storage``.
    """
    fn = OPS.get(name)
    if fn is None:
        raise ValueError(f"unknown op {name!r}; known: {', '.join(sorted(OPS))}")
    if not isinstance(inputs, list | tuple):
        raise ValueError(f"{name}: inputs must be a list of arrays, got {type(inputs).__name__}")
    try:
        inspect.signature(fn).bind(list(inputs), **attrs)
    except TypeError as exc:
        raise ValueError(f"{name}: {exc}") from None
    if not isinstance(force_fp16, bool):
        raise ValueError(f"{name}: force_fp16 must be a bool, got {force_fp16!r}")
    if force_fp16 and not VulkanDevice.get().info.fp16_storage:
        raise ValueError(f"{name}: force_fp16 needs 16-bit storage buffers, which {VulkanDevice.get().info.name} "
                         "lacks")
    token = FP16_STORAGE.set(force_fp16)
    try:
        return fn(list(inputs), **attrs)
    finally:
        FP16_STORAGE.reset(token)


def _op(*names: str) -> Callable[[OpFn], OpFn]:
    def deco(fn: OpFn) -> OpFn:
        for n in names:
            OPS[n] = fn
        return fn
    return deco


# -- elementwise ----------------------------------------------------------------------------------------------
_BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3, "maximum": 4, "minimum": 5, "pow": 6}


def _binary(name: str) -> OpFn:
    def fn(inputs: list[Any]) -> np.ndarray:
        a, b = check_inputs(inputs, name, 2)
        a, b = check_array(a, f"{name} input 0"), check_array(b, f"{name} input 1")
        try:
            shape = np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise ValueError(f"{name}: shapes {a.shape} and {b.shape} do not broadcast") from None
        n = check_numel(shape, f"{name} output")
        if n == 0:
            return np.zeros(shape, np.float32)

        def bstrides(x: np.ndarray) -> list[int]:
            st = [0] * (len(shape) - x.ndim) + contiguous_strides(x.shape)
            dims = (1,) * (len(shape) - x.ndim) + x.shape
            return [0 if d == 1 else s for d, s in zip(dims, st)]

        cshape, (sa, sb) = coalesce(shape, bstrides(a), bstrides(b))
        with Launch() as ln:
            out = ln.alloc(n)
            ln.add("binary", [ln.upload(a), ln.upload(b), out], "19i", [n, *pad6(cshape), *pad6(sa, 0), *pad6(sb, 0)],
                   ln.groups_1d(n, 256), spec=(_BINARY[name], len(cshape)))
            return ln.run(out, shape)
    return fn


for _name in _BINARY:
    OPS[_name] = _binary(_name)


def _unary(name: str, op: int, lo: float = 0.0, hi: float = 0.0) -> OpFn:
    def fn(inputs: list[Any], **attrs: Any) -> np.ndarray:
        (x,) = check_inputs(inputs, name, 1)
        x = check_array(x, f"{name} input")
        p_lo, p_hi = lo, hi
        if name in ("clamp", "hardtanh"):
            keys = ("min", "max") if name == "clamp" else ("min_val", "max_val")
            p_lo = check_float(attrs.pop(keys[0], lo if name == "hardtanh" else -math.inf), f"{name} {keys[0]}")
            p_hi = check_float(attrs.pop(keys[1], hi if name == "hardtanh" else math.inf), f"{name} {keys[1]}")
            if p_lo > p_hi:
                raise ValueError(f"{name}: {keys[0]} ({p_lo}) > {keys[1]} ({p_hi})")
        elif name == "leaky_relu":
            p_lo = check_float(attrs.pop("negative_slope", 0.01), "leaky_relu negative_slope", allow_inf=False)
        elif name == "gelu":
            approximate = attrs.pop("approximate", "none")
            if approximate not in ("none", "tanh"):
                raise ValueError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
            op_code = 6 if approximate == "tanh" else op
        if attrs:
            raise ValueError(f"{name}: unexpected attributes {sorted(attrs)}")
        if x.size == 0:
            return np.zeros(x.shape, np.float32)
        with Launch() as ln:
            out = ln.alloc(x.size)
            code = op_code if name == "gelu" else op
            ln.add("unary", [ln.upload(x), out], "i2f", [x.size, p_lo, p_hi], ln.groups_1d(x.size, 256), spec=(code,))
            return ln.run(out, x.shape)
    return fn


for _name, _args in {
    "relu": (0,), "clamp": (1,), "relu6": (1, 0.0, 6.0), "hardtanh": (1, -1.0, 1.0), "sigmoid": (2,),
    "tanh": (3,), "hardswish": (4,), "gelu": (5,), "neg": (7,), "abs": (8,), "exp": (9,), "sqrt": (10,),
    "silu": (11,), "leaky_relu": (12,),
}.items():
    OPS[_name] = _unary(_name, *_args)


# -- matmul family --------------------------------------------------------------------------------------------
def _matmul_launch(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, batch: int, m: int, n: int, k: int,
                   batch_a: int, batch_b: int, trans_b: bool, out_shape: tuple[int, ...]) -> np.ndarray:
    check_numel(out_shape, "matmul output")
    if math.prod(out_shape) == 0:
        return np.zeros(out_shape, np.float32)
    if k == 0:  # empty reduction: zeros (+ bias)
        out = np.zeros(out_shape, np.float32)
        return out + bias if bias is not None else out
    limit = 65535 * 64
    if m > limit or n > limit or batch > 65535:
        raise ValueError(f"matmul: M={m}, N={n} (max {limit}) or batch={batch} (max 65535) too large")
    with Launch() as ln:
        out = ln.alloc(batch * m * n)
        bb = ln.upload(bias) if bias is not None else ln.dummy()
        ln.add("matmul", [ln.upload(a), ln.upload(b), bb, out], "7i",
               [m, n, k, batch_a, batch_b, int(trans_b), int(bias is not None)], (-(-n // 64), -(-m // 64), batch))
        return ln.run(out, out_shape)


@_op("matmul")
def _matmul(inputs: list[Any]) -> np.ndarray:
    """numpy.matmul semantics (1-D operands promoted, batch dims broadcast)."""
    a, b = check_inputs(inputs, "matmul", 2)
    a, b = check_array(a, "matmul input 0", (1, 6)), check_array(b, "matmul input 1", (1, 6))
    a2 = a.reshape(1, -1) if a.ndim == 1 else a
    b2 = b.reshape(-1, 1) if b.ndim == 1 else b
    (m, k), (k2, n) = a2.shape[-2:], b2.shape[-2:]
    if k != k2:
        raise ValueError(f"matmul: inner dims differ ({a.shape} @ {b.shape})")
    try:
        batch_shape = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: batch dims of {a.shape} and {b.shape} do not broadcast") from None
    batch = math.prod(batch_shape)

    def batched(x: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, int]:
        if math.prod(x.shape[:-2]) == 1:
            return x, 0
        if x.shape[:-2] == batch_shape:
            return x, rows * cols
        full = np.ascontiguousarray(np.broadcast_to(x, (*batch_shape, rows, cols)))  # mixed broadcast: host copy
        check_numel(full.shape, "matmul broadcast operand")
        return full, rows * cols

    a2, sa = batched(a2, m, k)
    b2, sb = batched(b2, k, n)
    out_shape = (*batch_shape, m, n)
    res = _matmul_launch(a2, b2, None, batch, m, n, k, sa, sb, False, out_shape)
    if a.ndim == 1:
        res = res.reshape(*batch_shape, n)
    if b.ndim == 1:
        res = res.reshape(res.shape[:-1])
    return res


@_op("bmm")
def _bmm(inputs: list[Any]) -> np.ndarray:
    a, b = check_inputs(inputs, "bmm", 2)
    a, b = check_array(a, "bmm input 0", 3), check_array(b, "bmm input 1", 3)
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"bmm: incompatible shapes {a.shape} and {b.shape}")
    (batch, m, k), n = a.shape, b.shape[2]
    return _matmul_launch(a, b, None, batch, m, n, k, m * k, k * n, False, (batch, m, n))


@_op("linear")
def _linear(inputs: list[Any]) -> np.ndarray:
    """x (..., K) @ weight (N, K)^T + bias (N,)."""
    x, w, bias = check_inputs(inputs, "linear", 2, 3)
    x, w = check_array(x, "linear input", (1, 6)), check_array(w, "linear weight", 2)
    n, k = w.shape
    if x.shape[-1] != k:
        raise ValueError(f"linear: input {x.shape} does not match weight {w.shape}")
    if bias is not None and check_array(bias, "linear bias", 1).shape != (n,):
        raise ValueError(f"linear: bias must have shape ({n},), got {bias.shape}")
    rows = math.prod(x.shape[:-1])
    return _matmul_launch(x, w, bias, 1, rows, n, k, 0, 0, True, (*x.shape[:-1], n))


# -- reductions over the last dim(s) ----------------------------------------------------------------------------
def _trailing(dim: Any, ndim: int, name: str) -> int:
    """Number of trailing dims named by ``dim`` (int or sequence; must be the last k dims)."""
    dims = [dim] if isinstance(dim, int | np.integer) and not isinstance(dim, bool) else dim
    if not isinstance(dims, Sequence) or isinstance(dims, str) or not dims:
        raise ValueError(f"{name}: dim must be an int or a non-empty sequence of ints, got {dim!r}")
    norm = sorted({check_dim(d, ndim, f"{name} dim") for d in dims})
    if len(norm) != len(dims) or norm != list(range(ndim - len(norm), ndim)):
        raise ValueError(f"{name}: only the last dim(s) can be reduced, got dim={dim!r} for {ndim} dims")
    return len(norm)


def _rows(x: np.ndarray, k: int, name: str) -> tuple[int, int]:
    length = math.prod(x.shape[x.ndim - k:])
    if length == 0:
        raise ValueError(f"{name}: cannot reduce over an empty dim (shape {x.shape})")
    return math.prod(x.shape[:x.ndim - k]), length


def _row_launch(shader: str, x: np.ndarray, rows: int, out_numel: int, out_shape: Sequence[int], fmt: str,
                values: list[int | float], extra: list[np.ndarray | None] | None = None) -> np.ndarray:
    if rows == 0:
        return np.zeros(out_shape, np.float32)
    with Launch() as ln:
        out = ln.alloc(out_numel)
        bufs = [ln.upload(x)] + [ln.upload(e) if e is not None else ln.dummy() for e in extra or []] + [out]
        ln.add(shader, bufs, fmt, values, (min(rows, 65535), 1, 1))
        return ln.run(out, out_shape)


@_op("mean")
def _mean(inputs: list[Any], dim: Any = -1, keepdim: bool = False) -> np.ndarray:
    (x,) = check_inputs(inputs, "mean", 1)
    x = check_array(x, "mean input", (1, 6))
    k = _trailing(dim, x.ndim, "mean")
    rows, length = _rows(x, k, "mean")
    shape = x.shape[:x.ndim - k] + ((1,) * k if keepdim else ())
    return _row_launch("mean", x, rows, rows, shape, "2i", [rows, length])


@_op("global_avg_pool2d", "adaptive_avg_pool2d")
def _global_avg_pool(inputs: list[Any], output_size: Any = 1) -> np.ndarray:
    (x,) = check_inputs(inputs, "global_avg_pool2d", 1)
    x = check_array(x, "global_avg_pool2d input", (3, 4))
    if check_ints(output_size, 2, "output_size") != (1, 1):
        raise ValueError(f"adaptive_avg_pool2d: only output_size 1 is supported, got {output_size!r}")
    rows, length = _rows(x, 2, "global_avg_pool2d")
    return _row_launch("mean", x, rows, rows, x.shape[:-2] + (1, 1), "2i", [rows, length])


def _softmax(log: bool) -> OpFn:
    name = "log_softmax" if log else "softmax"

    def fn(inputs: list[Any], dim: Any = -1) -> np.ndarray:
        (x,) = check_inputs(inputs, name, 1)
        x = check_array(x, f"{name} input", (1, 6))
        if check_dim(dim, x.ndim, f"{name} dim") != x.ndim - 1:
            raise ValueError(f"{name}: only the last dim is supported, got dim={dim}")
        rows, length = _rows(x, 1, name)
        return _row_launch("softmax", x, rows, x.size, x.shape, "3i", [rows, length, int(log)])
    return fn


OPS["softmax"] = _softmax(False)
OPS["log_softmax"] = _softmax(True)


@_op("layer_norm")
def _layer_norm(inputs: list[Any], normalized_shape: Any = None, eps: float = 1e-5) -> np.ndarray:
    """inputs [x] / [x, weight] / [x, weight, bias] (weight may be None); normalizes the trailing dims."""
    x, w, b = check_inputs(inputs, "layer_norm", 1, 3)
    x = check_array(x, "layer_norm input", (1, 6))
    norm = tuple(x.shape[-1:]) if normalized_shape is None else (
        check_ints(normalized_shape, 1, "normalized_shape", 1) if isinstance(normalized_shape, int | np.integer)
        else check_ints(normalized_shape, len(normalized_shape), "normalized_shape", 1)
        if isinstance(normalized_shape, Sequence) else None)
    if not norm or len(norm) > x.ndim or tuple(x.shape[x.ndim - len(norm):]) != norm:
        raise ValueError(f"layer_norm: normalized_shape {normalized_shape!r} does not end input shape {x.shape}")
    for t, what in ((w, "weight"), (b, "bias")):
        if t is not None and check_array(t, f"layer_norm {what}").shape != norm:
            raise ValueError(f"layer_norm: {what} must have shape {norm}, got {t.shape}")
    eps = check_float(eps, "layer_norm eps", allow_inf=False)
    if eps < 0:
        raise ValueError(f"layer_norm: eps must be >= 0, got {eps}")
    rows, length = _rows(x, len(norm), "layer_norm")
    return _row_launch("layer_norm", x, rows, x.size, x.shape, "2if2i",
                       [rows, length, eps, int(w is not None), int(b is not None)], [w, b])


OPS.update(NN_OPS)
