"""Each portable kernel against torch eager on random inputs.

The oracle is torch's own out variant, called with the same schema arguments: ``torch.ops.aten.add.out(a, b,
alpha=2, out=...)`` vs ``KERNELS["aten::add.out"](a, b, 2, out)``. Out arrays given to our kernels have the shape
and dtype torch produced.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgeport.program.schema import scalar_type_from_name  # noqa: E402
from edgeport.runtime.portable import KERNELS  # noqa: E402

g = torch.Generator().manual_seed(0)


def rn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def ri(*shape, lo=-5, hi=6, dtype=torch.int64):
    return torch.randint(lo, hi, shape, generator=g, dtype=dtype)


def pos(*shape):
    return torch.rand(*shape, generator=g) + 0.1


def rb(*shape):
    return torch.rand(*shape, generator=g) > 0.5


class DType:
    """A ScalarType argument: torch.dtype for torch, the ScalarType code for our kernels."""

    def __init__(self, dt):
        self.dt = dt


def _torch_arg(a):
    if isinstance(a, DType):
        return a.dt
    if isinstance(a, tuple):
        return list(a)
    return a


def _np_arg(a):
    if isinstance(a, torch.Tensor):
        return a.numpy()
    if isinstance(a, DType):
        return int(scalar_type_from_name(str(a.dt)))
    if isinstance(a, list):
        return [_np_arg(x) for x in a]
    return a


def _out_names(op):
    return [a.name for a in op._schema.arguments if a.is_out]


def _call_torch(op, args, outs):
    """Call torch's out variant: positional schema args positionally, kwarg-only ones by name."""
    schema_args = [a for a in op._schema.arguments if not a.is_out]
    pos, kw = [], {}
    for a, v in zip(schema_args, args):
        if a.kwarg_only:
            kw[a.name] = _torch_arg(v)
        else:
            pos.append(_torch_arg(v))
    op(*pos, **kw, **outs)


def check(name, args, out_dtypes=None, atol=1e-5, rtol=1e-5, compare=None):
    ns, rest = name.split("::")
    opname, overload = rest.split(".")
    op = getattr(getattr(getattr(torch.ops, ns), opname), overload)
    outs = _out_names(op)
    ref_dtypes = out_dtypes or [next((a.dtype for a in args if isinstance(a, torch.Tensor)), torch.float32)] * len(outs)
    if isinstance(args[0], list) and args[0] and isinstance(args[0][0], torch.Tensor):
        ref_dtypes = out_dtypes or [args[0][0].dtype] * len(outs)
    if outs and _schema_out_is_list(op):
        raise AssertionError("use check_list for Tensor[] outs")
    touts = {n: torch.empty(0, dtype=dt) for n, dt in zip(outs, ref_dtypes)}
    _call_torch(op, args, touts)
    refs = [touts[n] for n in outs]
    ours = [np.empty(tuple(r.shape), dtype=r.numpy().dtype) for r in refs]
    res = KERNELS[name](*[_np_arg(a) for a in args], *ours)
    res = list(res) if isinstance(res, tuple) else [res]
    assert len(res) == len(refs)
    for got, ref in zip(res, refs):
        ref = ref.numpy()
        assert got.shape == ref.shape, (got.shape, ref.shape)
        assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
        if compare is not None:
            compare(got, ref)
        elif ref.dtype.kind in "fc":
            np.testing.assert_allclose(got, ref, atol=atol, rtol=rtol, equal_nan=True)
        else:
            np.testing.assert_array_equal(got, ref)


def _schema_out_is_list(op):
    return any(a.is_out and str(a.type).startswith("List") for a in op._schema.arguments)


def check_list(name, args, shapes):
    ns, rest = name.split("::")
    opname, overload = rest.split(".")
    op = getattr(getattr(getattr(torch.ops, ns), opname), overload)
    touts = [torch.empty(s) for s in shapes]
    _call_torch(op, args, {'out': touts})
    ours = [np.empty(tuple(t.shape), np.float32) for t in touts]
    res = KERNELS[name](*[_np_arg(a) for a in args], ours)
    for got, ref in zip(res, touts):
        np.testing.assert_array_equal(got, ref.numpy())


F32 = [torch.float32]
BOOL = [torch.bool]
I64 = [torch.int64]

CASES = [
    # arithmetic
    ("aten::add.out", [rn(3, 4), rn(3, 4), 1]),
    ("aten::add.out", [rn(3, 4), rn(4), 2.5]),
    ("aten::add.out", [ri(3, 4), ri(1, 4), 3]),
    ("aten::add.out", [rn(2, 1, 4), rn(3, 1), 1]),
    ("aten::add.Scalar_out", [rn(3, 4), 1.5, 2]),
    ("aten::sub.out", [rn(3, 4), rn(3, 4), 0.5]),
    ("aten::sub.Scalar_out", [rn(5), 2.0, 1]),
    ("aten::rsub.Tensor_out", [rn(3, 4), rn(3, 4), 2]),
    ("aten::rsub.Scalar_out", [rn(3, 4), 1.0, 3]),
    ("aten::mul.out", [rn(3, 4), rn(3, 1)]),
    ("aten::mul.out", [ri(6), ri(6)]),
    ("aten::mul.Scalar_out", [rn(3, 4), -0.5]),
    ("aten::div.out", [rn(3, 4), pos(3, 4)]),
    ("aten::div.out", [ri(8, lo=1), ri(8, lo=1, hi=4)], F32),
    ("aten::div.out_mode", [rn(20) * 5, rn(20), "trunc"]),
    ("aten::div.out_mode", [rn(20) * 5, rn(20), "floor"]),
    ("aten::div.out_mode", [ri(20, lo=-20, hi=20), ri(20, lo=1, hi=5) * torch.tensor([1, -1] * 10), "trunc"]),
    ("aten::div.out_mode", [ri(20, lo=-20, hi=20), ri(20, lo=1, hi=5) * torch.tensor([1, -1] * 10), "floor"]),
    ("aten::div.out_mode", [rn(6), pos(6), None]),
    ("aten::div.Scalar_out", [rn(6), 3.0]),
    ("aten::div.Scalar_mode_out", [rn(20) * 5, -1.5, "floor"]),
    ("aten::div.Scalar_mode_out", [rn(20) * 5, 1.5, "trunc"]),
    ("aten::remainder.Tensor_out", [rn(10) * 4, pos(10)]),
    ("aten::fmod.Tensor_out", [rn(10) * 4, pos(10)]),
    ("aten::minimum.out", [rn(4, 5), rn(5)]),
    ("aten::maximum.out", [rn(4, 5), rn(4, 1)]),
    ("aten::atan2.out", [rn(7), rn(7)]),
    ("aten::pow.Tensor_Tensor_out", [pos(5), rn(5)]),
    ("aten::pow.Tensor_Scalar_out", [rn(5), 2]),
    ("aten::pow.Tensor_Scalar_out", [pos(5), 0.5]),
    ("aten::pow.Tensor_Scalar_out", [ri(5, lo=0), 3]),
    ("aten::pow.Tensor_Scalar_out", [rn(4, 5), 3.0]),  # GPT-2's gelu_new: x * x * x, as torch computes it
    ("aten::pow.Tensor_Scalar_out", [pos(5), -0.5]),
    ("aten::pow.Tensor_Scalar_out", [pos(5), -1]),
    ("aten::pow.Tensor_Scalar_out", [rn(5), -2.0]),
    ("aten::pow.Tensor_Scalar_out", [pos(5), 2.5]),
    ("aten::pow.Scalar_out", [2.0, rn(5)]),
    ("aten::floor_divide.out", [rn(10) * 5, pos(10)]),
    # unary
    *[(f"aten::{n}.out", [rn(3, 5)]) for n in ["neg", "abs", "exp", "sin", "cos", "tanh", "sigmoid", "relu",
                                              "silu", "hardswish", "hardsigmoid", "floor", "ceil", "trunc",
                                              "round", "sign", "erf", "expm1", "atan", "sinh", "asinh"]],
    *[(f"aten::{n}.out", [pos(3, 5)]) for n in ["log", "sqrt", "rsqrt", "log2", "log10", "log1p", "reciprocal"]],
    ("aten::sigmoid.out", [rn(100) * 50]),
    ("aten::abs.out", [ri(3, 5)]),
    ("aten::neg.out", [ri(3, 5)]),
    ("aten::sin.out", [ri(3, 5)], F32),
    ("aten::logical_not.out", [rb(3, 4)], BOOL),
    ("aten::bitwise_not.out", [ri(3, 4)]),
    ("aten::isnan.out", [torch.tensor([1.0, math.nan, math.inf])], BOOL),
    ("aten::isinf.out", [torch.tensor([1.0, math.nan, -math.inf])], BOOL),
    # activations
    ("aten::gelu.out", [rn(4, 6) * 3, "none"]),
    ("aten::gelu.out", [rn(64, 64) * 4, "none"]),  # float32 erfc fit over the range transformers see
    ("aten::gelu.out", [rn(4, 6) * 3, "tanh"]),
    ("aten::hardtanh.out", [rn(4, 6) * 4, 0.0, 6.0]),
    ("aten::hardtanh.out", [rn(4, 6), -1.0, 1.0]),
    ("aten::clamp.out", [rn(4, 6), -0.5, None]),
    ("aten::clamp.out", [rn(4, 6), None, 0.5]),
    ("aten::clamp.out", [rn(4, 6), -0.2, 0.5]),
    ("aten::clamp.out", [ri(10), -2, 3]),
    ("aten::clamp.Tensor_out", [rn(4, 6), rn(6) - 1, rn(4, 1) + 1]),
    ("aten::leaky_relu.out", [rn(4, 6), 0.1]),
    ("aten::elu.out", [rn(4, 6), 1.5, 1.0, 1.0]),
    ("aten::elu.out", [rn(4, 6), 1.0, 2.0, 0.5]),
    ("aten::glu.out", [rn(4, 6), -1]),
    ("aten::logit.out", [torch.rand(6, generator=g), 1e-3]),
    # comparisons and logic
    *[(f"aten::{n}.Tensor_out", [rn(3, 4), rn(4)], BOOL) for n in ["eq", "ne", "lt", "le", "gt", "ge"]],
    *[(f"aten::{n}.Scalar_out", [rn(3, 4), 0.1], BOOL) for n in ["eq", "ne", "lt", "le", "gt", "ge"]],
    ("aten::eq.Scalar_out", [torch.tensor([0.0, -math.inf, 1.0]), -math.inf], BOOL),
    ("aten::eq.Tensor_out", [ri(10, lo=0, hi=2), ri(10, lo=0, hi=2)], BOOL),
    *[(f"aten::{n}.out", [rb(3, 4), rb(4)], BOOL) for n in ["logical_and", "logical_or", "logical_xor"]],
    ("aten::logical_and.out", [rn(3, 4), rb(3, 4)], BOOL),
    ("aten::bitwise_and.Tensor_out", [ri(8, lo=0, hi=16), ri(8, lo=0, hi=16)]),
    ("aten::where.self_out", [rb(3, 4), rn(3, 4), rn(4)], F32),
    ("aten::where.self_out", [rb(3, 1), rn(1, 4), rn(3, 4)], F32),
    ("aten::masked_fill.Scalar_out", [rn(3, 4), rb(4), -1.0]),
    # linear algebra
    ("aten::mm.out", [rn(5, 7), rn(7, 3)]),
    ("aten::bmm.out", [rn(2, 5, 7), rn(2, 7, 3)]),
    ("aten::addmm.out", [rn(3), rn(5, 7), rn(7, 3), 1, 1]),
    ("aten::addmm.out", [rn(5, 3), rn(5, 7), rn(7, 3), 0.5, 2.0]),
    ("aten::addmm.out", [rn(3), rn(5, 7), rn(7, 3), 0, 1]),
    ("aten::linear.out", [rn(2, 4, 7), rn(3, 7), rn(3)]),
    ("aten::linear.out", [rn(4, 7), rn(3, 7), None]),
    ("aten::baddbmm.out", [rn(2, 5, 3), rn(2, 5, 7), rn(2, 7, 3), 0.5, 1.5]),
    # softmax / normalization
    ("aten::_softmax.out", [rn(3, 4, 5) * 5, -1, False]),
    ("aten::_softmax.out", [rn(3, 4, 5), 1, False]),
    ("aten::_log_softmax.out", [rn(3, 4, 5) * 5, -1, False]),
    ("aten::_log_softmax.out", [rn(3, 4, 5), 0, False]),
    ("aten::log_softmax.int_out", [rn(3, 7), 1, None]),
    ("aten::native_layer_norm.out", [rn(2, 5, 8), (8,), rn(8), rn(8), 1e-5], F32 * 3),
    ("aten::native_layer_norm.out", [rn(2, 5, 8), (5, 8), None, None, 1e-5], F32 * 3),
    ("aten::_native_batch_norm_legit_no_training.out",
     [rn(2, 4, 5, 5), rn(4), rn(4), rn(4), pos(4), 0.1, 1e-5], F32 * 3),
    ("aten::_native_batch_norm_legit_no_training.out",
     [rn(2, 4, 7), None, None, rn(4), pos(4), 0.1, 1e-3], F32 * 3),
    ("aten::native_batch_norm.out", [rn(2, 4, 5, 5), rn(4), rn(4), rn(4), pos(4), False, 0.1, 1e-5], F32 * 3),
    ("aten::_native_batch_norm_legit.no_stats_out", [rn(3, 4, 5, 5), rn(4), rn(4), True, 0.1, 1e-5], F32 * 3),
    ("aten::native_group_norm.out", [rn(2, 6, 4, 4), rn(6), rn(6), 2, 6, 16, 3, 1e-5], F32 * 3),
    ("aten::embedding.out", [rn(10, 4), ri(3, 5, lo=0, hi=10), -1, False, False]),
    # pooling
    ("aten::max_pool2d_with_indices.out", [rn(2, 3, 9, 9), (3, 3), (2, 2), (1, 1), (1, 1), False], [torch.float32, torch.int64]),
    ("aten::max_pool2d_with_indices.out", [rn(2, 3, 8, 8), (2, 2), (), (0, 0), (1, 1), False], [torch.float32, torch.int64]),
    ("aten::max_pool2d_with_indices.out", [rn(1, 2, 10, 9), (3, 2), (2, 3), (1, 0), (2, 1), True], [torch.float32, torch.int64]),
    ("aten::max_pool2d_with_indices.out", [rn(3, 7, 7), (3, 3), (2, 2), (0, 0), (1, 1), True], [torch.float32, torch.int64]),
    ("aten::max_pool2d_with_indices.out", [torch.randint(0, 3, (2, 3, 9, 9), generator=g).float(), (3, 3), (2, 2),
                                           (1, 1), (1, 1), False], [torch.float32, torch.int64]),
    ("aten::max_pool2d_with_indices.out", [torch.tensor([[[[1.0, math.nan, 2.0], [3.0, 0.0, math.nan]]]]), (2, 2),
                                           (1, 1), (0, 0), (1, 1), False], [torch.float32, torch.int64]),
    ("aten::avg_pool2d.out", [rn(2, 3, 8, 8), (2, 2), (2, 2), (0, 0), False, True, None]),
    ("aten::avg_pool2d.out", [rn(2, 3, 9, 9), (3, 3), (2, 2), (1, 1), False, True, None]),
    ("aten::avg_pool2d.out", [rn(2, 3, 9, 9), (3, 3), (2, 2), (1, 1), False, False, None]),
    ("aten::avg_pool2d.out", [rn(1, 2, 10, 10), (3, 3), (2, 2), (1, 1), True, True, None]),
    ("aten::avg_pool2d.out", [rn(1, 2, 10, 10), (3, 3), (2, 2), (1, 1), True, False, None]),
    ("aten::avg_pool2d.out", [rn(1, 2, 8, 8), (3, 3), (1, 1), (1, 1), False, True, 5]),
    ("aten::_adaptive_avg_pool2d.out", [rn(2, 3, 8, 8), (1, 1)]),
    ("aten::_adaptive_avg_pool2d.out", [rn(2, 3, 8, 8), (4, 2)]),
    ("aten::_adaptive_avg_pool2d.out", [rn(2, 3, 7, 10), (3, 4)]),
    ("aten::_adaptive_avg_pool2d.out", [rn(3, 7, 10), (5, 3)]),
    # reductions
    ("aten::mean.out", [rn(2, 3, 4, 5), (2, 3), True, None]),
    ("aten::mean.out", [rn(2, 3, 4), (-1,), False, None]),
    ("aten::mean.out", [rn(2, 3, 4), None, False, None]),
    ("aten::sum.IntList_out", [rn(2, 3, 4), (0, 2), False, None]),
    ("aten::sum.IntList_out", [ri(2, 3, 4), (1,), True, None]),
    ("aten::sum.IntList_out", [rb(2, 3), None, False, None], I64),
    ("aten::sum.IntList_out", [rn(2, 3), (), False, DType(torch.float64)], [torch.float64]),
    ("aten::amax.out", [rn(2, 3, 4), (1,), False]),
    ("aten::amax.out", [rn(2, 3, 4), (0, 2), True]),
    ("aten::amin.out", [rn(2, 3, 4), (), False]),
    ("aten::any.out", [rb(2, 3, 4), -1, True], BOOL),
    ("aten::any.dims_out", [rb(2, 3, 4), (0, 2), False], BOOL),
    ("aten::any.all_out", [rb(2, 3)], BOOL),
    ("aten::all.all_out", [rb(2, 3)], BOOL),
    ("aten::argmax.out", [rn(3, 5), 1, False], I64),
    ("aten::argmax.out", [rn(3, 5), None, False], I64),
    ("aten::argmin.out", [rn(3, 5), 0, True], I64),
    ("aten::max.dim_max", [rn(3, 5), 1, False], [torch.float32, torch.int64]),
    ("aten::min.dim_min", [rn(3, 5), 0, True], [torch.float32, torch.int64]),
    ("aten::var.correction_out", [rn(3, 5), (1,), 1, False]),
    ("aten::var.correction_out", [rn(3, 5), None, 0, True]),
    ("aten::prod.int_out", [rn(3, 5), 1, False, None]),
    ("aten::cumsum.out", [rn(3, 5), 1, None]),
    ("aten::topk.values", [rn(3, 8), 3, -1, True, True], [torch.float32, torch.int64]),
    ("aten::topk.values", [rn(3, 8), 2, 0, False, True], [torch.float32, torch.int64]),
    # data movement
    ("aten::view_copy.out", [rn(2, 3, 4), (6, -1)]),
    ("aten::_unsafe_view.out", [rn(2, 3, 4), (4, 6)]),
    ("aten::permute_copy.out", [rn(2, 3, 4), (2, 0, 1)]),
    ("aten::permute_copy.out", [rn(2, 3, 4), (-1, 0, 1)]),
    ("aten::transpose_copy.int_out", [rn(2, 3, 4), 0, 2]),
    ("aten::expand_copy.out", [rn(3, 1), (2, 3, 4), False]),
    ("aten::expand_copy.out", [rn(3, 1), (-1, 5), False]),
    ("aten::cat.out", [[rn(2, 3), rn(4, 3), rn(1, 3)], 0]),
    ("aten::cat.out", [[rn(2, 3), rn(2, 1)], -1]),
    ("aten::cat.out", [[rn(2, 3), torch.empty(0), rn(2, 3)], 1]),
    ("aten::stack.out", [[rn(2, 3), rn(2, 3)], 1]),
    ("aten::select_copy.int_out", [rn(3, 4, 5), 1, -1]),
    ("aten::select_copy.int_out", [rn(3, 4, 5), 0, 2]),
    ("aten::slice_copy.Tensor_out", [rn(6, 5), 0, 1, 5, 2]),
    ("aten::slice_copy.Tensor_out", [rn(6, 5), 1, -3, 9223372036854775807, 1]),
    ("aten::slice_copy.Tensor_out", [rn(6, 5), 1, None, None, 3]),
    ("aten::narrow_copy.out", [rn(6, 5), 1, 1, 3]),
    ("aten::unsqueeze_copy.out", [rn(3, 4), -1]),
    ("aten::unsqueeze_copy.out", [rn(3, 4), 0]),
    ("aten::squeeze_copy.dims_out", [rn(3, 1, 4, 1), (1, 3)]),
    ("aten::squeeze_copy.dims_out", [rn(3, 1, 4, 1), (0, -1)]),
    ("aten::squeeze_copy.dim_out", [rn(3, 1, 4), 1]),
    ("aten::squeeze_copy.out", [rn(1, 3, 1, 4)]),
    ("aten::clone.out", [rn(3, 4), None]),
    ("aten::_to_copy.out", [rn(3, 4), False, None], [torch.float64]),
    ("aten::_to_copy.out", [rn(3, 4) * 5, False, None], [torch.int32]),
    ("aten::alias_copy.out", [rn(3, 4)]),
    ("aten::constant_pad_nd.out", [rn(2, 3, 4), (1, 2), 0.5]),
    ("aten::constant_pad_nd.out", [rn(2, 3, 4), (1, 0, 2, 1, 0, 1), 0.0]),
    ("aten::constant_pad_nd.out", [rn(2, 3, 4), (-1, 2, 1, -1), -2.0]),
    ("aten::index.Tensor_out", [rn(5, 4), [ri(3, lo=0, hi=5)]]),
    ("aten::index.Tensor_out", [rn(5, 4, 3), [None, ri(2, 2, lo=0, hi=4)]]),
    ("aten::index.Tensor_out", [rn(5, 4, 3), [ri(2, lo=0, hi=5), None, ri(2, lo=0, hi=3)]]),
    ("aten::index.Tensor_out", [rn(5, 4), [ri(3, lo=-5, hi=5), ri(3, lo=0, hi=4)]]),
    ("aten::index.Tensor_out", [rn(5, 4), [torch.tensor([True, False, True, True, False])]]),
    ("aten::index_select.out", [rn(5, 4), 1, ri(6, lo=0, hi=4)]),
    ("aten::gather.out", [rn(4, 5), 1, ri(4, 3, lo=0, hi=5), False]),
    ("aten::repeat.out", [rn(2, 3), (2, 1, 3)]),
    ("aten::flip.out", [rn(2, 3, 4), (0, 2)]),
    ("aten::roll.out", [rn(3, 4), (1, -2), (0, 1)]),
    ("aten::roll.out", [rn(3, 4), (5,), ()]),
    ("aten::tril.out", [rn(4, 5), 1]),
    ("aten::triu.out", [rn(4, 5), -1]),
    ("aten::pixel_shuffle.out", [rn(1, 8, 3, 3), 2]),
    ("aten::upsample_nearest2d.vec_out", [rn(1, 2, 3, 4), (6, 8), None]),
    ("aten::upsample_nearest2d.vec_out", [rn(1, 2, 3, 4), None, (2.0, 3.0)]),
    # more core ATen
    ("aten::fill.Scalar_out", [rn(2, 3), 2.5]),
    ("aten::fill.Tensor_out", [rn(2, 3), torch.tensor(-1.5)]),
    ("aten::as_strided_copy.out", [rn(4, 5), (3, 2), (5, 2), 1]),
    ("aten::diagonal_copy.out", [rn(3, 4, 5), 1, 1, 2]),
    ("aten::unfold_copy.out", [rn(3, 10), 1, 3, 2]),
    ("aten::reflection_pad1d.out", [rn(2, 3, 6), (2, 1)]),
    ("aten::reflection_pad2d.out", [rn(2, 3, 6, 5), (1, 2, 3, 0)]),
    ("aten::reflection_pad3d.out", [rn(1, 2, 4, 4, 4), (1, 1, 2, 0, 1, 3)]),
    ("aten::replication_pad1d.out", [rn(2, 3, 6), (3, 1)]),
    ("aten::replication_pad2d.out", [rn(2, 3, 6, 5), (1, 2, 3, 0)]),
    ("aten::replication_pad3d.out", [rn(1, 2, 3, 4, 4), (1, 1, 2, 0, 1, 3)]),
    ("aten::scatter.value_out", [rn(4, 5), 1, ri(4, 2, lo=0, hi=5), 9.0]),
    ("aten::scatter.src_out", [rn(4, 5), 0, torch.tensor([[0, 1, 2, 3, 0], [1, 2, 3, 0, 1]]), rn(3, 5)]),
    ("aten::scatter_add.out", [rn(4, 5), 1, ri(4, 7, lo=0, hi=5), rn(4, 7)]),
    *[("aten::scatter_reduce.two_out", [rn(4, 5), 1, ri(4, 7, lo=0, hi=5), rn(4, 7), red, inc])
      for red in ["sum", "prod", "mean", "amax", "amin"] for inc in [True, False]],
    ("aten::index_put.out", [rn(5, 4), [torch.tensor([0, 2, 4])], rn(3, 4), False]),
    ("aten::index_put.out", [rn(5, 4), [torch.tensor([0, 2, 0]), torch.tensor([1, 1, 1])], rn(3), True]),
    ("aten::select_scatter.out", [rn(3, 4), rn(4), 0, 1]),
    ("aten::slice_scatter.out", [rn(6, 4), rn(6, 2), 1, 1, 4, 2]),
    ("aten::masked_scatter.out", [rn(3, 4), rb(3, 4), rn(12)]),
    ("aten::sort.values", [rn(3, 6), -1, False], [torch.float32, torch.int64]),
    ("aten::sort.values", [rn(3, 6), 0, True], [torch.float32, torch.int64]),
    ("aten::nonzero.out", [rb(3, 4)], I64),
    ("aten::native_dropout.out", [rn(3, 4), 0.5, False], [torch.float32, torch.bool]),
    ("aten::var.out", [rn(3, 5), (1,), True, False]),
    ("aten::var_mean.correction_out", [rn(3, 5), (0,), 1, True], F32 * 2),
    ("aten::_cdist_forward.out", [rn(2, 4, 3), rn(2, 5, 3), 2.0, None]),
    ("aten::_cdist_forward.out", [rn(4, 3), rn(5, 3), 1.0, None]),
    ("aten::_pdist_forward.out", [rn(5, 3), 2.0]),
    ("aten::upsample_bilinear2d.vec_out", [rn(1, 2, 4, 5), (7, 9), False, None]),
    ("aten::upsample_bilinear2d.vec_out", [rn(1, 2, 4, 5), (7, 9), True, None]),
    ("aten::upsample_bilinear2d.vec_out", [rn(1, 2, 4, 5), None, False, (2.0, 1.5)]),
    ("aten::grid_sampler_2d.out", [rn(2, 3, 5, 6), torch.rand(2, 4, 7, 2, generator=g) * 2.4 - 1.2, 0, 0, False]),
    ("aten::grid_sampler_2d.out", [rn(2, 3, 5, 6), torch.rand(2, 4, 7, 2, generator=g) * 2.4 - 1.2, 0, 1, True]),
    ("aten::grid_sampler_2d.out", [rn(2, 3, 5, 6), torch.rand(2, 4, 7, 2, generator=g) * 2 - 1, 1, 0, True]),
    ("aten::max_pool3d_with_indices.out", [rn(1, 2, 6, 7, 5), (2, 3, 2), (2, 2, 1), (1, 1, 0), (1, 1, 2), False],
     [torch.float32, torch.int64]),
    ("aten::avg_pool3d.out", [rn(1, 2, 6, 7, 5), (2, 3, 2), (2, 2, 1), (1, 1, 0), True, False, None]),
    ("aten::_adaptive_avg_pool3d.out", [rn(1, 2, 6, 7, 5), (3, 2, 4)]),
    ("aten::mean.dtype_out", [rn(3, 4), None]),
    ("aten::sum.out", [rn(3, 4), None]),
    ("aten::prod.out", [rn(3, 4), None]),
    # factories
    ("aten::full.out", [(2, 3), 1.5]),
    ("aten::full_like.out", [rn(2, 3), -2.0, None]),
    ("aten::zeros.out", [(2, 3)]),
    ("aten::ones.out", [(4,)]),
    ("aten::scalar_tensor.out", [3.5]),
    ("aten::arange.start_out", [0, 10, 3], I64),
    ("aten::arange.start_out", [1.0, 2.0, 0.25]),
    ("aten::arange.out", [7], I64),
]


def _id(case):
    return case[0].split("::")[1]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{_id(c)}" for i, c in enumerate(CASES)])
def test_kernel_matches_torch(case):
    name, args, *rest = case
    check(name, args, *rest)


# ExecuTorch defines the dim_order ops (executorch.exir.passes.dim_order_ops_registry) as the aten op below with
# the memory format of ``dim_order``; that aten op is the oracle here, as importing the registry takes all of
# executorch.exir (~10 s).
_MEMORY_FORMATS = {None: torch.preserve_format, (0, 1, 2, 3): torch.contiguous_format,
                   (0, 2, 3, 1): torch.channels_last}


@pytest.mark.parametrize("dim_order", list(_MEMORY_FORMATS))
@pytest.mark.parametrize(("name", "dtype"), [("_to_dim_order_copy", torch.float64),
                                             ("_to_dim_order_copy", torch.int32),
                                             ("_clone_dim_order", torch.float32)])
def test_dim_order_copy_kernels_match_aten(name, dtype, dim_order):
    x = rn(2, 3, 4, 5) * 10
    fmt = _MEMORY_FORMATS[dim_order]
    if name == "_to_dim_order_copy":
        ref = torch.ops.aten._to_copy(x, dtype=dtype, memory_format=fmt)
    else:
        ref = torch.ops.aten.clone(x, memory_format=fmt)
    order = dim_order or (0, 1, 2, 3)
    phys = np.empty([x.shape[d] for d in order], ref.numpy().dtype)
    out = phys.transpose(np.argsort(order))  # the out tensor in its dim order, seen in logical order
    KERNELS[f"dim_order_ops::{name}.out"](x.numpy(), False, dim_order, out)
    np.testing.assert_array_equal(out, ref.numpy())


CONV_CASES = [
    # (input shape, weight shape, stride, padding, dilation, groups, bias)
    ((1, 3, 16, 16), (16, 3, 3, 3), 1, 1, 1, 1, True),
    ((2, 4, 9, 11), (6, 4, 3, 2), 2, (1, 0), 1, 1, True),
    ((1, 8, 10, 10), (8, 1, 3, 3), 1, 1, 1, 8, False),  # depthwise, channels-first path
    ((1, 64, 6, 6), (64, 1, 3, 3), 2, 1, 1, 64, True),  # depthwise, channels-last path
    ((1, 8, 10, 10), (16, 1, 3, 3), 1, 1, 1, 8, True),  # channel multiplier 2
    ((1, 8, 10, 10), (12, 2, 3, 3), 1, 2, 2, 4, True),  # grouped + dilated
    ((2, 16, 7, 7), (32, 16, 1, 1), 1, 0, 1, 1, True),  # pointwise
    ((2, 16, 7, 7), (32, 16, 1, 1), 2, 0, 1, 1, False),  # strided pointwise
    ((1, 3, 15, 15), (8, 3, 7, 7), 2, 3, 1, 1, False),
    ((2, 4, 20), (6, 4, 5), 2, 2, 1, 1, True),  # conv1d
    ((1, 4, 20), (4, 1, 3), 1, 1, 2, 4, True),  # depthwise conv1d
    ((1, 2, 5, 6, 7), (4, 2, 3, 3, 3), 1, 1, 1, 1, True),  # conv3d
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_convolution_matches_torch(case):
    xs, ws, stride, padding, dilation, groups, bias = case
    nsp = len(xs) - 2
    tup = lambda v: (v,) * nsp if isinstance(v, int) else v  # noqa: E731
    args = [rn(*xs), rn(*ws), rn(ws[0]) if bias else None, tup(stride), tup(padding), tup(dilation), False,
            (0,) * nsp, groups]
    check("aten::convolution.out", args, atol=1e-4, rtol=1e-4)


TRANSPOSED = [
    ((1, 4, 5, 5), (4, 3, 3, 3), 2, 1, 1, 1, (1, 1)),
    ((2, 4, 6, 5), (4, 2, 2, 3), (2, 1), (0, 1), 1, 2, (0, 0)),
    ((1, 3, 4, 4), (3, 2, 3, 3), 1, 0, 2, 1, (0, 0)),
    ((1, 4, 9), (4, 2, 4), 3, 1, 1, 1, (2,)),
]


@pytest.mark.parametrize("case", TRANSPOSED)
def test_transposed_convolution_matches_torch(case):
    xs, ws, stride, padding, dilation, groups, out_pad = case
    nsp = len(xs) - 2
    tup = lambda v: (v,) * nsp if isinstance(v, int) else v  # noqa: E731
    args = [rn(*xs), rn(*ws), rn(ws[1] * groups), tup(stride), tup(padding), tup(dilation), True, out_pad, groups]
    check("aten::convolution.out", args, atol=1e-4, rtol=1e-4)


def test_split_kernels_match_torch():
    check_list("aten::split_with_sizes_copy.out", [rn(7, 3), (2, 4, 1), 0], [(2, 3), (4, 3), (1, 3)])
    check_list("aten::split_copy.Tensor_out", [rn(3, 7), 3, 1], [(3, 3), (3, 3), (3, 1)])
    check_list("aten::unbind_copy.int_out", [rn(3, 4), 1], [(3,)] * 4)


def test_channels_last_out():
    """An out tensor in channels-last dim order (strided numpy view) receives logical values."""
    x = rn(1, 3, 4, 5)
    phys = np.empty((1, 4, 5, 3), np.float32)
    out = phys.transpose(0, 3, 1, 2)
    KERNELS["dim_order_ops::_to_dim_order_copy.out"](x.numpy(), False, (0, 2, 3, 1), out)
    np.testing.assert_array_equal(out, x.numpy())
    np.testing.assert_array_equal(phys, x.permute(0, 2, 3, 1).numpy())


def test_dynamic_out_is_resized():
    """With an upper-bound out, kernels return a view of the same memory with the actual shape."""
    cap = np.zeros((8, 4), np.float32)
    a, b = rn(3, 4).numpy(), rn(3, 4).numpy()
    res = KERNELS["aten::add.out"](a, b, 1, cap)
    assert res.shape == (3, 4) and np.shares_memory(res, cap)
    np.testing.assert_allclose(res, a + b)
    res = KERNELS["aten::cat.out"]([a, b], 0, cap)
    assert res.shape == (6, 4) and np.shares_memory(res, cap)
    res = KERNELS["aten::view_copy.out"](a, (2, 6), cap)
    assert res.shape == (2, 6)
    res = KERNELS["aten::relu.out"](np.ones((1, 4), np.float32), cap)
    assert res.shape == (1, 4)
    res = KERNELS["aten::convolution.out"](np.ones((1, 1, 3, 3), np.float32), np.ones((2, 1, 1, 1), np.float32), None,
                                           (1, 1), (0, 0), (1, 1), False, (0, 0), 1, np.zeros((1, 2, 5, 5), np.float32))
    assert res.shape == (1, 2, 3, 3)
    from edgeport.errors import RuntimeExecutionError

    with pytest.raises(RuntimeExecutionError, match="planned buffer"):
        KERNELS["aten::add.out"](np.ones((9, 4), np.float32), np.ones((9, 4), np.float32), 1, cap)


def test_prim_ops():
    k = KERNELS
    assert k["executorch_prim::add.Scalar"](2, 3) == 5
    assert k["executorch_prim::floordiv.Scalar"](-7, 2) == -4
    assert k["executorch_prim::truediv.Scalar"](7, 2) == 3.5
    assert k["executorch_prim::mod.Scalar"](7, 3) == 1
    assert k["executorch_prim::eq.Scalar"](3, 3) is True
    assert k["executorch_prim::sym_max.Scalar"](3, 4) == 4
    assert k["executorch_prim::neg.Scalar"](3) == -3
    assert k["aten::sym_size.int"](np.zeros((2, 5)), -1) == 5
    assert k["aten::sym_numel"](np.zeros((2, 5))) == 10
    v = k["executorch_prim::et_view.default"](np.arange(12.0), (3, -1))
    assert v.shape == (3, 4)
