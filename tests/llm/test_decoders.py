"""Hugging Face decoders with a static KV cache, lowered to XNNPACK: greedy generation on edgeport's runtime and on
the stock ExecuTorch runtime (child process) gives the tokens eager PyTorch gives with the same module."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("edgeport_xnnpack")

from edgeport.llm import GenerationConfig, LlmMetadata, TextRunner, export_decoder  # noqa: E402
from edgeport.runtime import Runtime  # noqa: E402
from edgeport.testing.decoders import DECODERS, greedy_reference  # noqa: E402
from edgeport.testing.stock_runtime import run_steps  # noqa: E402

PROMPT = [1, 17, 42, 9, 100, 5, 77]
NEW = 24
CONTEXT = 48


@pytest.fixture(scope="module")
def programs():
    cache: dict[str, tuple[bytes, list[int]]] = {}

    def get(name: str) -> tuple[bytes, list[int]]:
        if name not in cache:
            reference = greedy_reference(DECODERS[name](), PROMPT, NEW, CONTEXT)
            exported = export_decoder(DECODERS[name](), max_seq_len=16, max_context_len=CONTEXT)
            cache[name] = (exported.manager.buffer, reference)
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_greedy_tokens_match_eager_on_edgeport_runtime(programs, name):
    pte, reference = programs(name)
    runner = TextRunner(pte, backend_options={"XnnpackBackend": {"num_threads": 1}})
    result = runner.generate(PROMPT, GenerationConfig(max_new_tokens=NEW, stop_on_eos=False))
    assert result.tokens == reference
    assert result.stats.generated_tokens == NEW and result.stats.stop_reason == "max_new_tokens"
    # a second generation on the same loaded method starts over (the cache is rewritten from position 0)
    assert runner.generate(PROMPT, GenerationConfig(max_new_tokens=NEW, stop_on_eos=False)).tokens == reference


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_stock_runtime_generates_the_same_tokens(programs, name):
    """Teacher-forced on the eager tokens: every step's argmax must be the next eager token, which is exactly
    the condition for free-running greedy generation to produce the same sequence."""
    pte, reference = programs(name)
    steps = [[np.array([PROMPT], dtype=np.int64), np.arange(len(PROMPT), dtype=np.int64)]]
    for i, token in enumerate(reference[:-1]):
        steps.append([np.array([[token]], dtype=np.int64), np.array([len(PROMPT) + i], dtype=np.int64)])
    result = run_steps(pte, steps)
    assert result.ok, result.describe() + "\n" + result.log
    tokens = [int(np.argmax(outs[0][0, -1])) for outs in result.outputs]
    assert tokens == reference


def test_metadata_methods_are_executorch_s(programs):
    pte, _ = programs("llama")
    program = Runtime.get().load_program(pte)
    meta = LlmMetadata.read(program)
    assert (meta.max_seq_len, meta.max_context_len, meta.vocab_size, meta.bos_id, meta.eos_ids) == (16, CONTEXT, 128,
                                                                                                    1, (2,))
    assert meta.use_kv_cache and meta.enable_dynamic_shape and meta.n_layers == 2
    assert program.load_method("get_eos_ids").execute([]) == [2]
    assert program.load_method("use_kv_cache").execute([]) == [True]


def test_prefill_longer_than_max_seq_len_is_chunked(programs):
    pte, _ = programs("llama")
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 128, size=37)]  # 3 chunks of <= 16
    reference = greedy_reference(DECODERS["llama"](), prompt, 8, CONTEXT)
    runner = TextRunner(pte, backend_options={"XnnpackBackend": {"num_threads": 1}})
    assert runner.generate(prompt, GenerationConfig(max_new_tokens=8, stop_on_eos=False)).tokens == reference


def test_bad_input_gets_clear_errors(programs):
    pte, _ = programs("llama")
    runner = TextRunner(pte)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 128\)"):
        runner.generate([1, 500])
    with pytest.raises(ValueError, match="integers"):
        runner.generate(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="context is 48"):
        runner.generate(list(range(1, 41)), GenerationConfig(max_new_tokens=20))
    with pytest.raises(ValueError, match="context of 48"):
        runner.prefill(list(range(1, 50)))
    method = Runtime.get().load_program(pte).load_method()
    with pytest.raises(Exception, match="(?i)index|out of|bound"):  # a position past the cache
        method.execute([np.array([[3]], dtype=np.int64), np.array([CONTEXT + 5], dtype=np.int64)])
