"""Hugging Face causal LMs from small configs (random weights, no download) for the generation tests: Llama-,
Qwen2-, Phi-3-, Gemma-style decoders (grouped-query attention where the family has it) and GPT-2.

``DECODERS[name](seed=0, size="small")`` returns the model in eval mode with its generation config set for a
static cache. ``size="small"`` (hidden 32, 2 layers, vocabulary 128) builds in well under a second; ``"medium"``
(hidden 512, 4 layers, vocabulary 4096) is the benchmark size. ``transformers`` is a test-only dependency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["DECODERS", "SIZES", "greedy_reference"]

SIZES = {
    "small": {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 64, "vocab": 128},
    "medium": {"hidden": 512, "layers": 4, "heads": 8, "kv_heads": 2, "ffn": 1536, "vocab": 4096},
    # Llama-3.2-1B's shapes (random weights: for benchmarks only)
    "1b": {"hidden": 2048, "layers": 16, "heads": 32, "kv_heads": 8, "ffn": 8192, "vocab": 128256},
}


def _build(family: str) -> Callable[..., Any]:
    def build(seed: int = 0, size: str = "small") -> Any:
        import torch
        import transformers

        s = SIZES[size]
        common = {"vocab_size": s["vocab"], "hidden_size": s["hidden"], "intermediate_size": s["ffn"],
                  "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
                  "num_key_value_heads": s["kv_heads"], "max_position_embeddings": 4096,
                  "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": family in ("gemma", "qwen2")}
        torch.manual_seed(seed)
        if family == "llama":
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
        elif family == "qwen2":
            model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
        elif family == "phi3":
            model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**common, pad_token_id=0))
        elif family == "gemma":
            model = transformers.GemmaForCausalLM(transformers.GemmaConfig(
                **common, head_dim=s["hidden"] // s["heads"], pad_token_id=0))
        elif family == "gpt2":
            model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
                vocab_size=s["vocab"], n_embd=s["hidden"], n_layer=s["layers"], n_head=s["heads"],
                n_positions=4096, bos_token_id=1, eos_token_id=2))
        else:  # pragma: no cover
            raise KeyError(family)
        model.eval()
        model.generation_config.use_cache = True
        model.generation_config.cache_implementation = "static"
        return model

    build.__name__ = f"build_{family}"
    return build


DECODERS: dict[str, Callable[..., Any]] = {f: _build(f) for f in ("llama", "qwen2", "phi3", "gemma", "gpt2")}


def greedy_reference(model: Any, prompt: list[int], new_tokens: int, max_context_len: int) -> list[int]:
    """Greedy tokens of ``model`` in eager PyTorch through the same static-cache module the export uses
    (``TorchExportableModuleForDecoderOnlyLM``): the oracle for generation tests."""
    import torch
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    module = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=max_context_len).model
    out: list[int] = []
    with torch.no_grad():
        logits = module(input_ids=torch.tensor([prompt]), cache_position=torch.arange(len(prompt)))
        for i in range(new_tokens):
            token = int(logits[0, -1].argmax())
            out.append(token)
            if i + 1 == new_tokens:
                break
            pos = len(prompt) + i
            logits = module(input_ids=torch.tensor([[token]]), cache_position=torch.tensor([pos]))
    return out
