"""Fast paths of the portable kernels and of the fused masked-row guard give the same bits as the general
paths they shortcut: the guard against its six unfused kernels, ``resize`` against its contract, and the
shortcuts of ``copy``, ``copy_``, ``unsqueeze_copy``, ``embedding``, ``index_put_`` and the elementwise helper
against numpy / the general path. Bad input still fails with a clear error."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgeport.errors import RuntimeExecutionError
from edgeport.runtime._fuse import _guard_op
from edgeport.runtime.kernel_utils import resize
from edgeport.runtime.portable import KERNELS

K = KERNELS


def _unfused_guard(x, v, y, s, dim, keepdim, fill, fill_first):
    """The six portable kernel calls the fused guard stands for, each into its own (larger) planned buffer."""
    big = tuple(n + 2 for n in x.shape)
    a = K["aten::eq.Scalar_out"](x, s, np.zeros(big, bool))
    b = K["aten::logical_not.out"](a, np.zeros(big, bool))
    c = K["aten::any.out"](b, dim, keepdim, np.zeros(big, bool))
    d = K["aten::logical_not.out"](c, np.zeros(big, bool))
    z = K["aten::full_like.out"](v, fill, None, np.zeros(tuple(n + 1 for n in v.shape), y.dtype))
    out = np.zeros(tuple(n + 3 for n in y.shape), y.dtype)
    return K["aten::where.self_out"](d, z, y, out) if fill_first else K["aten::where.self_out"](d, y, z, out)


def _cases():
    rng = np.random.default_rng(0)
    for shape, dim, keepdim, s, fill_first in itertools.product(
            [(1, 4, 8, 8), (1, 8, 1, 128), (3, 5), (2, 0)], [-1, 0], [True, False], [float("-inf"), 0.0],
            [True, False]):
        for rows in ("none", "some", "all", "nan", "nan and masked", "all nan"):
            x = rng.standard_normal(shape).astype(np.float32)
            if x.size:
                x[..., 3:] = s  # partly masked rows everywhere
                if rows == "some":
                    x[(0,) * (x.ndim - 1)] = s
                elif rows == "all":
                    x[...] = s
                elif rows == "nan":
                    x[(0,) * (x.ndim - 1)] = s
                    x.reshape(-1)[0] = np.nan
                elif rows == "nan and masked":  # a fully masked row, and a NaN in another one
                    x[(0,) * (x.ndim - 1)] = s
                    x.reshape(-1)[-1] = np.nan
                elif rows == "all nan":
                    x[...] = np.nan
            yield x, dim, keepdim, s, fill_first


@pytest.mark.parametrize("fill", [0.0, -1.5])
def test_fused_guard_equals_the_six_kernels(fill):
    n = failing = 0
    for x, dim, keepdim, s, fill_first in _cases():
        y = (x * 2).astype(np.float32)
        op = _guard_op(s, dim, keepdim, fill, np.dtype(np.float32), K["aten::where.self_out"])
        out = np.full(tuple(k + 3 for k in y.shape), 7.0, np.float32)
        args = (x, y, None, y, out) if fill_first else (x, y, y, None, out)
        try:
            want = _unfused_guard(x, y, y, s, dim, keepdim, fill, fill_first)
        except ValueError:  # keepdim=False rows that do not broadcast against y: the fused op fails the same way
            with pytest.raises(ValueError):
                op(*args)
            failing += 1
            continue
        for _ in range(2):  # the second call takes the cached shapes
            got = op(*args)
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
        n += 1
    assert n > 100 and failing > 0


def test_fused_guard_reused_across_inputs_equals_the_six_kernels():
    """One fused op called on a sequence of inputs (it remembers which exact test told the rows apart last time:
    a decode step's causal mask), forwards and backwards, against the six kernels on each input."""
    groups: dict[tuple, list] = {}
    for x, dim, keepdim, s, fill_first in _cases():
        if x.size and keepdim:
            groups.setdefault((x.shape, dim, keepdim, s, fill_first), []).append(x)
    n = 0
    for (_, dim, keepdim, s, fill_first), xs in groups.items():
        op = _guard_op(s, dim, keepdim, 0.0, np.dtype(np.float32), K["aten::where.self_out"])
        for x in xs + xs[::-1] + xs:
            y = (x * 2).astype(np.float32)
            want = _unfused_guard(x, y, y, s, dim, keepdim, 0.0, fill_first)
            out = np.full(tuple(k + 3 for k in y.shape), 7.0, np.float32)
            got = op(*((x, y, None, y, out) if fill_first else (x, y, y, None, out)))
            np.testing.assert_array_equal(got, want)
            n += 1
    assert n > 300


def test_fused_guard_casts_into_the_output_dtype_as_where_does():
    x = np.array([[0.0, float("-inf")], [1.0, 2.0]], np.float32)
    y = np.array([[1.5, 2.5], [3.5, -4.5]], np.float32)
    for fill_first in (True, False):
        want = _unfused_guard(x, y, y, float("-inf"), -1, True, 0, fill_first)
        op = _guard_op(float("-inf"), -1, True, 0, np.dtype(np.float32), K["aten::where.self_out"])
        out = np.zeros((2, 2), np.float64)
        got = op(x, y, None, y, out) if fill_first else op(x, y, y, None, out)
        np.testing.assert_array_equal(got, want.astype(np.float64))


def test_fused_guard_rejects_shapes_that_do_not_broadcast():
    op = _guard_op(0.0, -1, True, 0, np.dtype(np.float32), K["aten::where.self_out"])
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError):
        op(x, x, None, np.ones((4, 5), np.float32), np.zeros((8, 8), np.float32))


def test_resize_contract():
    out = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert resize(out, (2, 3, 4)) is out
    v = resize(out, [1, 3, 4])  # a list: same as the tuple
    assert v.shape == (1, 3, 4) and np.shares_memory(v, out) and v[0, 0, 0] == 0
    assert resize(out, (6,)).shape == (6,)  # rank change of a contiguous buffer
    assert resize(out, (0, 3)).shape == (0, 3)
    with pytest.raises(RuntimeExecutionError, match="planned buffer"):
        resize(out, (5, 5))
    with pytest.raises(RuntimeExecutionError, match="negative"):
        resize(out, (-1, 4))
    with pytest.raises(RuntimeExecutionError, match="negative"):
        resize(out, (-2, -3))
    # a non-contiguous planned output (channels-last dim order) keeps its physical order
    cl = np.zeros((2, 4, 3, 3), np.float32).transpose(0, 2, 3, 1)  # logical (2, 3, 3, 4), NHWC memory
    part = resize(cl, (1, 3, 3, 4))
    assert part.shape == (1, 3, 3, 4) and np.shares_memory(part, cl)
    assert part.strides == cl.strides
    with pytest.raises(RuntimeExecutionError, match="non-contiguous"):
        resize(cl, (9, 4))


def test_elementwise_broadcast_shapes_follow_the_inputs():
    add = K["aten::add.out"]
    out = np.zeros(32, np.int64)
    for n in (1, 5, 1, 32, 3):  # a dynamic size changing from run to run
        a = np.arange(n, dtype=np.int64)
        got = add(a, np.array(7), 1, out)
        np.testing.assert_array_equal(got, a + 7)
        got = add(np.array([2]), a, 2, out)
        np.testing.assert_array_equal(got, 2 + 2 * a)
    with pytest.raises(ValueError):
        add(np.zeros(3), np.zeros(4), 1, np.zeros(8))


def test_copy_shortcuts_match_numpy():
    rng = np.random.default_rng(1)
    src = rng.standard_normal((2, 3)).astype(np.float32)
    out = np.zeros((2, 3), np.float64)
    np.testing.assert_array_equal(K["aten::copy.out"](out, src, False, out.copy()), src.astype(np.float64))
    np.testing.assert_array_equal(K["aten::copy.out"](out, src[0], False, out.copy()),
                                  np.broadcast_to(src[0], (2, 3)))
    dst = np.zeros((2, 3), np.int32)
    K["aten::copy_"](dst, np.array([1.7, -2.2, 3.0]), False)  # broadcast and an unsafe cast
    np.testing.assert_array_equal(dst, np.array([[1, -2, 3], [1, -2, 3]], np.int32))
    K["aten::copy_"](dst, np.full((2, 3), 5, np.int64), False)
    assert (dst == 5).all()
    with pytest.raises(ValueError):
        K["aten::copy_"](dst, np.zeros((4, 3)), False)


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_unsqueeze_copy_matches_expand_dims(dim):
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    got = K["aten::unsqueeze_copy.out"](x, dim, np.zeros(tuple(np.expand_dims(x, dim).shape), np.int64))
    np.testing.assert_array_equal(got, np.expand_dims(x, dim))
    with pytest.raises(RuntimeExecutionError, match="out of range"):
        K["aten::unsqueeze_copy.out"](x, 3, np.zeros((2, 3, 1, 1), np.int64))


def test_embedding_single_and_many_indices():
    emb = K["aten::embedding.out"]
    w = np.arange(40, dtype=np.float32).reshape(10, 4)
    many = (np.arange(300) * 7 % 10).reshape(1, 300)  # past the list check: the numpy reduction
    for idx in (np.array([[3]]), np.array([[0, 9, 4]]), np.array([[7]], np.int32), np.array([], np.int64), many):
        got = emb(w, idx, -1, False, False, np.zeros((1, max(8, idx.size), 4), np.float32))
        np.testing.assert_array_equal(got, w[idx])
    many_bad = many.copy()
    many_bad[0, 299] = -3
    for bad in (np.array([[10]]), np.array([[-1]]), np.array([[1, -1]]), np.array([[2, 10]], np.int32), many_bad,
                np.array([[2, 2**40]])):
        with pytest.raises(RuntimeExecutionError, match="out of range"):
            emb(w, bad, -1, False, False, np.zeros((1, max(8, bad.size), 4), np.float32))


def test_index_put_accumulate_takes_the_general_path():
    a = np.zeros((1, 2, 4, 3), np.float32)
    v = np.ones((1, 2, 1, 3), np.float32)
    put = K["aten::index_put_"]
    put(a, [None, None, np.array([2])], v, True)
    put(a, [None, None, np.array([2])], v, True)
    assert (a[:, :, 2] == 2).all() and a.sum() == 12
    put(a, [None, None, np.array([1])], v * 5, False)
    assert (a[:, :, 1] == 5).all()


@pytest.mark.parametrize("dtypes", [(np.float32, np.float32, np.float32), (np.int64, np.float32, np.float32),
                                    (np.float32, np.float64, np.float32), (np.int32, np.int64, np.int64),
                                    (np.bool_, np.int64, np.float32)])
def test_where_casts_each_branch_into_the_output_once(dtypes):
    """Each element is its branch's value cast straight to the output dtype, whatever the branches' common
    type (the small one-pass path applies only where that common type is the output dtype)."""
    a_t, b_t, o_t = dtypes
    rng = np.random.default_rng(2)
    where = K["aten::where.self_out"]
    for shape in [(3, 1), (1, 1, 1, 128), (2, 4096)]:
        cond = rng.random(shape) < 0.5
        a = (rng.standard_normal(shape) * 1e9).clip(-2e9, 2e9).astype(a_t)
        b = (rng.standard_normal((1,) + shape[1:]) * 3).astype(b_t)
        for _ in range(2):  # the second call takes the cached shapes and result type
            got = where(cond, a, b, np.zeros((4,) + shape[1:] if shape[0] < 4 else shape, o_t))
            want = np.broadcast_to(b, shape).astype(o_t)
            want[cond] = a[cond].astype(o_t)
            np.testing.assert_array_equal(got, want)


def test_index_put_of_position_runs_matches_fancy_indexing():
    """A prefill's cache write (consecutive positions) takes a basic slice; anything else the general path."""
    rng = np.random.default_rng(3)
    put = K["aten::index_put_"]
    runs = [np.arange(0, 32), np.arange(96, 128), np.arange(5, 9, dtype=np.int32), np.arange(3, 5, dtype=np.uint8),
            np.array([3, 5, 4, 6]), np.array([4, 3]), np.array([2, 2, 3]), np.array([-2, -1]), np.array([7, 8, 9, 9])]
    for ix in runs:
        for dim in (2, 1):
            shape = (1, 2, 128, 4) if dim == 2 else (1, 128, 4)
            a = rng.standard_normal(shape).astype(np.float32)
            b = a.copy()
            vshape = list(shape)
            vshape[dim] = ix.size
            v = rng.standard_normal(vshape).astype(np.float32)
            indices = [None] * dim + [ix]
            put(a, indices, v, False)
            b[(slice(None),) * dim + (ix,)] = v
            np.testing.assert_array_equal(a, b)
    for bad in (np.arange(126, 130), np.array([127, 128])):
        with pytest.raises(RuntimeExecutionError, match="index"):
            put(np.zeros((1, 2, 128, 4), np.float32), [None, None, bad], np.zeros((1, 2, bad.size, 4)), False)


def test_expand_copy_with_kept_sizes_equals_numpy_broadcast():
    """``-1`` entries (the attention mask of a dynamic-shape decoder) and new leading dims, into planned buffers
    larger than the result (resized) or of its exact shape, against numpy's broadcast; bad sizes fail clearly."""
    ex = K["aten::expand_copy.out"]
    rng = np.random.default_rng(1)
    cases = [((1, 1, 1, 128), (1, -1, 3, 128), (1, 1, 3, 128)), ((1, 1, 1, 128), (1, -1, 1, 128), (1, 1, 1, 128)),
             ((2, 1), (4, 2, -1), (4, 2, 1)), ((3,), (2, 3), (2, 3)), ((1, 5), (-1, 5), (1, 5)), ((), (2, 2), (2, 2))]
    for dtype in (np.float32, np.bool_, np.int64):
        for src, size, want_shape in cases:
            x = (rng.standard_normal(src) > 0).astype(dtype) if dtype is np.bool_ else \
                rng.standard_normal(src).astype(dtype) * 10
            for planned in (want_shape, tuple(n + 2 for n in want_shape)):
                out = np.full(planned, 7, dtype)
                for _ in range(2):  # the second call takes the cached shape
                    got = ex(x, size, False, out)
                    np.testing.assert_array_equal(got, np.broadcast_to(x, want_shape))
                    assert got.shape == want_shape and np.shares_memory(got, out)
    x = np.ones((1, 3), np.float32)
    with pytest.raises(RuntimeExecutionError, match="fewer dims"):
        ex(x, (3,), False, np.zeros((3,), np.float32))
    with pytest.raises(RuntimeExecutionError, match="new leading"):
        ex(x, (-1, 1, 3), False, np.zeros((1, 1, 3), np.float32))
    with pytest.raises(ValueError):
        ex(x, (2, 4), False, np.zeros((4, 4), np.float32))
    with pytest.raises(RuntimeExecutionError, match="planned buffer"):
        ex(x, (9, -1), False, np.zeros((2, 3), np.float32))
