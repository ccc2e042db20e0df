"""ExecuTorch's tuned LLM programs (its Llama with ``llama::update_cache`` / ``llama::custom_sdpa``, XNNPACK) on
edgeport's runtime.

Oracles: ExecuTorch's own implementations of the ``llama::`` ops (its AOT library, eagerly in PyTorch) for the
portable kernels; ExecuTorch's runtime (a child process) and ExecuTorch's eager Llama module for whole programs
built by ``bench/et_tuned_llama.py`` (``export_llama``). Building a program takes ExecuTorch's whole export flow,
so the program tests are marked slow.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")
pytest.importorskip("edgeport_xnnpack")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import et_tuned_llama as etl  # noqa: E402

from edgeport.errors import RuntimeExecutionError  # noqa: E402
from edgeport.llm import GenerationConfig, TextRunner  # noqa: E402
from edgeport.program.reader import load_pte  # noqa: E402
from edgeport.runtime import Runtime  # noqa: E402
from edgeport.runtime.portable import KERNELS  # noqa: E402

PROMPT = [1, 17, 42, 9, 100, 5, 77]
NEW = 24
XNN = {"XnnpackBackend": {"num_threads": 1}}


@pytest.fixture(scope="module")
def llama():
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 - registers torch.ops.llama

    return torch.ops.llama


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- kernels against ExecuTorch's implementations ------------------------------------------------------------
@pytest.mark.parametrize("start,seq", [(0, 1), (0, 5), (3, 1), (6, 4), (9, 1)])
def test_update_cache_matches_executorch(llama, start, seq):
    value, cache = _rand(1, seq, 2, 8, seed=1), _rand(1, 10, 2, 8, seed=2)
    expected = torch.from_numpy(cache.copy())
    llama.update_cache(torch.from_numpy(value), expected, start)
    out = np.empty((1,), np.float32)
    KERNELS["llama::update_cache.out"](value, cache, start, out)
    np.testing.assert_array_equal(cache, expected.numpy())


def test_update_cache_with_indices_matches_executorch(llama):
    value, cache = _rand(2, 3, 2, 4, seed=3), _rand(2, 8, 2, 4, seed=4)
    indices = np.array([[5, 0, 7], [1, 2, 6]], dtype=np.int64)
    expected = torch.from_numpy(cache.copy())
    llama.update_cache_with_indices(torch.from_numpy(value), expected, 0, torch.from_numpy(indices))
    KERNELS["llama::update_cache_with_indices.out"](value, cache, 0, indices, np.empty((1,), np.float32))
    np.testing.assert_array_equal(cache, expected.numpy())


SDPA_CASES = [  # (batch, q heads, kv heads, head dim, cache, start, seq, causal, masked, scale)
    (1, 4, 2, 16, 12, 0, 7, True, False, None),   # prefill, grouped-query attention
    (1, 4, 2, 16, 12, 7, 1, True, False, None),   # decode
    (1, 8, 8, 8, 20, 5, 6, True, False, 0.3),     # chunked prefill, custom scale
    (2, 6, 2, 8, 10, 2, 3, False, False, None),   # not causal: the first start + seq keys
    (1, 4, 1, 16, 9, 0, 3, False, True, None),    # mask over every key of the cache
]


@pytest.mark.parametrize("case", SDPA_CASES)
def test_custom_sdpa_matches_executorch(llama, case):
    b, hq, hkv, d, size, start, seq, causal, masked, scale = case
    q, k, v = _rand(b, seq, hq, d, seed=5), _rand(b, size, hkv, d, seed=6), _rand(b, size, hkv, d, seed=7)
    mask = None
    if masked:
        mask = np.where(np.random.default_rng(8).random((seq, size)) < 0.3, -np.inf, 0).astype(np.float32)
        mask[:, 0] = 0
    t = torch.from_numpy
    expected = llama.custom_sdpa(t(q), t(k), t(v), start, None if mask is None else t(mask), 0.0, causal,
                                 scale).numpy()
    out = np.full((b, seq + 3, hq, d), np.nan, np.float32)[:, :seq]  # a planned buffer larger than needed
    got = KERNELS["llama::custom_sdpa.out"](q, k, v, start, mask, 0.0, causal, scale, np.ascontiguousarray(out))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("start,seq", [(0, 4), (4, 1), (9, 3)])
def test_sdpa_with_kv_cache_matches_executorch(llama, start, seq):
    q, k, v = _rand(1, seq, 4, 8, seed=9), _rand(1, seq, 2, 8, seed=10), _rand(1, seq, 2, 8, seed=11)
    kc, vc = _rand(1, 12, 2, 8, seed=12), _rand(1, 12, 2, 8, seed=13)
    tkc, tvc = torch.from_numpy(kc.copy()), torch.from_numpy(vc.copy())
    t = torch.from_numpy
    expected = llama.sdpa_with_kv_cache(t(q), t(k), t(v), tkc, tvc, start, seq, None, 0.0, True).numpy()
    got = KERNELS["llama::sdpa_with_kv_cache.out"](q, k, v, kc, vc, start, seq, None, 0.0, True, None,
                                                   np.empty_like(q))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-6)
    np.testing.assert_array_equal(kc, tkc.numpy())
    np.testing.assert_array_equal(vc, tvc.numpy())


@pytest.mark.parametrize("shape", [(4, 1), (3, 8), (2, 5, 64)])
def test_fast_hadamard_transform_matches_executorch(llama, shape):
    mat = _rand(*shape, seed=14)
    expected = llama.fast_hadamard_transform(torch.from_numpy(mat)).numpy()
    got = KERNELS["llama::fast_hadamard_transform.out"](mat, np.empty_like(mat))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_kernels_refuse_bad_input_clearly():
    f32 = np.float32
    cache = np.zeros((1, 8, 2, 4), f32)
    update = KERNELS["llama::update_cache.out"]
    with pytest.raises(RuntimeExecutionError, match=r"runs past the cache of 8 positions"):
        update(np.ones((1, 1, 2, 4), f32), cache, 8, np.empty(1, f32))
    with pytest.raises(RuntimeExecutionError, match=r"runs past the cache of 8 positions"):
        update(np.ones((1, 3, 2, 4), f32), cache, 6, np.empty(1, f32))
    with pytest.raises(RuntimeExecutionError, match="negative"):
        update(np.ones((1, 1, 2, 4), f32), cache, -1, np.empty(1, f32))
    with pytest.raises(RuntimeExecutionError, match="differ in dim 2"):
        update(np.ones((1, 1, 3, 4), f32), cache, 0, np.empty(1, f32))
    with pytest.raises(RuntimeExecutionError, match="same dtype"):
        update(np.ones((1, 1, 2, 4), np.float64), cache, 0, np.empty(1, f32))
    assert not cache.any()  # nothing written by a refused update
    with pytest.raises(RuntimeExecutionError, match=r"index 8 is outside the cache of 8 positions"):
        KERNELS["llama::update_cache_with_indices.out"](np.ones((1, 2, 2, 4), f32), cache, 0,
                                                        np.array([[0, 8]], np.int64), np.empty(1, f32))
    sdpa = KERNELS["llama::custom_sdpa.out"]
    q = np.ones((1, 2, 4, 4), f32)
    with pytest.raises(RuntimeExecutionError, match=r"run past the 8 cached positions"):
        sdpa(q, cache, cache, 7, None, 0.0, True, None, np.empty_like(q))
    with pytest.raises(RuntimeExecutionError, match="not a multiple of"):
        sdpa(np.ones((1, 2, 3, 4), f32), cache, cache, 0, None, 0.0, True, None, np.empty((1, 2, 3, 4), f32))
    with pytest.raises(RuntimeExecutionError, match=r"attn_mask \[2, 4\] must be \[seq, keys\] = \[2, 8\]"):
        sdpa(q, cache, cache, 0, np.zeros((2, 4), f32), 0.0, False, None, np.empty_like(q))
    with pytest.raises(RuntimeExecutionError, match="cannot both be set"):
        sdpa(q, cache, cache, 0, np.zeros((2, 8), f32), 0.0, True, None, np.empty_like(q))
    with pytest.raises(RuntimeExecutionError, match="4-dimensional"):
        sdpa(q[0], cache, cache, 0, None, 0.0, True, None, np.empty_like(q))
    with pytest.raises(RuntimeExecutionError, match="power of two"):
        KERNELS["llama::fast_hadamard_transform.out"](np.ones((2, 6), f32), np.empty((2, 6), f32))


# -- whole programs --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tuned():
    cache: dict[str, etl.TunedProgram] = {}

    def get(scheme: str) -> etl.TunedProgram:
        if scheme not in cache:
            cache[scheme] = etl.build_tuned("small", scheme, eager=scheme == "fp32")
        return cache[scheme]

    return get


def _edgeport_greedy(pte: bytes) -> tuple[list[int], np.ndarray]:
    runner = TextRunner(pte, backend_options=XNN)
    logits: list[np.ndarray] = []
    forward = runner._forward

    def recording(tokens, start):
        logits.append(np.array(forward(tokens, start)))
        return logits[-1]

    runner._forward = recording  # record each step's logits (the runner's own prefill/decode loop runs)
    result = runner.generate(PROMPT, GenerationConfig(max_new_tokens=NEW, stop_on_eos=False))
    return result.tokens, np.stack(logits)


def _sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - got) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise)


@pytest.mark.slow
@pytest.mark.executorch
def test_tuned_program_calls_the_llama_ops_and_carries_executorch_metadata(tuned):
    program = load_pte(tuned("fp32").pte).program
    forward = next(p for p in program.execution_plan if p.name == "forward")
    ops = {f"{o.name}.{o.overload}" for o in forward.operators}
    assert {"llama::update_cache.out", "llama::custom_sdpa.out"} <= ops
    assert any(d.id == "XnnpackBackend" for d in forward.delegates)
    runner = TextRunner(tuned("fp32").pte)
    meta = runner.metadata
    assert (meta.max_seq_len, meta.max_context_len, meta.vocab_size, meta.n_layers) == (64, 64, 128, 2)
    assert meta.use_kv_cache and meta.use_sdpa_with_kv_cache and meta.enable_dynamic_shape
    assert runner._positions_shape == (1,)  # ExecuTorch's llama export takes the start position


@pytest.mark.slow
@pytest.mark.executorch
def test_fp32_greedy_tokens_match_executorch_runtime_and_eager(tuned):
    built = tuned("fp32")
    et_tokens, et_logits = etl.et_greedy_in_child(built.pte, PROMPT, NEW)
    ours, our_logits = _edgeport_greedy(built.pte)
    eager_tokens, eager_logits = etl.greedy(lambda ids, start: built.eager_logits(ids[0].tolist(), start), PROMPT,
                                            NEW)
    assert et_tokens == eager_tokens, "ExecuTorch's runtime disagrees with its eager module"
    assert ours == et_tokens
    np.testing.assert_allclose(our_logits, et_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(our_logits, np.stack(eager_logits), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.executorch
def test_8da4w_greedy_tokens_match_executorch_runtime(tuned):
    built = tuned("8da4w")
    ops = {f"{o.name}.{o.overload}" for p in load_pte(built.pte).program.execution_plan for o in p.operators}
    assert "llama::custom_sdpa.out" in ops
    et_tokens, et_logits = etl.et_greedy_in_child(built.pte, PROMPT, NEW)
    ours, our_logits = _edgeport_greedy(built.pte)
    assert ours == et_tokens
    assert _sqnr_db(et_logits, our_logits) > 60


@pytest.mark.slow
@pytest.mark.executorch
def test_position_past_the_cache_is_refused(tuned):
    """The program slices its RoPE tables at the start position before it reaches the cache, so a raw call
    past the cache fails at that view (as on ExecuTorch's runtime, at the same instruction), never crashes; the
    runner names the limit before calling. The llama:: kernels' own checks are tested above."""
    pte = tuned("fp32").pte
    method = Runtime.get().load_program(pte).load_method(backend_options=XNN)
    for tokens, start in (([3], 64), (PROMPT, 60), ([3], 10**6)):
        with pytest.raises(RuntimeExecutionError):
            method.execute([np.array([tokens], dtype=np.int64), np.array([start], dtype=np.int64)])
    out = method.execute([np.array([PROMPT], dtype=np.int64), np.array([0], dtype=np.int64)])[0]
    assert np.isfinite(out).all()  # the method still works after refusing
    runner = TextRunner(pte, backend_options=XNN)
    with pytest.raises(ValueError, match="context of 64 tokens"):
        runner.prefill(PROMPT, start=60)
    with pytest.raises(ValueError, match="context is 64"):
        runner.generate(PROMPT, GenerationConfig(max_new_tokens=64))
