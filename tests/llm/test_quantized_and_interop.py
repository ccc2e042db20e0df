"""8da4w decoders (torchao ``quantize_``) lowered to XNNPACK, and ExecuTorch's own stateful decoder program on
edgeport's runtime.

Oracles: the torchao-quantized eager model (teacher-forced top-1 agreement and logits SQNR), and eager PyTorch for
ExecuTorch's program.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("torchao")
pytest.importorskip("edgeport_xnnpack")

from edgeport.llm import export_decoder  # noqa: E402
from edgeport.llm.export import _quantize  # noqa: E402
from edgeport.runtime import Runtime  # noqa: E402
from edgeport.testing.decoders import DECODERS, greedy_reference  # noqa: E402
from edgeport.testing.stock_runtime import run_steps  # noqa: E402

CONTEXT = 48
STEPS = 36


def _tokens() -> list[int]:
    return [int(t) for t in np.random.default_rng(0).integers(3, 128, size=STEPS)]


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(np.sum((ref - got) ** 2.0), 1e-30)))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def quantized(request):
    """(name, program bytes, torchao-quantized eager logits per teacher-forced step)."""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model = DECODERS[request.param]()
    exported = export_decoder(copy.deepcopy(model), max_seq_len=16, max_context_len=CONTEXT, quantize="8da4w",
                              group_size=32)
    reference = copy.deepcopy(model)
    _quantize(reference, "8da4w", None, 32)
    module = TorchExportableModuleForDecoderOnlyLM(reference, batch_size=1, max_cache_len=CONTEXT).model
    with torch.no_grad():
        logits = [module(input_ids=torch.tensor([[t]]), cache_position=torch.tensor([i]))[0, -1].numpy()
                  for i, t in enumerate(_tokens())]
    return request.param, exported.manager.buffer, logits


def _steps() -> list[list[np.ndarray]]:
    return [[np.array([[t]], dtype=np.int64), np.array([i], dtype=np.int64)] for i, t in enumerate(_tokens())]


def test_8da4w_matches_the_torchao_model_on_edgeport_runtime(quantized):
    name, pte, reference = quantized
    method = Runtime.get().load_program(pte).load_method(backend_options={"XnnpackBackend": {"num_threads": 1}})
    got = [method.execute(step)[0][0, -1] for step in _steps()]
    agree = np.mean([np.argmax(r) == np.argmax(g) for r, g in zip(reference, got)])
    sqnr = min(_sqnr(r, g) for r, g in zip(reference, got))
    assert agree >= 0.95, f"{name}: top-1 agreement {agree:.2%}"
    assert sqnr > 25, f"{name}: worst-step logits SQNR {sqnr:.1f} dB"


def test_8da4w_runs_on_the_stock_runtime(quantized):
    name, pte, reference = quantized
    result = run_steps(pte, _steps())
    assert result.ok, result.describe() + "\n" + result.log
    got = [outs[0][0, -1] for outs in result.outputs]
    agree = np.mean([np.argmax(r) == np.argmax(g) for r, g in zip(reference, got)])
    assert agree >= 0.95, f"{name}: top-1 agreement on the stock runtime {agree:.2%}"


@pytest.fixture(scope="module", params=["4", "8"])
def embedding_quantized(request):
    """8da4w linears plus torchao ``IntxWeightOnlyConfig`` embeddings (4 / 8 bit), dynamic prefill length: the
    program, and the torchao-quantized eager model's logits of a 5-token prefill and teacher-forced steps."""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model = DECODERS["llama"]()
    exported = export_decoder(copy.deepcopy(model), max_seq_len=16, max_context_len=CONTEXT, quantize="8da4w",
                              quantize_embedding=request.param, group_size=32)
    reference = copy.deepcopy(model)
    _quantize(reference, "8da4w", request.param, 32)
    module = TorchExportableModuleForDecoderOnlyLM(reference, batch_size=1, max_cache_len=CONTEXT).model
    tokens = _tokens()
    with torch.no_grad():
        prefill = module(input_ids=torch.tensor([tokens[:5]]), cache_position=torch.arange(5))[0].numpy()
        logits = [module(input_ids=torch.tensor([[t]]), cache_position=torch.tensor([i]))[0, -1].numpy()
                  for i, t in enumerate(tokens) if i >= 5]
    return request.param, exported.manager.buffer, prefill, logits


def _prefill_then_steps() -> list[list[np.ndarray]]:
    tokens = _tokens()
    return [[np.array([tokens[:5]], dtype=np.int64), np.arange(5, dtype=np.int64)], *_steps()[5:]]


def _check_embedding_quantized(name: str, outputs: list, prefill: np.ndarray, reference: list) -> None:
    first = np.asarray(outputs[0])[0]
    assert first.shape == prefill.shape
    assert np.mean(np.argmax(first, -1) == np.argmax(prefill, -1)) >= 0.8, f"{name}: prefill top-1"
    got = [np.asarray(o)[0, -1] for o in outputs[1:]]
    agree = np.mean([np.argmax(r) == np.argmax(g) for r, g in zip(reference, got)])
    assert agree >= 0.95, f"{name}: top-1 agreement {agree:.2%}"
    assert min(_sqnr(r, g) for r, g in zip(reference, got)) > 25


def test_quantized_embeddings_with_a_dynamic_prefill_on_edgeport_runtime(embedding_quantized):
    """Regression: the embedding's weight-only dequantize was kept whole for XNNPACK, not delegated, and the
    lowered program's second decomposition failed on the delegates' dynamic shapes."""
    bits, pte, prefill, reference = embedding_quantized
    method = Runtime.get().load_program(pte).load_method(backend_options={"XnnpackBackend": {"num_threads": 1}})
    outputs = [method.execute(step)[0] for step in _prefill_then_steps()]
    _check_embedding_quantized(f"int{bits} embedding", outputs, prefill, reference)


def test_quantized_embeddings_on_the_stock_runtime(embedding_quantized):
    bits, pte, prefill, reference = embedding_quantized
    result = run_steps(pte, _prefill_then_steps())
    assert result.ok, result.describe() + "\n" + result.log
    _check_embedding_quantized(f"int{bits} embedding (stock)", [o[0] for o in result.outputs], prefill, reference)


def test_edgeport_runs_executorch_s_stateful_decoder_with_eager_tokens():
    """ExecuTorch 1.5.1 lowers the same exported module with its XnnpackPartitioner; edgeport's runtime generates
    the eager tokens with it."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    from edgeport.llm import GenerationConfig, LlmMetadata, TextRunner

    prompt, new = [1, 17, 42, 9, 100], 24
    reference = greedy_reference(DECODERS["llama"](), prompt, new, CONTEXT)
    wrapper = TorchExportableModuleForDecoderOnlyLM(DECODERS["llama"](), batch_size=1, max_cache_len=CONTEXT)
    seq = torch.export.Dim("seq_len", min=1, max=16)
    ep = wrapper.export(input_ids=torch.zeros((1, 4), dtype=torch.long), cache_position=torch.arange(4),
                        dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}})
    metadata = LlmMetadata(max_seq_len=16, max_context_len=CONTEXT, vocab_size=128, bos_id=1, eos_ids=(2,))
    pte = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                      constant_methods=metadata.constant_methods()).to_executorch().buffer
    runner = TextRunner(pte, backend_options={"XnnpackBackend": {"num_threads": 1}})
    assert runner.generate(prompt, GenerationConfig(max_new_tokens=new, stop_on_eos=False)).tokens == reference


def test_undelegated_torchao_quantization_runs_on_portable_kernels():
    """torchao's dynamic quantization left to the CPU (no partitioner): its decomposition writes
    ``sub.Tensor(-128, x)``; the edge pass makes the number a 0-dim tensor, and both runtimes match torchao eager."""
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    import edgeport
    from edgeport.testing.stock_runtime import run_program

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    x = torch.randn(3, 64)
    pte = edgeport.to_edge(torch.export.export(model, (x,))).to_executorch().buffer
    with torch.no_grad():
        want = model(x).numpy()
    got = Runtime.get().load_program(pte).load_method().execute([x.numpy()])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    stock = run_program(pte, [x.numpy()])
    assert stock.ok, stock.describe() + "\n" + stock.log
    np.testing.assert_allclose(stock.outputs[0], want, rtol=1e-5, atol=1e-6)
