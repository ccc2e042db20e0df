"""The host batch matrix product (``_gemm.bmm``) the executor runs a host segment's ``XNNBatchMatrixMultiply`` on:
numpy's ``matmul`` semantics (batch broadcasting, strided views: a transposed key cache, a head split) with sums in
another order, so the oracle is numpy's float64 product within float32 rounding; it declines (``False``, nothing
written) what it does not take, and the host op then runs numpy."""

from __future__ import annotations

import numpy as np
import pytest

gemm = pytest.importorskip("edgeport_xnnpack._gemm")
if not hasattr(gemm, "bmm"):
    pytest.skip("the _gemm extension predates bmm (rebuild it)", allow_module_level=True)

from edgeport_xnnpack import _host  # noqa: E402
from edgeport_xnnpack.schema.graph import XNode  # noqa: E402
from xnn_helpers import DECODE_PROMPT, eager_greedy_tokens, greedy_decode, small_decoder  # noqa: E402


def _close(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``got`` is a @ b to float32 rounding: within k ulps of the float64 product's scale per element."""
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    k = a.shape[-1]
    assert got.shape == want.shape
    np.testing.assert_array_less(np.abs(got - want), 2 * k * np.finfo(np.float32).eps * scale + 1e-30)


def _layouts(rng: np.random.Generator, batch: tuple[int, ...], m: int, k: int, n: int):
    """a, b operand pairs in the layouts a host segment hands over: contiguous, b as the transposed view of a
    contiguous [n, k] (K^T), a strided head split, broadcast batch dims."""
    a = rng.standard_normal((*batch, m, k)).astype(np.float32)
    b = rng.standard_normal((*batch, k, n)).astype(np.float32)
    yield "contiguous", a, b
    bt = np.ascontiguousarray(np.swapaxes(b, -1, -2))
    yield "b transposed view", a, np.swapaxes(bt, -1, -2)
    wide = rng.standard_normal((*batch, m, 2 * k + 3)).astype(np.float32)
    yield "a strided", wide[..., 3:3 + 2 * k:2], b
    yield "a column slice, b transposed", wide[..., 1:1 + k], np.swapaxes(bt, -1, -2)
    if batch:
        yield "a broadcast", a[:1], b
        yield "b broadcast", a, b[:1]
        yield "b rank 2", a, b[(0,) * len(batch)]


SHAPES = [((8,), 1, 64, 128), ((8,), 1, 128, 64), ((1, 8), 1, 64, 128), ((2, 4), 1, 64, 33), ((3,), 5, 7, 9),
          ((), 1, 1, 1), ((2,), 3, 17, 70), ((), 6, 13, 5), ((8,), 32, 64, 128)]


@pytest.mark.parametrize("batch, m, k, n", SHAPES)
def test_bmm_is_numpy_s_product_to_float32_rounding(batch, m, k, n):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    for name, a, b in _layouts(rng, batch, m, k, n):
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (m, n)
        out = np.full(shape, np.nan, np.float32)
        assert gemm.bmm(a, b, out) is True, name
        _close(out, a, b)


@pytest.mark.parametrize("batch, m, k, n", SHAPES[:6])
@pytest.mark.parametrize("scale", [0.35355339, -2.0, 1e-30])
def test_bmm_scales_b_as_if_materialized(batch, m, k, n, scale):
    rng = np.random.default_rng(n)
    s = float(np.float32(scale))
    for name, a, b in _layouts(rng, batch, m, k, n):
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (m, n)
        out = np.full(shape, np.nan, np.float32)
        assert gemm.bmm(a, b, out, -np.inf, np.inf, s) is True, name
        _close(out, a, np.multiply(b, np.float32(s)))  # b * s rounded to float32 first


def test_bmm_clamps_and_keeps_nan_and_inf():
    a = np.array([[[1.0, np.nan, 0.0], [np.inf, 1.0, 0.0]]], np.float32)
    b = np.ones((1, 3, 2), np.float32)
    out = np.empty((1, 2, 2), np.float32)
    assert gemm.bmm(a, b, out) is True
    np.testing.assert_array_equal(out, np.matmul(a, b))
    x = np.random.default_rng(0).standard_normal((2, 4, 9)).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((2, 9, 5)).astype(np.float32)
    assert gemm.bmm(x, y, out := np.empty((2, 4, 5), np.float32), -0.5, 0.25) is True
    ref = np.clip(np.matmul(x, y), -0.5, 0.25)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="output range"):
        gemm.bmm(x, y, out, 1.0, -1.0)


def test_bmm_declines_what_it_does_not_take():
    a = np.ones((2, 3, 4), np.float32)
    b = np.ones((2, 4, 5), np.float32)
    out = np.full((2, 3, 5), 7.0, np.float32)
    assert gemm.bmm(a.astype(np.float64), b, out) is False  # another dtype
    assert gemm.bmm(a, b, np.ones((2, 5, 3), np.float32).swapaxes(1, 2)) is False  # out not C-contiguous
    assert gemm.bmm(a, np.ones((2, 5, 5), np.float32), out) is False  # inner sizes differ
    assert gemm.bmm(a, np.ones((3, 4, 5), np.float32), np.ones((3, 3, 5), np.float32)) is False  # batch 2 vs 3
    assert gemm.bmm(a[0, 0], b, out) is False  # rank 1: numpy's vector rules
    assert gemm.bmm(a, b, np.ones((2, 3, 5), np.float32)[..., :]) is True
    ro = np.ones((2, 3, 5), np.float32)
    ro.flags.writeable = False
    assert gemm.bmm(a, b, ro) is False
    np.testing.assert_array_equal(out, 7.0)


def test_bmm_declines_an_out_sharing_memory_with_an_operand():
    buf = np.arange(2 * 4 * 4, dtype=np.float32).reshape(2, 4, 4)
    before = buf.copy()
    flat = np.zeros(64, np.float32)
    a = flat[:32].reshape(2, 4, 4)
    b = flat[16:48].reshape(2, 4, 4)
    assert gemm.bmm(a, b, flat[32:64].reshape(2, 4, 4)) is False  # out overlaps b
    assert gemm.bmm(buf, buf, np.empty((2, 4, 4), np.float32)) is True  # reading one array twice is fine
    np.testing.assert_array_equal(buf, before)


def _bmm_node(transpose_b: bool) -> XNode:
    return XNode("XNNBatchMatrixMultiply", {"input1_id": 1, "input2_id": 2, "output_id": 3,
                                            "flags": 1 if transpose_b else 0})


@pytest.mark.parametrize("transpose_b", [False, True])
def test_host_op_runs_bmm_and_falls_back_to_numpy(monkeypatch, transpose_b):
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
    cache = rng.standard_normal((1, 8, 128, 64)).astype(np.float32)
    b = cache if transpose_b else np.ascontiguousarray(cache.swapaxes(-1, -2))
    op = _host.make_host_op(_bmm_node(transpose_b), [q.shape, b.shape], (1, 8, 1, 128))
    out = np.empty((1, 8, 1, 128), np.float32)
    calls = []
    real = gemm.bmm

    def counting(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(_host, "_bmm", counting)
    op.into([q, b], out)
    assert calls == [(1, 8, 1, 64)]
    _close(out, q, np.swapaxes(b, -1, -2) if transpose_b else b)
    monkeypatch.setattr(_host, "_bmm", lambda *a: False)  # declined: numpy's matmul, same numbers to rounding
    out2 = np.empty_like(out)
    op.into([q, b], out2)
    np.testing.assert_allclose(out2, out, rtol=1e-5, atol=1e-5)


def _decode_logits(pte: bytes, threads: int, steps: int) -> list[np.ndarray]:
    from edgeport.runtime import Runtime

    method = Runtime.get().load_program(pte).load_method(
        backend_options={"XnnpackBackend": {"num_threads": threads}})
    return greedy_decode(method, steps)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", ["llama", pytest.param("qwen2", marks=pytest.mark.slow)])
def test_decoder_steps_match_the_numpy_path_and_eager(monkeypatch, name, threads):
    """Prefill + decode steps of a Hugging Face decoder with the attention products on bmm, against the same
    program with them on numpy's matmul (the path before), and the greedy tokens against eager PyTorch."""
    model, pte = small_decoder(name, None)
    calls = []
    real = _host._bmm

    def counting(*args):
        done = real(*args)
        calls.append(done)
        return done

    monkeypatch.setattr(_host, "_bmm", counting)
    fast = _decode_logits(pte, threads, 8)
    assert calls and all(calls), "no attention product ran on bmm"
    monkeypatch.setattr(_host, "_bmm", lambda *a: False)
    slow = _decode_logits(pte, threads, 8)
    for f, s in zip(fast, slow, strict=True):
        np.testing.assert_allclose(f, s, rtol=1e-4, atol=1e-4)
    ours = [int(np.argmax(o.reshape(-1, o.shape[-1])[-1])) for o in fast]
    assert ours == eager_greedy_tokens(model, DECODE_PROMPT, 9)


def _scores_segment(scale_first: bool, clamp: bool = False):
    """The attention-score nodes of a decode step as one host segment: K [8, 128, 64] transposed, times a
    one-element scale (a delegate input), then q @ (K^T * s)."""
    mul = {"input1_id": 6, "input2_id": 5, "output_id": 7, "flags": 0} if scale_first else \
        {"input1_id": 5, "input2_id": 6, "output_id": 7, "flags": 0}
    nodes = [
        XNode("XNNStaticTranspose", {"num_dims": 3, "perm": [0, 2, 1], "input_id": 3, "output_id": 4, "flags": 0}),
        XNode("XNNStaticReshape", {"num_dims": 4, "new_shape": [1, 8, 64, 128], "input_id": 4, "output_id": 5,
                                   "flags": 0}),
        XNode("XNNMultiply", mul),
        XNode("XNNStaticReshape", {"num_dims": 3, "new_shape": [8, 64, 128], "input_id": 7, "output_id": 8,
                                   "flags": 0}),
        XNode("XNNBatchMatrixMultiply", {"input1_id": 1, "input2_id": 8, "output_id": 9, "flags": 0}),
        XNode("XNNStaticReshape", {"num_dims": 4, "new_shape": [1, 8, 1, 128], "input_id": 9, "output_id": 10,
                                   "flags": 0}),
    ]
    if clamp:
        nodes[2].output_min_max = (-1.0, 1.0)
    shapes = {1: (8, 1, 64), 3: (8, 128, 64), 4: (8, 64, 128), 5: (1, 8, 64, 128), 6: (1,), 7: (1, 8, 64, 128),
              8: (8, 64, 128), 9: (8, 1, 128), 10: (1, 8, 1, 128)}
    ops = [_host.make_host_op(n, [shapes[i] for i in n.inputs()], shapes[n.outputs()[0]]) for n in nodes]
    return _host.HostSegment(nodes, ops, {10}, shapes.__getitem__)


@pytest.mark.parametrize("scale_first", [False, True])
def test_a_scalar_multiply_feeding_a_product_is_fused_into_it(monkeypatch, scale_first):
    rng = np.random.default_rng(6)
    env = {1: rng.standard_normal((8, 1, 64)).astype(np.float32),
           3: rng.standard_normal((8, 128, 64)).astype(np.float32), 6: np.array([0.35355339], np.float32)}
    calls = []
    real = _host._bmm

    def counting(*args):
        calls.append(args[3:])
        return real(*args)

    fused = _scores_segment(scale_first)
    monkeypatch.setattr(_host, "_bmm", counting)
    out = np.full((1, 8, 1, 128), np.nan, np.float32)
    fused.run({**env, 10: out})
    assert len(calls) == 1 and calls[0][-1] == float(env[6][0])  # one call, the scale passed to it
    want = np.matmul(env[1], np.multiply(env[3].transpose(0, 2, 1), env[6]))
    _close(out.reshape(8, 1, 128), env[1], np.multiply(env[3].transpose(0, 2, 1), env[6]))
    np.testing.assert_allclose(out.reshape(8, 1, 128), want, rtol=1e-5, atol=1e-5)
    # declined at run time: the multiply and numpy's product, as the unfused segment runs them, bit for bit
    monkeypatch.setattr(_host, "_bmm", lambda *a: False)
    out2 = np.empty_like(out)
    fused.run({**env, 10: out2})
    monkeypatch.setattr(_host, "_bmm", None)  # no kernel at planning: the numpy program per node
    plain = _scores_segment(scale_first)
    out3 = np.empty_like(out)
    plain.run({**env, 10: out3})
    np.testing.assert_array_equal(out2.view(np.uint32), out3.view(np.uint32))


def test_a_clamped_or_materialized_multiply_is_not_fused(monkeypatch):
    calls = []
    real = _host._bmm
    monkeypatch.setattr(_host, "_bmm", lambda *a: calls.append(len(a)) or real(*a))
    seg = _scores_segment(False, clamp=True)
    rng = np.random.default_rng(7)
    env = {1: rng.standard_normal((8, 1, 64)).astype(np.float32),
           3: rng.standard_normal((8, 128, 64)).astype(np.float32), 6: np.array([0.5], np.float32)}
    out = np.empty((1, 8, 1, 128), np.float32)
    seg.run({**env, 10: out})
    assert calls == [3]  # the product alone (no scale argument): the clamped multiply ran by itself
    want = np.matmul(env[1], np.clip(env[3].transpose(0, 2, 1) * np.float32(0.5), -1, 1))
    np.testing.assert_allclose(out.reshape(8, 1, 128), want, rtol=1e-5, atol=1e-5)
