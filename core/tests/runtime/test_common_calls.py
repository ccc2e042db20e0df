"""Load-time rewrites of kernel calls, checked against eager PyTorch: common calls reused
(``edgeport.runtime._cse``: a repeated pure call copies the earlier result, only while nothing wrote over that
result or the call's inputs; bit-identical to a load without reuse) and the fused fully-masked-row guard of
math attention (``edgeport.runtime._fuse``)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import edgeport  # noqa: E402
import edgeport.runtime._method as method_module  # noqa: E402
from edgeport.runtime import Runtime  # noqa: E402
from edgeport.runtime._cse import reuse_alias, reuse_result  # noqa: E402


class Masks(torch.nn.Module):
    """Recomputes the same position mask per "layer" from an input, as HF decoders do from the cache position;
    in between, an in-place update of a buffer that the next mask reads must not be skipped."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("pos", torch.zeros(4, dtype=torch.long))

    def forward(self, x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            mask = torch.where(torch.arange(8) <= start, 0.0, float("-inf"))
            x = torch.softmax(x + mask, dim=-1)
        m1 = torch.where(self.pos.sum() + torch.arange(8) > 2, 1.0, 2.0)
        self.pos.add_(1)  # state: the same expression after this write differs
        m2 = torch.where(self.pos.sum() + torch.arange(8) > 2, 1.0, 2.0)
        return x + m1 + 10 * m2


def _program(model: torch.nn.Module, inputs: tuple) -> bytes:
    return edgeport.to_edge(torch.export.export(model, inputs)).to_executorch().buffer


def _load(pte: bytes, reuse: bool):
    if reuse:
        return Runtime.get().load_program(pte).load_method()
    original = method_module.common_calls
    method_module.common_calls = lambda *a, **k: {}
    try:
        return Runtime.get().load_program(pte).load_method()
    finally:
        method_module.common_calls = original


def _reused_ops(method) -> int:
    return sum(fn is reuse_result or fn is reuse_alias for chain in method._plan.chains for fn, _, _ in chain[0])


def test_reused_results_bound_as_aliases_match_copies_in_a_decoder(monkeypatch):
    """A Hugging Face decoder (static KV cache, XNNPACK): reused calls whose earlier result stays intact until
    their value's last read take it as is (no copy); prefill and decode logits equal those of a load that copies
    every reused result, and the tokens equal eager's."""
    pytest.importorskip("transformers")
    pytest.importorskip("edgeport_xnnpack")
    from edgeport.llm import export_decoder
    from edgeport.testing.decoders import DECODERS, greedy_reference

    model = DECODERS["llama"](seed=1, size="small")
    pte = export_decoder(model, max_seq_len=8, max_context_len=32).manager.buffer
    aliased = Runtime.get().load_program(pte).load_method("forward")
    monkeypatch.setattr(method_module, "alias_reuses", lambda *a, **k: set())
    copied = Runtime.get().load_program(pte).load_method("forward")
    n_alias = sum(fn is reuse_alias for fn, _, _ in aliased._plan.chains[0][0])
    assert n_alias > 0 and not any(fn is reuse_alias for fn, _, _ in copied._plan.chains[0][0])
    assert _reused_ops(aliased) == _reused_ops(copied) == aliased.profile.reused_calls
    prompt, tokens = [3, 14, 15, 92, 6], []
    for m in (aliased, copied):
        out = m.execute([np.array([prompt], dtype=np.int64), np.arange(len(prompt), dtype=np.int64)])[0]
        got = [out]
        for i in range(10):
            tok = int(np.argmax(got[-1].reshape(-1, got[-1].shape[-1])[-1]))
            got.append(m.execute([np.array([[tok]], dtype=np.int64), np.array([len(prompt) + i], dtype=np.int64)])[0])
        tokens.append(got)
    for a, b in zip(*tokens, strict=True):
        np.testing.assert_array_equal(a, b)
    want = greedy_reference(model, prompt, 10, max_context_len=32)
    assert [int(np.argmax(x.reshape(-1, x.shape[-1])[-1])) for x in tokens[0][:10]] == want


def test_repeated_masks_are_reused_and_outputs_match_eager():
    x = torch.randn(2, 8)
    model = Masks()
    pte = _program(Masks(), (x, torch.tensor(3)))
    reused, plain = _load(pte, True), _load(pte, False)
    assert reused.profile.reused_calls == _reused_ops(reused) > 0
    assert plain.profile.reused_calls == 0 == _reused_ops(plain)
    for start in (0, 3, 7, 5):  # stateful: four runs, the buffer advancing each time
        args = (x, torch.tensor(start))
        with torch.no_grad():
            want = model(*args).numpy()
        (got,) = reused.execute([a.numpy() for a in args])
        (ref,) = plain.execute([a.numpy() for a in args])
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got, ref)


def test_an_overwritten_result_is_recomputed():
    """The memory plan reuses the first mask's bytes once it is dead: the third mask (same inputs) must run
    again, and only the second copies the first."""
    x = torch.randn(2, 8)
    method = _load(_program(Masks(), (x, torch.tensor(3))), True)
    les = [fn is reuse_result for chain in method._plan.chains for (fn, _, _), label in zip(chain[0], chain[2])
           if "aten::le.Tensor_out" in label]
    assert les[0] is False and True in les[1:]
    model = Masks()
    for start in (3, 3, 1):
        with torch.no_grad():
            want = model(x, torch.tensor(start)).numpy()
        np.testing.assert_allclose(method.execute([x.numpy(), np.array(start)])[0], want, rtol=1e-6, atol=1e-6)


def test_dynamic_shapes_reuse_with_the_actual_shape():
    class Twice(torch.nn.Module):
        def forward(self, pos: torch.Tensor) -> torch.Tensor:
            a = torch.arange(pos.shape[0]) + pos
            b = torch.arange(pos.shape[0]) + pos
            return (a * 2 + b).float()

    n = torch.export.Dim("n", min=1, max=16)
    ep = torch.export.export(Twice(), (torch.arange(5),), dynamic_shapes={"pos": {0: n}})
    method = Runtime.get().load_program(edgeport.to_edge(ep).to_executorch().buffer).load_method()
    assert method.profile.reused_calls >= 1
    for size in (5, 1, 16, 3):
        pos = torch.arange(size) * 3
        (got,) = method.execute([pos.numpy()])
        np.testing.assert_array_equal(got, Twice()(pos).numpy())


class Attention(torch.nn.Module):
    """SDPA with a float mask: the exported math path guards fully masked rows (eq / logical_not / any /
    logical_not / full_like / where), which the runtime fuses at load."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_masked_row_guard_fused_matches_eager_with_fully_masked_rows():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g) for _ in range(3))
    mask = torch.zeros(1, 1, 4, 4)
    pte = _program(Attention(), (q, k, v, mask))
    method = Runtime.get().load_program(pte).load_method()
    assert method.profile.fused_calls == 5
    for rows in ([], [1], [0, 1, 2, 3]):  # no, one, every row fully masked
        m = torch.triu(torch.full((4, 4), float("-inf")), 1).reshape(1, 1, 4, 4).clone()
        m[..., rows, :] = float("-inf")
        with torch.no_grad():
            want = Attention()(q, k, v, m).numpy()
        (got,) = method.execute([t.numpy() for t in (q, k, v, m)])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert np.isfinite(got).all()


def test_index_put_at_one_position_matches_fancy_indexing():
    from edgeport.runtime.portable.shape import index_put_inplace

    rng = np.random.default_rng(0)
    cases = [([None, None, np.array([5])], (1, 2, 1, 4)), ([None, None, np.array([-1])], (2, 1, 4)),
             ([np.array([0]), None], (1, 1, 4)), ([None, np.array([1], np.int32)], (1, 1, 8, 4))]
    for indices, vshape in cases:
        a = rng.standard_normal((1, 2, 8, 4)).astype(np.float32)
        b = a.copy()
        v = rng.standard_normal(vshape).astype(np.float32)
        index_put_inplace(a, indices, v, False)
        b[tuple(slice(None) if i is None else i for i in indices)] = v
        np.testing.assert_array_equal(a, b)
    with pytest.raises(Exception, match="index"):
        index_put_inplace(np.zeros((2, 3)), [None, np.array([3])], np.zeros(1), False)


def _six_kernels(x: np.ndarray, s: float, dim: int, fill: float, q: np.ndarray) -> np.ndarray:
    """What the unfused eq / logical_not / any / logical_not / full_like / where compute (the oracle)."""
    d = np.logical_not(np.any(np.logical_not(np.equal(x, s)), axis=dim, keepdims=True))
    return np.where(d, np.full(q.shape, fill, q.dtype), q)


def test_masked_row_guard_on_a_shape_per_call():
    """A growing sequence gives the guard a new shape every call (its shape cache starts over past 64): each result
    is what the six kernels give, with and without fully masked rows."""
    from edgeport.runtime._fuse import _guard_op
    from edgeport.runtime.portable.elementwise import where_out

    rng = np.random.default_rng(2)
    guard = _guard_op(float("-inf"), -1, True, 0.0, np.dtype(np.float32), where_out)
    for n in list(range(1, 80)) + list(range(1, 80)):
        x = rng.standard_normal((1, 2, 3, n)).astype(np.float32)
        if n % 3 == 0:
            x[0, 1, 2, :] = -np.inf
        q = rng.random(x.shape).astype(np.float32)
        got = guard(x, q, None, q, np.empty(x.shape, np.float32))
        np.testing.assert_array_equal(got, _six_kernels(x, float("-inf"), -1, 0.0, q))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("s", [float("-inf"), float("inf"), 0.0])
def test_masked_row_guard_on_bytes_that_look_like_the_fill(dtype, s):
    """The guard's shortcut searches a small input's elements for the sign-and-exponent byte of an infinite ``s``:
    bytes like the fill's across two elements, the most negative finite value and -NaN (that byte, not the fill), a
    large input (the exact test only), fully matching rows, NaN and -0.0 give what the six kernels give."""
    from edgeport.runtime._fuse import _guard_op
    from edgeport.runtime.portable.elementwise import where_out

    rng = np.random.default_rng(1)
    cases = []
    straddle = np.zeros((2, 3, 4), np.float32)  # bytes 00 00 80 ff across elements 0 and 1 of a row
    straddle.reshape(-1)[:2] = np.array([0x00001234, 0x3F00FF80], np.uint32).view(np.float32)
    cases.append(straddle.astype(dtype) if dtype is np.float32 else straddle.astype(dtype))
    for shape in ((1, 4, 8, 8), (1, 2, 96, 96)):  # below and above the searched size
        x = rng.standard_normal(shape).astype(dtype)
        cases.append(x.copy())
        huge = x.copy()  # the sign-and-exponent byte of -inf (0xff for float32) on values that are not the fill
        huge[..., 0, :] = np.finfo(dtype).min
        huge[..., 1, 1] = -np.float64(np.nan)
        cases.append(huge)
        x[..., 1, :] = s  # a fully matching row
        x[..., 2, 3:] = s  # a causal-like row
        cases.append(x.copy())
        x[..., 0, 0] = np.nan
        x[..., 3, :] = -0.0 if s == 0.0 else x[..., 3, :]
        cases.append(x)
    guard = _guard_op(s, -1, True, 0.0, np.dtype(dtype), where_out)
    for x in cases * 2:  # twice: the second pass starts from the first-element state the first one left
        q = rng.random(x.shape).astype(dtype)
        out = np.full(x.shape, 7, dtype)
        got = guard(x, q, None, q, out)
        np.testing.assert_array_equal(got, _six_kernels(x, s, -1, 0.0, q))
