"""Edge cases of the kernels behind attention's masked-row check (``_safe_softmax`` decomposes into eq.Scalar,
logical_not, any.dim, full_like and where.self), against torch eager: NaN, fully masked (all ``-inf``) rows,
broadcasting, dtype promotion, and each fast path next to the general one."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgeport.runtime.portable import KERNELS  # noqa: E402

g = torch.Generator().manual_seed(0)


def _run(name, *args, like):
    """Our kernel on numpy versions of ``args``, into a fresh out array shaped and typed like torch's result."""
    out = np.full(tuple(like.shape), 7, like.numpy().dtype)  # garbage the kernel must overwrite
    np_args = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
    got = KERNELS[name](*np_args, out)
    assert got.shape == tuple(like.shape) and got.dtype == like.numpy().dtype
    return got


def _same(got, ref):
    np.testing.assert_array_equal(got, ref.numpy())  # NaN == NaN for assert_array_equal


def _scores(masked_rows=(), nan_rows=(), partly=()):
    s = torch.randn(2, 3, 6, 16, generator=g)
    for r in masked_rows:
        s[r] = -torch.inf
    for r in nan_rows:
        s[r] = torch.nan
    for r in partly:
        s[r][:5] = -torch.inf
    return s


# ------------------------------------------------------------------------------------------------ where
def _cond(kind, shape):
    if kind == "none":
        return torch.zeros(shape, dtype=torch.bool)
    if kind == "all":
        return torch.ones(shape, dtype=torch.bool)
    return torch.rand(shape, generator=g) > 0.5


@pytest.mark.parametrize("kind", ["none", "all", "mixed"])
@pytest.mark.parametrize("shapes", [
    ((3, 4), (3, 4), (3, 4)),
    ((3, 1), (1, 4), (3, 4)),      # condition and self broadcast
    ((2, 3, 1), (4,), (2, 1, 4)),  # all three broadcast to a larger shape than any
    ((3, 4), (), (4,)),            # 0-dim self
    ((2, 1, 5, 1), (2, 1, 5, 7), (2, 1, 5, 7)),  # attention's [..., 1] row condition
    ((0, 4), (0, 4), (4,)),        # empty
])
def test_where_matches_torch(kind, shapes):
    c_shape, s_shape, o_shape = shapes
    cond = _cond(kind, c_shape)
    self_, other = torch.randn(s_shape, generator=g), torch.randn(o_shape, generator=g)
    if self_.numel():
        self_.view(-1)[0] = torch.nan
    if other.numel() > 1:
        other.view(-1)[1] = -torch.inf
    ref = torch.where(cond, self_, other)
    _same(_run("aten::where.self_out", cond, self_, other, like=ref), ref)


@pytest.mark.parametrize("kind", ["none", "all", "mixed"])
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float64), (torch.int64, torch.float32),
                                    (torch.int32, torch.int64), (torch.bool, torch.int8)])
def test_where_promotes_like_torch(kind, dtypes):
    cond = _cond(kind, (4, 5))
    a = (torch.randn(4, 5, generator=g) * 100).to(dtypes[0])
    b = (torch.randn(1, 5, generator=g) * 100).to(dtypes[1])
    ref = torch.where(cond, a, b)
    _same(_run("aten::where.self_out", cond, a, b, like=ref), ref)


@pytest.mark.parametrize("shapes", [
    ((8, 1), (1, 32), (8, 32)),
    ((2, 3, 1, 1), (3, 4, 20), (2, 1, 4, 20)),      # self broadcast along the rows the condition picks
    ((6, 1, 1), (2, 6, 4, 5), (5,)),                 # condition with fewer dims than the result
    ((2, 8, 6, 1), (2, 8, 6, 16), ()),               # attention rows, 0-dim other
])
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.int64, torch.float32)])
def test_where_few_selected_rows_matches_torch(shapes, dtypes):
    """A condition constant along trailing dims with few rows set takes the row-gather path."""
    c_shape, s_shape, o_shape = shapes
    cond = torch.zeros(c_shape, dtype=torch.bool)
    cond.view(-1)[1] = True
    self_ = (torch.randn(s_shape, generator=g) * 10).to(dtypes[0])
    other = torch.randn(o_shape, generator=g).to(dtypes[1])
    if dtypes[0].is_floating_point:
        self_.view(-1)[-1] = torch.nan
    ref = torch.where(cond, self_, other)
    _same(_run("aten::where.self_out", cond, self_, other, like=ref), ref)


# ------------------------------------------------------------------------------------------------ any
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float32])
@pytest.mark.parametrize("last", [1, 5, 6, 16, 40])
@pytest.mark.parametrize("keepdim", [True, False])
def test_any_last_dim_matches_torch(dtype, last, keepdim):
    x = torch.rand(3, 4, last, generator=g) > 0.85
    x[0] = False  # whole rows false, whole rows true
    x[1, 1] = True
    x = x.to(dtype)
    if dtype in (torch.int16, torch.int32, torch.int64):  # nonzero only in a high byte, and negative values
        x[2, 0, 0] = 1 << (8 * (x.element_size() - 1))
        x[2, 1, -1] = -1
    if dtype is torch.float32:  # -0.0 is false although a byte of it is not zero; NaN is true
        x[0, 0, 0] = -0.0
        x[0, 1, -1] = torch.nan
    ref = torch.any(x, -1, keepdim=keepdim)
    _same(_run("aten::any.out", x, -1, keepdim, like=ref), ref)


@pytest.mark.parametrize("op", ["any", "all"])
@pytest.mark.parametrize("dims,keepdim", [((1, 2), True), ((2, 1), False), ((0, 2), True), ((0, 1, 2), False),
                                          (None, False), ((), True), ((), False)])
def test_any_all_dims_match_torch(op, dims, keepdim):
    x = torch.rand(3, 4, 8, generator=g) > (0.95 if op == "any" else 0.05)
    x[1] = op == "all"
    x[2, 1] = op != "all"
    x = torch.where(x, torch.nan, torch.zeros(())) if dims == () else x  # an empty dim list: elementwise bool
    ref = getattr(torch.ops.aten, op).dims(x, list(dims) if dims is not None else None, keepdim)
    _same(_run(f"aten::{op}.dims_out", x, dims, keepdim, like=ref), ref)


def test_any_of_non_contiguous_and_empty_inputs():
    x = torch.rand(4, 8, 16, generator=g) > 0.9
    xt = x.transpose(0, 2)
    ref = torch.any(xt, -1, keepdim=True)
    got = KERNELS["aten::any.out"](xt.numpy(), -1, True, np.empty(tuple(ref.shape), bool))
    _same(got, ref)
    e = torch.zeros(3, 0, dtype=torch.bool)
    ref = torch.any(e, -1)
    _same(_run("aten::any.out", e, -1, False, like=ref), ref)


def test_any_into_a_larger_planned_out_resizes():
    """Dynamic shapes: the planned out has the upper-bound shape; the kernel returns a view with the real one."""
    x = torch.rand(2, 5, 8, generator=g) > 0.8
    planned = np.ones((4, 5, 1), bool)
    got = KERNELS["aten::any.out"](x.numpy(), -1, True, planned)
    _same(got, torch.any(x, -1, keepdim=True))
    assert np.shares_memory(got, planned)


# ------------------------------------------------------------------------------------------------ eq / logical_not / full_like
@pytest.mark.parametrize("value", [float("-inf"), float("inf"), 0.0, float("nan"), 1.5])
def test_eq_scalar_matches_torch(value):
    s = _scores(masked_rows=[(0, 1, 2)], nan_rows=[(1, 0, 3)], partly=[(0, 0, 0)])
    s[0, 0, 1, 3] = 1.5
    s[0, 0, 1, 4] = -0.0
    ref = torch.eq(s, value)
    _same(_run("aten::eq.Scalar_out", s, value, like=ref), ref)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64])
def test_logical_not_matches_torch(dtype):
    x = torch.tensor([0, 1, -2, 3, 0], dtype=torch.float32)
    if dtype is torch.float32:
        x = torch.tensor([0.0, -0.0, float("nan"), float("-inf"), 2.0])
    x = x.to(dtype)
    ref = torch.logical_not(x)
    _same(_run("aten::logical_not.out", x, like=ref), ref)


@pytest.mark.parametrize("value,dtype", [(0, torch.float32), (float("nan"), torch.float32),
                                         (float("-inf"), torch.float64), (3, torch.int64), (True, torch.bool),
                                         (-2, torch.int8)])
def test_full_like_matches_torch(value, dtype):
    x = torch.randn(3, 1, 4, generator=g).to(dtype)
    ref = torch.full_like(x, value)
    _same(_run("aten::full_like.out", x, value, None, like=ref), ref)


# ------------------------------------------------------------------------------------------------ the whole chain
@pytest.mark.parametrize("rows", [{}, {"masked_rows": [(0, 1, 2), (1, 2, 5)]}, {"nan_rows": [(1, 0, 3)]},
                                  {"masked_rows": [(0, 0, 0)], "nan_rows": [(1, 1, 1)], "partly": [(0, 2, 4)]},
                                  {"masked_rows": [(i, j) for i in range(2) for j in range(3)]}])
def test_safe_softmax_chain_matches_torch(rows):
    """eq(-inf) -> logical_not -> any(-1, keepdim) -> logical_not -> full_like(0) -> where, as torch.export
    decomposes ``_safe_softmax``; fully masked rows give zeros, NaN rows stay NaN."""
    s = _scores(**rows)
    soft = torch.softmax(s, -1)
    eq = _run("aten::eq.Scalar_out", s, float("-inf"), like=torch.eq(s, float("-inf")))
    keep = KERNELS["aten::logical_not.out"](eq, np.empty(eq.shape, bool))
    row_any = KERNELS["aten::any.out"](keep, -1, True, np.empty(s.shape[:-1] + (1,), bool))
    masked = KERNELS["aten::logical_not.out"](row_any, np.empty(row_any.shape, bool))
    zeros = KERNELS["aten::full_like.out"](soft.numpy(), 0, None, np.empty(s.shape, np.float32))
    got = KERNELS["aten::where.self_out"](masked, zeros, soft.numpy(), np.empty(s.shape, np.float32))
    np.testing.assert_allclose(got, torch.ops.aten._safe_softmax(s, -1).numpy(), rtol=0, atol=0, equal_nan=True)
