"""Sample inputs per core-ATen operator, used to build the conformance suite's per-op test programs.

A *sample maker* takes a torch dtype and a seeded ``torch.Generator`` and returns a few :class:`Sample` objects:
the positional and keyword arguments of one call of the op (in edge-dialect form: ``permute_copy`` rather than
``permute``). Tensors in ``args`` become the test program's user inputs; a tensor wrapped in :class:`Const`
becomes a parameter of the program (a weight, which a backend may embed in its blob); anything else is a literal
argument. ``outputs`` selects which results of a multi-output op the program returns (``max_pool2d_with_indices``
returns only the values, like the models that use it).

:data:`SAMPLES` maps op names (``str(torch.ops.aten.add.Tensor)`` = ``"aten.add.Tensor"``, the capability-table
spelling) to makers. An op a backend claims that has no maker is reported by the suite as *untested: no sample
inputs*; a backend can add makers for its own ops with ``BackendConformance.extra_samples``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["SAMPLES", "Const", "Sample", "SampleMaker", "make_tensor"]


@dataclass(frozen=True)
class Const:
    """A tensor argument that becomes a parameter of the test program (a weight), not a user input."""

    tensor: torch.Tensor


@dataclass(frozen=True)
class Sample:
    """One call of an op: ``op(*args, **kwargs)``; ``label`` names it in test ids (``"broadcast"``)."""

    label: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    outputs: tuple[int, ...] | None = None  # indices of a tuple result to return; None = all


SampleMaker = Callable[[torch.dtype, torch.Generator], list[Sample]]


def make_tensor(
    shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator, low: float = -2.0, high: float = 2.0
) -> torch.Tensor:
    """A random tensor: uniform in ``[low, high)`` for floats, integers in ``[low, high)``, random booleans."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).to(torch.bool)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low).to(dtype)
    if dtype.is_complex:
        raise ValueError("complex samples are not supported")
    info = torch.iinfo(dtype)
    lo, hi = max(int(low), info.min), min(int(high), info.max)
    if hi <= lo:
        lo, hi = 0, 2
    return torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64).to(dtype)


def _nonzero(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Values away from zero (divisors)."""
    if dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool)
    mag = make_tensor(shape, dtype, gen, 1, 3) if not dtype.is_floating_point else make_tensor(shape, dtype, gen, 0.5, 2)
    sign = make_tensor(shape, torch.bool, gen)
    return torch.where(sign, mag, -mag) if dtype.is_signed else mag


# -- elementwise -------------------------------------------------------------------------------------------

_UNARY_SHAPES = (("1d", (7,)), ("2d", (3, 4)), ("4d", (2, 3, 4, 5)))


def _unary(low: float = -2.0, high: float = 2.0, **kwargs: Any) -> SampleMaker:
    def maker(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
        return [Sample(label, (make_tensor(shape, dtype, gen, low, high),), dict(kwargs)) for label, shape in _UNARY_SHAPES]

    return maker


def _unary_args(*extra: Any, low: float = -2.0, high: float = 2.0) -> SampleMaker:
    def maker(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
        return [Sample(label, (make_tensor(shape, dtype, gen, low, high), *extra)) for label, shape in _UNARY_SHAPES]

    return maker


_BINARY_SHAPES = (("same_shape", (3, 4), (3, 4)), ("broadcast", (2, 3, 4), (4,)), ("outer", (3, 1), (1, 4)))


def _binary(alpha: bool = False, positive_base: bool = False, nonzero_rhs: bool = False) -> SampleMaker:
    def maker(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
        out = []
        for label, sa, sb in _BINARY_SHAPES:
            a = make_tensor(sa, dtype, gen, 0.5, 2) if positive_base else make_tensor(sa, dtype, gen)
            b = _nonzero(sb, dtype, gen) if nonzero_rhs else make_tensor(sb, dtype, gen)
            out.append(Sample(label, (a, b)))
        if alpha:
            value = 2 if not dtype.is_floating_point else 0.5
            out[-1] = Sample("alpha", (make_tensor((5,), dtype, gen), make_tensor((5,), dtype, gen)), {"alpha": value})
        return out

    return maker


def _scalar(value_float: float, value_int: int, nonzero: bool = False) -> SampleMaker:
    def maker(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
        value = value_float if dtype.is_floating_point else value_int
        return [Sample(label, (make_tensor(shape, dtype, gen), value)) for label, shape in _UNARY_SHAPES[1:]]

    return maker


def _where(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    return [
        Sample(label, (make_tensor(sa, torch.bool, gen), make_tensor(sa, dtype, gen), make_tensor(sb, dtype, gen)))
        for label, sa, sb in _BINARY_SHAPES
    ]


def _clamp(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    lo, hi = (-0.5, 0.5) if dtype.is_floating_point else (-1, 1)
    return [
        Sample("min_max", (make_tensor((3, 4), dtype, gen), lo, hi)),
        Sample("min_only", (make_tensor((2, 3, 4), dtype, gen), lo)),
        Sample("max_only", (make_tensor((7,), dtype, gen), None, hi)),
    ]


# -- linear algebra ----------------------------------------------------------------------------------------


def _mm(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    return [
        Sample(f"{m}x{k}x{n}", (make_tensor((m, k), dtype, gen), make_tensor((k, n), dtype, gen)))
        for m, k, n in ((3, 5, 2), (1, 8, 1), (16, 16, 16))
    ]


def _bmm(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    return [
        Sample(f"{b}x{m}x{k}x{n}", (make_tensor((b, m, k), dtype, gen), make_tensor((b, k, n), dtype, gen)))
        for b, m, k, n in ((2, 3, 4, 5), (1, 1, 8, 1), (4, 8, 8, 8))
    ]


def _addmm(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("row_bias", (t((2,), dtype, gen), t((3, 4), dtype, gen), t((4, 2), dtype, gen))),
        Sample("full_bias", (t((3, 2), dtype, gen), t((3, 4), dtype, gen), t((4, 2), dtype, gen))),
        Sample(
            "beta_alpha",
            (t((2,), dtype, gen), t((3, 4), dtype, gen), t((4, 2), dtype, gen)),
            {"beta": 0.5, "alpha": 2.0} if dtype.is_floating_point else {"beta": 2, "alpha": 3},
        ),
    ]


def _linear(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("bias", (t((4, 8), dtype, gen), Const(t((6, 8), dtype, gen, -0.5, 0.5)), Const(t((6,), dtype, gen)))),
        Sample("no_bias", (t((2, 8), dtype, gen), Const(t((3, 8), dtype, gen, -0.5, 0.5)))),
        Sample("3d_input", (t((2, 3, 8), dtype, gen), Const(t((5, 8), dtype, gen, -0.5, 0.5)), Const(t((5,), dtype, gen)))),
    ]


def _convolution(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor

    def w(shape: tuple[int, ...]) -> Const:
        return Const(t(shape, dtype, gen, -0.5, 0.5))

    return [
        Sample("conv2d_3x3_pad1", (t((1, 3, 8, 8), dtype, gen), w((4, 3, 3, 3)), Const(t((4,), dtype, gen)),
                                   [1, 1], [1, 1], [1, 1], False, [0, 0], 1)),
        Sample("conv2d_stride2_no_bias", (t((2, 4, 9, 9), dtype, gen), w((8, 4, 3, 3)), None,
                                          [2, 2], [0, 0], [1, 1], False, [0, 0], 1)),
        Sample("conv2d_depthwise", (t((1, 4, 8, 8), dtype, gen), w((4, 1, 3, 3)), Const(t((4,), dtype, gen)),
                                    [1, 1], [1, 1], [1, 1], False, [0, 0], 4)),
    ]


# -- reductions, normalization, pooling --------------------------------------------------------------------


def _reduce_dims(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("last_dim", (t((3, 4), dtype, gen), [-1])),
        Sample("spatial_keepdim", (t((2, 3, 4, 5), dtype, gen), [2, 3], True)),
        Sample("first_dim", (t((4, 6), dtype, gen), [0], False)),
    ]


def _arg_reduce(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("dim1", (t((3, 4), dtype, gen), 1)),
        Sample("dim0_keepdim", (t((5, 2), dtype, gen), 0, True)),
    ]


def _softmax(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("last_dim", (t((3, 4), dtype, gen), -1, False)),
        Sample("dim1_4d", (t((2, 3, 4, 5), dtype, gen), 1, False)),
    ]


def _layer_norm(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("affine", (t((2, 5, 8), dtype, gen), [8], Const(t((8,), dtype, gen)), Const(t((8,), dtype, gen)), 1e-5),
               outputs=(0,)),
        Sample("no_affine", (t((4, 6), dtype, gen), [6], None, None, 1e-5), outputs=(0,)),
    ]


def _batch_norm(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor

    def stats(c: int) -> tuple[Const, Const, Const, Const]:
        return (Const(t((c,), dtype, gen, 0.5, 1.5)), Const(t((c,), dtype, gen, -0.2, 0.2)),
                Const(t((c,), dtype, gen, -0.5, 0.5)), Const(t((c,), dtype, gen, 0.5, 1.5)))

    return [
        Sample("nchw", (t((2, 3, 4, 4), dtype, gen), *stats(3), 0.1, 1e-5), outputs=(0,)),
        Sample("nc", (t((4, 6), dtype, gen), *stats(6), 0.1, 1e-5), outputs=(0,)),
    ]


def _max_pool2d(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("k2s2", (t((1, 3, 8, 8), dtype, gen), [2, 2], [2, 2]), outputs=(0,)),
        Sample("k3s1p1", (t((2, 2, 6, 6), dtype, gen), [3, 3], [1, 1], [1, 1]), outputs=(0,)),
    ]


def _avg_pool2d(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("k2s2", (t((1, 3, 8, 8), dtype, gen), [2, 2], [2, 2])),
        Sample("k3s1p1", (t((2, 2, 6, 6), dtype, gen), [3, 3], [1, 1], [1, 1])),
    ]


def _adaptive_avg_pool2d(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("global", (t((1, 4, 6, 6), dtype, gen), [1, 1])),
        Sample("halve", (t((2, 3, 8, 8), dtype, gen), [4, 4])),
    ]


# -- shape and data movement -------------------------------------------------------------------------------


def _view_copy(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("2d_to_2d", (t((3, 4), dtype, gen), [4, 3])),
        Sample("flatten", (t((2, 3, 4), dtype, gen), [24])),
        Sample("infer_dim", (t((2, 3, 4), dtype, gen), [2, -1])),
    ]


def _permute_copy(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("transpose_2d", (t((3, 4), dtype, gen), [1, 0])),
        Sample("rotate_3d", (t((2, 3, 4), dtype, gen), [2, 0, 1])),
        Sample("nchw_to_nhwc", (t((1, 2, 3, 4), dtype, gen), [0, 2, 3, 1])),
    ]


def _expand_copy(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("column", (t((3, 1), dtype, gen), [3, 4])),
        Sample("new_dims", (t((4,), dtype, gen), [2, 3, 4])),
    ]


def _cat(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("dim0", ([t((2, 3), dtype, gen), t((4, 3), dtype, gen)], 0)),
        Sample("dim1_three", ([t((2, 1), dtype, gen), t((2, 3), dtype, gen), t((2, 2), dtype, gen)], 1)),
        Sample("neg_dim_4d", ([t((1, 2, 3, 2), dtype, gen), t((1, 2, 3, 3), dtype, gen)], -1)),
    ]


def _slice_copy(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("dim0", (t((6, 4), dtype, gen), 0, 1, 4)),
        Sample("dim1_step2", (t((3, 8), dtype, gen), 1, 0, 8, 2)),
        Sample("negative_end", (t((2, 3, 5), dtype, gen), 2, 1, -1)),
    ]


def _select_copy(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [
        Sample("dim0", (t((4, 3), dtype, gen), 0, 2)),
        Sample("last_dim_negative_index", (t((2, 3, 5), dtype, gen), -1, -2)),
    ]


def _unsqueeze_copy(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [Sample("front", (t((3, 4), dtype, gen), 0)), Sample("back", (t((3, 4), dtype, gen), -1))]


def _squeeze_copy_dims(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [Sample("middle", (t((3, 1, 4), dtype, gen), [1])), Sample("two", (t((1, 3, 1), dtype, gen), [0, 2]))]


def _constant_pad_nd(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    value = 0.5 if dtype.is_floating_point else 1
    return [
        Sample("last_dim", (t((3, 4), dtype, gen), [1, 2])),
        Sample("hw_value", (t((1, 2, 3, 3), dtype, gen), [1, 1, 2, 0], value)),
    ]


def _split_with_sizes_copy(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [Sample("dim1", (t((2, 5), dtype, gen), [2, 3], 1)), Sample("dim0", (t((6, 2), dtype, gen), [1, 2, 3]))]


def _clone(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    return [Sample("2d", (make_tensor((3, 4), dtype, gen),))]


def _hardtanh(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [Sample("default", (t((3, 4), dtype, gen),)), Sample("relu6", (t((2, 3, 4), dtype, gen, -8, 8), 0.0, 6.0))]


def _leaky_relu(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [Sample("default", (t((3, 4), dtype, gen),)), Sample("slope", (t((2, 3, 4), dtype, gen), 0.2))]


def _gelu(dtype: torch.dtype, gen: torch.Generator) -> list[Sample]:
    t = make_tensor
    return [Sample("erf", (t((3, 4), dtype, gen),)),
            Sample("tanh", (t((2, 3, 4), dtype, gen),), {"approximate": "tanh"})]


_POS = {"low": 0.1, "high": 3.0}
_UNIT = {"low": -0.9, "high": 0.9}

SAMPLES: dict[str, SampleMaker] = {
    # unary elementwise
    "aten.abs.default": _unary(),
    "aten.neg.default": _unary(),
    "aten.sin.default": _unary(),
    "aten.cos.default": _unary(),
    "aten.tan.default": _unary(-1.2, 1.2),
    "aten.tanh.default": _unary(),
    "aten.sigmoid.default": _unary(),
    "aten.exp.default": _unary(),
    "aten.expm1.default": _unary(),
    "aten.erf.default": _unary(),
    "aten.floor.default": _unary(),
    "aten.ceil.default": _unary(),
    "aten.round.default": _unary(),
    "aten.trunc.default": _unary(),
    "aten.sign.default": _unary(),
    "aten.relu.default": _unary(),
    "aten.atan.default": _unary(),
    "aten.sinh.default": _unary(),
    "aten.cosh.default": _unary(),
    "aten.asinh.default": _unary(),
    "aten.asin.default": _unary(**_UNIT),
    "aten.acos.default": _unary(**_UNIT),
    "aten.atanh.default": _unary(**_UNIT),
    "aten.log.default": _unary(**_POS),
    "aten.log2.default": _unary(**_POS),
    "aten.log10.default": _unary(**_POS),
    "aten.log1p.default": _unary(**_POS),
    "aten.sqrt.default": _unary(**_POS),
    "aten.rsqrt.default": _unary(**_POS),
    "aten.reciprocal.default": _unary(**_POS),
    "aten.logical_not.default": _unary(),
    "aten.bitwise_not.default": _unary(),
    "aten.gelu.default": _gelu,
    "aten.elu.default": _unary(),
    "aten.hardtanh.default": _hardtanh,
    "aten.leaky_relu.default": _leaky_relu,
    "aten.clamp.default": _clamp,
    # binary elementwise
    "aten.add.Tensor": _binary(alpha=True),
    "aten.sub.Tensor": _binary(alpha=True),
    "aten.mul.Tensor": _binary(),
    "aten.div.Tensor": _binary(nonzero_rhs=True),
    "aten.maximum.default": _binary(),
    "aten.minimum.default": _binary(),
    "aten.pow.Tensor_Tensor": _binary(positive_base=True),
    "aten.atan2.default": _binary(),
    "aten.eq.Tensor": _binary(),
    "aten.ne.Tensor": _binary(),
    "aten.lt.Tensor": _binary(),
    "aten.le.Tensor": _binary(),
    "aten.gt.Tensor": _binary(),
    "aten.ge.Tensor": _binary(),
    "aten.logical_and.default": _binary(),
    "aten.logical_or.default": _binary(),
    "aten.logical_xor.default": _binary(),
    "aten.bitwise_and.Tensor": _binary(),
    "aten.bitwise_or.Tensor": _binary(),
    "aten.bitwise_xor.Tensor": _binary(),
    "aten.where.self": _where,
    # tensor-scalar
    "aten.add.Scalar": _scalar(1.5, 2),
    "aten.sub.Scalar": _scalar(1.5, 2),
    "aten.mul.Scalar": _scalar(1.5, 2),
    "aten.div.Scalar": _scalar(1.5, 2),
    "aten.pow.Tensor_Scalar": _unary_args(2, low=0.5, high=2.0),
    # linear algebra
    "aten.mm.default": _mm,
    "aten.bmm.default": _bmm,
    "aten.addmm.default": _addmm,
    "aten.linear.default": _linear,
    "aten.convolution.default": _convolution,
    # reductions, normalization, pooling
    "aten.mean.dim": _reduce_dims,
    "aten.sum.dim_IntList": _reduce_dims,
    "aten.amax.default": _reduce_dims,
    "aten.amin.default": _reduce_dims,
    "aten.argmax.default": _arg_reduce,
    "aten.argmin.default": _arg_reduce,
    "aten._softmax.default": _softmax,
    "aten._log_softmax.default": _softmax,
    "aten.native_layer_norm.default": _layer_norm,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm,
    "aten.max_pool2d_with_indices.default": _max_pool2d,
    "aten.avg_pool2d.default": _avg_pool2d,
    "aten._adaptive_avg_pool2d.default": _adaptive_avg_pool2d,
    # shape and data movement (edge dialect: *_copy ops)
    "aten.view_copy.default": _view_copy,
    "aten.permute_copy.default": _permute_copy,
    "aten.expand_copy.default": _expand_copy,
    "aten.cat.default": _cat,
    "aten.slice_copy.Tensor": _slice_copy,
    "aten.select_copy.int": _select_copy,
    "aten.unsqueeze_copy.default": _unsqueeze_copy,
    "aten.squeeze_copy.dims": _squeeze_copy_dims,
    "aten.constant_pad_nd.default": _constant_pad_nd,
    "aten.split_with_sizes_copy.default": _split_with_sizes_copy,
    "aten.clone.default": _clone,
}
