"""Validation and planning of a ``VkGraph`` (torch-free, no GPU): every operator becomes shader dispatches.

:func:`plan_graph` checks the whole graph -- value kinds, tensor ids, dims, constant ranges, that each tensor is
written exactly once before it is read, operator names, argument kinds and every shape -- and returns a
:class:`Plan` naming buffers by tensor id. Nothing here touches the device; the executor allocates and records
the plan only once it is known to be valid. Every problem is a ``ProgramError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeport.errors import ProgramError

from ._launch import coalesce, contiguous_strides, pad6
from .schema import (
    NAMED_DATA_OFFSET,
    Bool,
    Double,
    Int,
    IntList,
    Null,
    String,
    ValueList,
    VkDataType,
    VkGraph,
    VkTensor,
)

MAX_DIMS = 6
MAX_NUMEL = (2**31 - 1) // 4
MAX_GROUPS = 65535
_F32_MAX = float(np.finfo(np.float32).max)


@dataclass
class Dispatch:
    shader: str
    tensors: list[int]  # tensor ids (or synthetic constants' ids) bound in order
    fmt: str
    values: list[int | float]
    groups: tuple[int, int, int]
    spec: tuple[int, ...] = ()
    node_id: int = -1  # the OperatorCall's node_id (the delegate debug id of its edge node)


@dataclass
class Plan:
    dims: dict[int, tuple[int, ...]]  # every float tensor the plan touches
    storage: dict[int, int]  # tensor id -> id of the tensor owning its buffer (views alias)
    constants: dict[int, np.ndarray]  # owning id -> float32 data (weights and synthetic scalars)
    inputs: list[int]
    outputs: list[int]
    dispatches: list[Dispatch]
    op_counts: dict[str, int] = field(default_factory=dict)
    fp16: bool = False  # FLOAT16 tensors (storage); the runtime still exchanges float32 arrays


def _groups(n: int, local: int) -> tuple[int, int, int]:
    return (max(1, min(-(-n // local), MAX_GROUPS)), 1, 1)


class _Ctx:
    def __init__(self, graph: VkGraph, constant_data: Callable[[int, int], np.ndarray], where: str) -> None:
        self.g = graph
        self.where = where
        self.values = graph.values
        self.constant_data = constant_data
        self.defined: set[int] = set()
        self.plan = Plan({}, {}, {}, [], [], [])
        self._next_synthetic = -1
        self.op = ""
        self.node_id = -1
        self.unused: set[int] = set()
        self.float_type: int | None = None  # FLOAT32, or FLOAT16 for graphs lowered with force_fp16  # declared auxiliary outputs the shaders never compute

    # -- errors and values ----------------------------------------------------------------------------------
    def fail(self, msg: str) -> ProgramError:
        return ProgramError(f"{self.where}: {self.op + ': ' if self.op else ''}{msg}")

    def value(self, vid: Any) -> Any:
        if not isinstance(vid, int) or not 0 <= vid < len(self.values):
            raise self.fail(f"value id {vid!r} is outside the graph's {len(self.values)} values")
        return self.values[vid].value

    def tensor_decl(self, vid: int) -> VkTensor:
        v = self.value(vid)
        if not isinstance(v, VkTensor):
            raise self.fail(f"value {vid} is a {type(v).__name__}, expected a tensor")
        return v

    def float_dims(self, vid: int, t: VkTensor) -> tuple[int, ...]:
        if t.datatype in (VkDataType.FLOAT32, VkDataType.FLOAT16):
            if self.float_type is None:
                self.float_type = int(t.datatype)
            elif self.float_type != t.datatype:
                raise self.fail(f"tensor {vid} is {_dtype_name(t.datatype)} while others are "
                                f"{_dtype_name(self.float_type)}: a graph is all FLOAT32 or all FLOAT16 (force_fp16)")
        else:
            raise self.fail(f"tensor {vid} has datatype {_dtype_name(t.datatype)}; only FLOAT32 / FLOAT16 tensors are "
                            "computed")
        dims = tuple(int(d) for d in t.dims)
        if len(dims) > MAX_DIMS:
            raise self.fail(f"tensor {vid} has {len(dims)} dims (max {MAX_DIMS})")
        n = math.prod(dims)
        if n == 0 or n > MAX_NUMEL:
            raise self.fail(f"tensor {vid} has {n} elements (1..{MAX_NUMEL} supported)")
        return dims

    def tensor(self, vid: int, what: str = "input") -> tuple[int, ...]:
        """Dims of a tensor read by the current operator (it must be defined already)."""
        t = self.tensor_decl(vid)
        dims = self.float_dims(vid, t)
        if vid not in self.defined:
            raise self.fail(f"{what} tensor {vid} is read before any operator writes it")
        return dims

    def out(self, vid: int, expected: tuple[int, ...] | None = None) -> tuple[int, ...]:
        t = self.tensor_decl(vid)
        dims = self.float_dims(vid, t)
        if vid in self.defined:
            raise self.fail(f"output tensor {vid} is written twice (or is an input / constant)")
        if expected is not None and tuple(expected) != dims:
            raise self.fail(f"output tensor {vid} is declared {list(dims)}, the operator produces {list(expected)}")
        self.defined.add(vid)
        self.plan.dims[vid] = dims
        self.plan.storage[vid] = vid
        return dims

    def is_null(self, vid: int) -> bool:
        return isinstance(self.value(vid), Null)

    def int_(self, vid: int, what: str) -> int:
        v = self.value(vid)
        if isinstance(v, Int):
            return int(v.int_val)
        if isinstance(v, Bool):
            return int(v.bool_val)
        raise self.fail(f"{what} (value {vid}) is a {type(v).__name__}, expected an Int")

    def num(self, vid: int, what: str) -> float:
        v = self.value(vid)
        if isinstance(v, Double):
            f = float(v.double_val)
        elif isinstance(v, Int):
            f = float(v.int_val)
        else:
            raise self.fail(f"{what} (value {vid}) is a {type(v).__name__}, expected a number")
        if math.isnan(f):
            raise self.fail(f"{what} is NaN")
        return f

    def flag(self, vid: int, what: str) -> bool:
        v = self.value(vid)
        if isinstance(v, Bool):
            return bool(v.bool_val)
        if isinstance(v, Int) and v.int_val in (0, 1):
            return bool(v.int_val)
        raise self.fail(f"{what} (value {vid}) is a {type(v).__name__}, expected a Bool")

    def ints(self, vid: int, what: str, n: int | None = None) -> list[int]:
        v = self.value(vid)
        if isinstance(v, Int):
            items = [int(v.int_val)] * (n or 1)
        elif isinstance(v, IntList):
            items = [int(x) for x in v.items]
        else:
            raise self.fail(f"{what} (value {vid}) is a {type(v).__name__}, expected an IntList")
        if n is not None and len(items) == 1 and n > 1:
            items = items * n
        if n is not None and len(items) != n:
            raise self.fail(f"{what} has {len(items)} items, expected {n}")
        if any(abs(x) > 2**30 for x in items):
            raise self.fail(f"{what} {items} has out-of-range items")
        return items

    def string(self, vid: int, what: str) -> str | None:
        v = self.value(vid)
        if isinstance(v, Null):
            return None
        if isinstance(v, String):
            return v.string_val
        raise self.fail(f"{what} (value {vid}) is a {type(v).__name__}, expected a String")

    def dim(self, d: int, rank: int, what: str = "dim") -> int:
        r = max(rank, 1)
        if not -r <= d < r:
            raise self.fail(f"{what} {d} is out of range for rank {rank}")
        return d % r

    def synthetic(self, data: np.ndarray) -> int:
        vid = self._next_synthetic
        self._next_synthetic -= 1
        arr = np.ascontiguousarray(data, dtype=np.float32).reshape(-1)
        self.plan.dims[vid] = (arr.size,)
        self.plan.storage[vid] = vid
        self.plan.constants[vid] = arr
        return vid

    def dummy(self) -> int:
        return self.synthetic(np.zeros(1, np.float32))

    def dispatch(self, shader: str, tensors: list[int], fmt: str, values: list[int | float],
                 groups: tuple[int, int, int], spec: tuple[int, ...] = ()) -> None:
        # float push constants are fp32: a double beyond its range (ExecuTorch writes DBL_MAX for "no clamp")
        # becomes an infinity of the same sign
        values = [math.copysign(math.inf, v) if isinstance(v, float) and abs(v) > _F32_MAX else v for v in values]
        self.plan.dispatches.append(Dispatch(shader, tensors, fmt, values, groups, spec, self.node_id))

    def alias(self, out: int, src: int) -> None:
        src_dims = self.plan.dims[src]
        dims = self.out(out)
        if math.prod(dims) != math.prod(src_dims):
            raise self.fail(f"view of {list(src_dims)} as {list(dims)} changes the element count")
        self.plan.storage[out] = self.plan.storage[src]

    def coalesce(self, shape: Any, *strides: Any) -> tuple[list[int], list[list[int]]]:
        try:
            return coalesce(shape, *strides)
        except ValueError as exc:
            raise self.fail(str(exc)) from None


def _dtype_name(v: int) -> str:
    try:
        return VkDataType(v).name
    except ValueError:
        return str(v)


def _nargs(ctx: _Ctx, args: list[int], lo: int, hi: int | None = None) -> None:
    hi = lo if hi is None else hi
    if not lo <= len(args) <= hi:
        raise ctx.fail(f"{len(args)} argument ids, expected {lo}..{hi} (inputs then output)")


# -- elementwise ------------------------------------------------------------------------------------------------
_BINARY = {"aten.add.Tensor": 0, "aten.sub.Tensor": 1, "aten.mul.Tensor": 2, "aten.div.Tensor": 3,
           "aten.add.Scalar": 0, "aten.sub.Scalar": 1, "aten.mul.Scalar": 2, "aten.div.Scalar": 3,
           "aten.maximum.default": 4, "aten.minimum.default": 5}


def _operand(ctx: _Ctx, vid: int) -> int:
    v = ctx.value(vid)
    if isinstance(v, VkTensor):
        ctx.tensor(vid)
        return vid
    return ctx.synthetic(np.array([ctx.num(vid, "scalar operand")], np.float32))


def _binary(ctx: _Ctx, args: list[int]) -> None:
    has_alpha = ctx.op.startswith(("aten.add.", "aten.sub."))
    _nargs(ctx, args, 3, 4 if has_alpha else 3)
    if has_alpha and len(args) == 4 and not ctx.is_null(args[2]) and ctx.num(args[2], "alpha") != 1:
        raise ctx.fail("alpha != 1 is not supported")
    a, b = _operand(ctx, args[0]), _operand(ctx, args[1])
    da, db = ctx.plan.dims[a], ctx.plan.dims[b]
    if a < 0:
        da = ()
    if b < 0:
        db = ()
    try:
        shape = np.broadcast_shapes(da, db)
    except ValueError:
        raise ctx.fail(f"shapes {list(da)} and {list(db)} do not broadcast") from None
    ctx.out(args[-1], tuple(shape))
    n = math.prod(shape)

    def bstrides(dims: tuple[int, ...]) -> list[int]:
        st = [0] * (len(shape) - len(dims)) + contiguous_strides(dims)
        full = (1,) * (len(shape) - len(dims)) + tuple(dims)
        return [0 if d == 1 else s for d, s in zip(full, st)]

    cshape, (sa, sb) = ctx.coalesce(shape, bstrides(da), bstrides(db))
    ctx.dispatch("binary", [a, b, args[-1]], "19i", [n, *pad6(cshape), *pad6(sa, 0), *pad6(sb, 0)],
                 _groups(n, 256), (_BINARY[ctx.op], len(cshape)))


_UNARY = {"aten.relu.default": 0, "aten.hardtanh.default": 1, "aten.clamp.default": 1, "aten.sigmoid.default": 2,
          "aten.tanh.default": 3, "aten.hardswish.default": 4, "aten.gelu.default": 5, "aten.neg.default": 7,
          "aten.abs.default": 8, "aten.exp.default": 9, "aten.sqrt.default": 10, "aten.silu.default": 11,
          "aten.leaky_relu.default": 12}


def _unary(ctx: _Ctx, args: list[int]) -> None:
    name = ctx.op
    code, lo, hi = _UNARY[name], 0.0, 0.0
    if name == "aten.hardtanh.default":
        _nargs(ctx, args, 2, 4)
        lo = ctx.num(args[1], "min_val") if len(args) > 2 else -1.0
        hi = ctx.num(args[2], "max_val") if len(args) > 3 else 1.0
    elif name == "aten.clamp.default":
        _nargs(ctx, args, 2, 4)
        lo = -math.inf if len(args) < 3 or ctx.is_null(args[1]) else ctx.num(args[1], "min")
        hi = math.inf if len(args) < 4 or ctx.is_null(args[2]) else ctx.num(args[2], "max")
    elif name == "aten.gelu.default":
        _nargs(ctx, args, 2, 3)
        approximate = ctx.string(args[1], "approximate") if len(args) == 3 else "none"
        if approximate not in (None, "none", "tanh"):
            raise ctx.fail(f"unknown approximation {approximate!r}")
        code = 6 if approximate == "tanh" else 5
    elif name == "aten.leaky_relu.default":
        _nargs(ctx, args, 2, 3)
        lo = ctx.num(args[1], "negative_slope") if len(args) == 3 else 0.01
        if math.isinf(lo):
            raise ctx.fail("negative_slope must be finite")
    else:
        _nargs(ctx, args, 2)
    if lo > hi and name != "aten.leaky_relu.default":
        raise ctx.fail(f"min {lo} > max {hi}")
    dims = ctx.tensor(args[0])
    ctx.out(args[-1], dims)
    n = math.prod(dims)
    ctx.dispatch("unary", [args[0], args[-1]], "i2f", [n, lo, hi], _groups(n, 256), (code,))


# -- matmul family ------------------------------------------------------------------------------------------------
def _matmul(ctx: _Ctx, a: int, b: int, bias: int | None, batch: int, m: int, n: int, k: int, sa: int, sb: int,
            trans_b: bool, out: int, out_shape: tuple[int, ...]) -> None:
    ctx.out(out, out_shape)
    if m > MAX_GROUPS * 64 or n > MAX_GROUPS * 64 or batch > MAX_GROUPS:
        raise ctx.fail(f"M={m}, N={n} or batch={batch} too large")
    ctx.dispatch("matmul", [a, b, bias if bias is not None else ctx.dummy(), out], "7i",
                 [m, n, k, sa, sb, int(trans_b), int(bias is not None)], (-(-n // 64), -(-m // 64), batch))


def _bias(ctx: _Ctx, vid: int, n: int) -> int | None:
    if ctx.is_null(vid):
        return None
    dims = ctx.tensor(vid, "bias")
    if math.prod(dims) != n or (dims and dims[-1] != n):
        raise ctx.fail(f"bias of shape {list(dims)} does not match {n} output features")
    return vid


def _linear(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 3, 4)
    x, w = ctx.tensor(args[0]), ctx.tensor(args[1], "weight")
    if len(w) != 2 or not x or x[-1] != w[1]:
        raise ctx.fail(f"input {list(x)} does not match weight {list(w)}")
    n, k = w
    bias = _bias(ctx, args[2], n) if len(args) == 4 else None
    rows = math.prod(x[:-1])
    _matmul(ctx, args[0], args[1], bias, 1, rows, n, k, 0, 0, True, args[-1], (*x[:-1], n))


def _mm(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 3)
    a, b = ctx.tensor(args[0]), ctx.tensor(args[1])
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        raise ctx.fail(f"mm of {list(a)} and {list(b)}")
    _matmul(ctx, args[0], args[1], None, 1, a[0], b[1], a[1], 0, 0, False, args[-1], (a[0], b[1]))


def _addmm(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 4, 6)
    for i, what in ((3, "beta"), (4, "alpha")):
        if len(args) > i + 1 and ctx.num(args[i], what) != 1:
            raise ctx.fail(f"{what} != 1 is not supported")
    a, b = ctx.tensor(args[1]), ctx.tensor(args[2])
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        raise ctx.fail(f"addmm of {list(a)} and {list(b)}")
    bias = _bias(ctx, args[0], b[1])
    _matmul(ctx, args[1], args[2], bias, 1, a[0], b[1], a[1], 0, 0, False, args[-1], (a[0], b[1]))


def _bmm(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 3)
    a, b = ctx.tensor(args[0]), ctx.tensor(args[1])
    if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[2] != b[1]:
        raise ctx.fail(f"bmm of {list(a)} and {list(b)}")
    (batch, m, k), n = a, b[2]
    _matmul(ctx, args[0], args[1], None, batch, m, n, k, m * k, k * n, False, args[-1], (batch, m, n))


# -- convolution and pooling --------------------------------------------------------------------------------------
def _conv(ctx: _Ctx, args: list[int]) -> None:
    clamp = ctx.op == "et_vk.conv_with_clamp.default"
    _nargs(ctx, args, 12 if clamp else 10)
    x, w = ctx.tensor(args[0]), ctx.tensor(args[1], "weight")
    if len(x) not in (3, 4) or len(w) != 4:
        raise ctx.fail(f"only 2-D convolution: input {list(x)}, weight {list(w)}")
    if ctx.flag(args[6], "transposed"):
        raise ctx.fail("transposed convolution is not supported")
    if any(ctx.ints(args[7], "output_padding")):
        raise ctx.fail("output_padding is not supported")
    n, c, h, wd = (1, *x) if len(x) == 3 else x
    oc, cpg, kh, kw = w
    g = ctx.int_(args[8], "groups")
    sh, sw = ctx.ints(args[3], "stride", 2)
    ph, pw = ctx.ints(args[4], "padding", 2)
    dh, dw = ctx.ints(args[5], "dilation", 2)
    if g < 1 or c % g or oc % g or cpg != c // g or min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ctx.fail(f"input {list(x)}, weight {list(w)}, groups {g}, stride/dilation/padding are inconsistent")
    lo, hi = -math.inf, math.inf
    if clamp:
        lo = -math.inf if ctx.is_null(args[9]) else ctx.num(args[9], "output_min")
        hi = math.inf if ctx.is_null(args[10]) else ctx.num(args[10], "output_max")
    bias = _bias(ctx, args[2], oc)
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise ctx.fail(f"empty output ({oh}x{ow})")
    shape = (n, oc, oh, ow)
    ctx.out(args[-1], shape[1:] if len(x) == 3 else shape)
    total = math.prod(shape)
    ocb = next(bb for bb in (8, 4, 2, 1) if (oc // g) % bb == 0)
    ctx.dispatch("conv2d", [args[0], args[1], bias if bias is not None else ctx.dummy(), args[-1]], "17i2f",
                 [n, c, h, wd, oc, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, g, int(bias is not None), lo, hi],
                 _groups(total // ocb, 64), (ocb,))


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    num = size + 2 * p - d * (k - 1) - 1
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool(ctx: _Ctx, args: list[int]) -> None:
    is_max = ctx.op.startswith("aten.max_pool2d")
    _nargs(ctx, args, 7 if is_max else 8)
    x = ctx.tensor(args[0])
    if len(x) not in (3, 4):
        raise ctx.fail(f"input {list(x)} is not 3-D or 4-D")
    n, c, h, w = (1, *x) if len(x) == 3 else x
    kh, kw = ctx.ints(args[1], "kernel_size", 2)
    stride = ctx.value(args[2])
    sh, sw = (kh, kw) if isinstance(stride, Null) or (isinstance(stride, IntList) and not stride.items) \
        else ctx.ints(args[2], "stride", 2)
    ph, pw = ctx.ints(args[3], "padding", 2)
    if is_max:
        dh, dw = ctx.ints(args[4], "dilation", 2)
        ceil_mode, include_pad, div = ctx.flag(args[5], "ceil_mode"), True, 0
    else:
        dh = dw = 1
        ceil_mode = ctx.flag(args[4], "ceil_mode")
        include_pad = ctx.flag(args[5], "count_include_pad")
        div = 0 if ctx.is_null(args[6]) else ctx.int_(args[6], "divisor_override")
        if div < 0:
            raise ctx.fail("divisor_override < 0")
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0 or 2 * ph > dh * (kh - 1) + 1 or 2 * pw > dw * (kw - 1) + 1:
        raise ctx.fail("invalid kernel_size / stride / padding / dilation")
    oh, ow = _pool_out(h, kh, sh, ph, dh, ceil_mode), _pool_out(w, kw, sw, pw, dw, ceil_mode)
    if oh <= 0 or ow <= 0:
        raise ctx.fail(f"empty output ({oh}x{ow})")
    shape = (n, c, oh, ow) if len(x) == 4 else (c, oh, ow)
    out = args[-1]
    if ctx.op == "aten.max_pool2d_with_indices.default":
        outs = ctx.value(out)
        if not isinstance(outs, ValueList) or len(outs.items) != 2:
            raise ctx.fail("output must be a ValueList of (values, indices)")
        out = outs.items[0]
        indices = ctx.tensor_decl(outs.items[1])
        if tuple(indices.dims) != shape:
            raise ctx.fail("indices tensor has the wrong shape")
        ctx.unused.add(outs.items[1])
    ctx.out(out, shape)
    total = n * c * oh * ow
    ctx.dispatch("pool2d", [args[0], out], "15i",
                 [n * c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, int(include_pad), div],
                 _groups(total, 64), (0 if is_max else 1,))


# -- row reductions -----------------------------------------------------------------------------------------------
def _mean(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 4, 5)
    x = ctx.tensor(args[0])
    if len(args) == 5 and not ctx.is_null(args[3]):
        raise ctx.fail("the dtype argument is not supported")
    dims = list(range(len(x))) if ctx.is_null(args[1]) else ctx.ints(args[1], "dim")
    norm = sorted({ctx.dim(d, len(x)) for d in dims})
    if len(norm) != len(dims) or norm != list(range(len(x) - len(norm), len(x))):
        raise ctx.fail(f"only the trailing dims can be reduced, got {dims} of rank {len(x)}")
    keep = ctx.flag(args[2], "keepdim")
    k = len(norm)
    rows, length = math.prod(x[:len(x) - k]), math.prod(x[len(x) - k:])
    ctx.out(args[-1], tuple(x[:len(x) - k]) + ((1,) * k if keep else ()))
    ctx.dispatch("mean", [args[0], args[-1]], "2i", [rows, length], (min(rows, MAX_GROUPS), 1, 1))


def _softmax(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 4)
    x = ctx.tensor(args[0])
    if ctx.dim(ctx.int_(args[1], "dim"), len(x)) != max(len(x), 1) - 1:
        raise ctx.fail("softmax over a dim other than the last")
    if ctx.flag(args[2], "half_to_float"):
        raise ctx.fail("half_to_float is not supported")
    ctx.out(args[-1], x)
    length = x[-1] if x else 1
    rows = math.prod(x) // length
    log = int(ctx.op == "aten._log_softmax.default")
    ctx.dispatch("softmax", [args[0], args[-1]], "3i", [rows, length, log], (min(rows, MAX_GROUPS), 1, 1))


def _adaptive_avg_pool(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 3)
    x = ctx.tensor(args[0])
    if len(x) not in (3, 4) or ctx.ints(args[1], "output_size", 2) != [1, 1]:
        raise ctx.fail("only output_size 1x1 of a 3-D or 4-D input")
    rows, length = math.prod(x[:-2]), x[-2] * x[-1]
    ctx.out(args[-1], (*x[:-2], 1, 1))
    ctx.dispatch("mean", [args[0], args[-1]], "2i", [rows, length], (min(rows, MAX_GROUPS), 1, 1))


def _layer_norm(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 6)
    x = ctx.tensor(args[0])
    norm = tuple(ctx.ints(args[1], "normalized_shape"))
    if not norm or len(norm) > len(x) or tuple(x[len(x) - len(norm):]) != norm:
        raise ctx.fail(f"normalized_shape {list(norm)} does not end input shape {list(x)}")
    wb = []
    for vid, what in ((args[2], "weight"), (args[3], "bias")):
        if ctx.is_null(vid):
            wb.append(None)
            continue
        if ctx.tensor(vid, what) != norm:
            raise ctx.fail(f"{what} must have shape {list(norm)}")
        wb.append(vid)
    eps = ctx.num(args[4], "eps")
    if not 0 <= eps < math.inf:
        raise ctx.fail(f"eps {eps}")
    outs = ctx.value(args[-1])
    if not isinstance(outs, ValueList) or len(outs.items) != 3:
        raise ctx.fail("output must be a ValueList of (out, mean, rstd)")
    out = outs.items[0]
    ctx.unused.update(outs.items[1:])
    ctx.out(out, x)
    length = math.prod(norm)
    rows = math.prod(x) // length
    ctx.dispatch("layer_norm", [args[0], wb[0] if wb[0] is not None else ctx.dummy(),
                                wb[1] if wb[1] is not None else ctx.dummy(), out], "2if2i",
                 [rows, length, eps, int(wb[0] is not None), int(wb[1] is not None)], (min(rows, MAX_GROUPS), 1, 1))


def _batch_norm(ctx: _Ctx, args: list[int]) -> None:
    """``_native_batch_norm_legit_no_training`` with constant statistics: folded here, at load, into a per-channel
    scale and shift (two elementwise dispatches, the second in place)."""
    _nargs(ctx, args, 8)
    x = ctx.tensor(args[0])
    if len(x) < 2:
        raise ctx.fail(f"batch norm of a {len(x)}-D input")
    channels = x[1]

    def stat(vid: int, what: str, default: float) -> np.ndarray:
        if ctx.is_null(vid):
            return np.full(channels, default)
        ctx.tensor(vid, what)
        arr = ctx.plan.constants.get(vid)
        if arr is None or arr.size != channels:
            raise ctx.fail(f"{what} must be a constant of {channels} values")
        return arr.astype(np.float64)

    weight, bias = stat(args[1], "weight", 1.0), stat(args[2], "bias", 0.0)
    mean, var = stat(args[3], "running_mean", 0.0), stat(args[4], "running_var", 1.0)
    eps = ctx.num(args[6], "eps")
    if not 0 <= eps < math.inf or np.any(var + eps <= 0):
        raise ctx.fail(f"eps {eps} and running_var give a non-positive variance")
    scale = weight / np.sqrt(var + eps)
    shift = bias - mean * scale
    outs = ctx.value(args[-1])
    if not isinstance(outs, ValueList) or len(outs.items) != 3:
        raise ctx.fail("output must be a ValueList of (out, save_mean, save_invstd)")
    out = outs.items[0]
    ctx.unused.update(outs.items[1:])
    ctx.out(out, x)
    n = math.prod(x)
    per_channel = [0, 1] + [0] * (len(x) - 2)  # the stride of a (C,)-vector broadcast over x
    cshape, (sx, sc) = ctx.coalesce(x, contiguous_strides(x), per_channel)
    for code, operand, src in ((_BINARY["aten.mul.Tensor"], scale, args[0]), (_BINARY["aten.add.Tensor"], shift, out)):
        vid = ctx.synthetic(operand)
        ctx.dispatch("binary", [src, vid, out], "19i", [n, *pad6(cshape), *pad6(sx, 0), *pad6(sc, 0)],
                     _groups(n, 256), (code, len(cshape)))


# -- data movement ------------------------------------------------------------------------------------------------
def _view(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 2, 3)
    ctx.tensor(args[0])
    ctx.alias(args[-1], args[0])


def _permute(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 3)
    x = ctx.tensor(args[0])
    perm = [ctx.dim(d, len(x)) for d in ctx.ints(args[1], "dims")]
    if sorted(perm) != list(range(len(x))):
        raise ctx.fail(f"{perm} is not a permutation of {len(x)} dims")
    shape = tuple(x[d] for d in perm)
    ctx.out(args[-1], shape)
    src = contiguous_strides(x)
    cshape, (sst, _) = ctx.coalesce(shape, [src[d] for d in perm], contiguous_strides(shape))
    n = math.prod(x)
    ctx.dispatch("permute", [args[0], args[-1]], "14i", [n, len(cshape), *pad6(cshape), *pad6(sst, 0)],
                 _groups(n, 256))


def _copy(ctx: _Ctx, src: int, dst: int, shape: Any, src_off: int, src_str: Any, dst_off: int, dst_str: Any) -> None:
    n = math.prod(shape)
    if n == 0:
        return
    cshape, (ss, ds) = ctx.coalesce(shape, src_str, dst_str)
    ctx.dispatch("copy", [src, dst], "22i", [n, len(cshape), src_off, dst_off, *pad6(cshape), *pad6(ss, 0),
                                             *pad6(ds, 0)], _groups(n, 256))


def _select(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 4)
    x = ctx.tensor(args[0])
    if not x:
        raise ctx.fail("select on a 0-dim tensor")
    d = ctx.dim(ctx.int_(args[1], "dim"), len(x))
    index = ctx.int_(args[2], "index")
    if not -x[d] <= index < x[d]:
        raise ctx.fail(f"index {index} is out of range for size {x[d]}")
    index %= x[d]
    shape = x[:d] + x[d + 1:]
    ctx.out(args[-1], shape)
    st = contiguous_strides(x)
    _copy(ctx, args[0], args[-1], shape or (1,), index * st[d], (st[:d] + st[d + 1:]) or [1], 0,
          contiguous_strides(shape) or [1])


def _expand(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 3, 4)
    x = ctx.tensor(args[0])
    size = ctx.ints(args[1], "size")
    if len(size) < len(x):
        raise ctx.fail(f"size {size} has fewer dims than the input {list(x)}")
    lead = len(size) - len(x)
    full = (1,) * lead + tuple(x)
    shape = tuple(f if s == -1 else s for s, f in zip(size, full))
    if any(s < 1 or (f != 1 and f != s) for s, f in zip(shape, full)):
        raise ctx.fail(f"cannot expand {list(x)} to {size}")
    ctx.out(args[-1], shape)
    st = [0] * lead + contiguous_strides(x)
    _copy(ctx, args[0], args[-1], shape, 0, [0 if f == 1 else s for f, s in zip(full, st)], 0,
          contiguous_strides(shape))


def _split(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 4)
    x = ctx.tensor(args[0])
    sizes = ctx.ints(args[1], "split_sizes")
    d = ctx.dim(ctx.int_(args[2], "dim"), len(x))
    outs = ctx.value(args[-1])
    if not x or not isinstance(outs, ValueList) or len(outs.items) != len(sizes):
        raise ctx.fail("outputs must be a ValueList with one tensor per split size")
    if any(s < 0 for s in sizes) or sum(sizes) != x[d]:
        raise ctx.fail(f"split sizes {sizes} do not add up to dim {d} of {list(x)}")
    st = contiguous_strides(x)
    offset = 0
    for vid, size in zip(outs.items, sizes, strict=True):
        shape = (*x[:d], size, *x[d + 1:])
        ctx.out(vid, shape)
        _copy(ctx, args[0], vid, shape, offset * st[d], st, 0, contiguous_strides(shape))
        offset += size


def _cat(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 3)
    lst = ctx.value(args[0])
    if not isinstance(lst, ValueList) or not lst.items:
        raise ctx.fail("tensors must be a non-empty ValueList")
    xs = [(vid, ctx.tensor(vid)) for vid in lst.items]
    rank = len(xs[0][1])
    d = ctx.dim(ctx.int_(args[1], "dim"), rank)
    for vid, s in xs:
        if len(s) != rank or s[:d] + s[d + 1:] != xs[0][1][:d] + xs[0][1][d + 1:]:
            raise ctx.fail(f"input {vid} shape {list(s)} does not match {list(xs[0][1])} outside dim {d}")
    shape = (*xs[0][1][:d], sum(s[d] for _, s in xs), *xs[0][1][d + 1:])
    ctx.out(args[-1], shape)
    ostr = contiguous_strides(shape)
    offset = 0
    for vid, s in xs:
        _copy(ctx, vid, args[-1], s, 0, contiguous_strides(s), offset * ostr[d], ostr)
        offset += s[d]


def _slice(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 6)
    x = ctx.tensor(args[0])
    d = ctx.dim(ctx.int_(args[1], "dim"), len(x))
    start = None if ctx.is_null(args[2]) else ctx.int_(args[2], "start")
    end = None if ctx.is_null(args[3]) else ctx.int_(args[3], "end")
    step = ctx.int_(args[4], "step")
    if step < 1:
        raise ctx.fail(f"step {step}")
    lo, hi, _ = slice(start, end, step).indices(x[d])
    length = max(0, -(-(hi - lo) // step))
    shape = (*x[:d], length, *x[d + 1:])
    ctx.out(args[-1], shape)
    st = contiguous_strides(x)
    _copy(ctx, args[0], args[-1], shape, lo * st[d], [s * step if i == d else s for i, s in enumerate(st)], 0,
          contiguous_strides(shape))


def _pad(ctx: _Ctx, args: list[int]) -> None:
    _nargs(ctx, args, 4)
    x = ctx.tensor(args[0])
    pads = ctx.ints(args[1], "pad")
    value = ctx.num(args[2], "value")
    if len(pads) % 2 or len(pads) // 2 > len(x) or any(p < 0 for p in pads):
        raise ctx.fail(f"pad {pads}")
    before, after = [0] * len(x), [0] * len(x)
    for i in range(len(pads) // 2):
        before[len(x) - 1 - i], after[len(x) - 1 - i] = pads[2 * i], pads[2 * i + 1]
    shape = tuple(s + b + a for s, b, a in zip(x, before, after))
    ctx.out(args[-1], shape)
    total = math.prod(shape)
    ostr = contiguous_strides(shape)
    ctx.dispatch("fill", [args[-1]], "if", [total, value], _groups(total, 256))
    _copy(ctx, args[0], args[-1], x, 0, contiguous_strides(x), sum(b * s for b, s in zip(before, ostr)), ostr)


HANDLERS: dict[str, Callable[[_Ctx, list[int]], None]] = {
    **{name: _binary for name in _BINARY}, **{name: _unary for name in _UNARY},
    "aten.linear.default": _linear, "aten.mm.default": _mm, "aten.addmm.default": _addmm, "aten.bmm.default": _bmm,
    "aten.convolution.default": _conv, "et_vk.conv_with_clamp.default": _conv,
    "aten.max_pool2d.default": _pool, "aten.max_pool2d_with_indices.default": _pool,
    "aten.avg_pool2d.default": _pool, "aten.mean.dim": _mean, "aten._softmax.default": _softmax,
    "aten._log_softmax.default": _softmax, "aten._adaptive_avg_pool2d.default": _adaptive_avg_pool,
    "aten.native_layer_norm.default": _layer_norm,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm,
    "aten.view_copy.default": _view, "aten._unsafe_view.default": _view, "aten.squeeze_copy.dims": _view,
    "aten.squeeze_copy.dim": _view, "aten.unsqueeze_copy.default": _view, "aten.clone.default": _view,
    "aten.permute_copy.default": _permute, "aten.cat.default": _cat, "aten.slice_copy.Tensor": _slice,
    "aten.constant_pad_nd.default": _pad, "aten.select_copy.int": _select, "aten.expand_copy.default": _expand,
    "aten.split_with_sizes_copy.default": _split,
    "et_vk.prepack.default": _view,  # ExecuTorch: a constant copied into its texture layout; here an alias
}


def plan_graph(graph: VkGraph, constant_bytes: memoryview, named_data: Callable[[str], memoryview] | None,
               where: str = "VulkanBackend") -> Plan:
    """Validates ``graph`` completely and plans its dispatches (see the module docstring)."""
    if not isinstance(graph.values, list) or not isinstance(graph.chain, list):
        raise ProgramError(f"{where}: graph has no values or chain")
    unknown = sorted({op.name for op in graph.chain if op.name not in HANDLERS})
    if unknown:
        raise ProgramError(f"{where}: operators this executor's shader library does not implement: "
                           f"{', '.join(repr(u) for u in unknown)}")
    if graph.shaders:
        raise ProgramError(f"{where}: the graph carries {len(graph.shaders)} custom shaders, which are not supported")
    ctx = _Ctx(graph, lambda *_: np.zeros(0), where)
    # constants
    for vid, v in enumerate(graph.values):
        t = v.value
        if isinstance(t, VkTensor) and t.constant_id >= 0:
            dims = ctx.float_dims(vid, t)
            if t.constant_id >= len(graph.constants):
                raise ProgramError(f"{where}: tensor {vid} names constant {t.constant_id} of "
                                   f"{len(graph.constants)}")
            c = graph.constants[t.constant_id]
            itemsize = 2 if t.datatype == VkDataType.FLOAT16 else 4
            nbytes = math.prod(dims) * itemsize
            if c.length != nbytes:
                raise ProgramError(f"{where}: constant {t.constant_id} has {c.length} bytes, tensor {vid} "
                                   f"{list(dims)} needs {nbytes}")
            if c.offset == NAMED_DATA_OFFSET:
                if named_data is None:
                    raise ProgramError(f"{where}: constant {t.constant_id} is named data {c.named_key!r}, but the "
                                       "runtime gave no named-data lookup")
                try:
                    raw = memoryview(named_data(c.named_key)).cast("B")
                except (KeyError, ProgramError, ValueError) as exc:
                    raise ProgramError(f"{where}: named data {c.named_key!r} of constant {t.constant_id} is not in "
                                       f"the program ({exc})") from None
                if len(raw) < nbytes:
                    raise ProgramError(f"{where}: named data {c.named_key!r} has {len(raw)} bytes, needs {nbytes}")
                raw = raw[:nbytes]
            else:
                if c.offset + c.length > len(constant_bytes):
                    raise ProgramError(f"{where}: constant {t.constant_id} [{c.offset}, {c.offset + c.length}) "
                                       f"exceeds the {len(constant_bytes)}-byte data section")
                raw = constant_bytes[c.offset:c.offset + c.length]
            ctx.plan.constants[vid] = np.frombuffer(bytes(raw), dtype="<f2" if itemsize == 2 else "<f4").astype(
                np.float32)
            ctx.plan.dims[vid] = dims
            ctx.plan.storage[vid] = vid
            ctx.defined.add(vid)
    # inputs
    for vid in graph.input_ids:
        t = ctx.tensor_decl(vid)
        if t.constant_id >= 0 or vid in ctx.defined:
            raise ProgramError(f"{where}: input {vid} is a constant or listed twice")
        ctx.plan.dims[vid] = ctx.float_dims(vid, t)
        ctx.plan.storage[vid] = vid
        ctx.defined.add(vid)
        ctx.plan.inputs.append(vid)
    # operators
    for op in graph.chain:
        ctx.op = op.name
        ctx.node_id = int(op.node_id or 0)
        args = list(op.args)
        if not args:
            raise ctx.fail("no arguments")
        for a in args:
            ctx.value(a)
        HANDLERS[op.name](ctx, args)
        ctx.plan.op_counts[op.name] = ctx.plan.op_counts.get(op.name, 0) + 1
    ctx.op = ""
    if not graph.output_ids:
        raise ProgramError(f"{where}: the graph has no outputs")
    for vid in graph.output_ids:
        ctx.tensor_decl(vid)
        if vid in ctx.unused:
            raise ProgramError(f"{where}: output {vid} is an auxiliary result (indices / mean / rstd) the shaders "
                               "do not compute")
        if vid not in ctx.defined:
            raise ProgramError(f"{where}: output {vid} is never written")
        if vid in graph.input_ids or vid in ctx.plan.constants:
            raise ProgramError(f"{where}: output {vid} is a graph input or a constant, not a computed tensor")
        ctx.plan.outputs.append(vid)
    for d in ctx.plan.dispatches:
        for vid in d.tensors:
            if vid in ctx.unused:
                raise ProgramError(f"{where}: tensor {vid} (indices / mean / rstd) is read but never computed")
    if not ctx.plan.dispatches and not ctx.plan.outputs:
        raise ProgramError(f"{where}: empty graph")
    ctx.plan.fp16 = ctx.float_type == VkDataType.FLOAT16
    return ctx.plan
