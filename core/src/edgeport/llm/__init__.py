"""Generative models on edgeport: export a Hugging Face decoder with its KV cache as program state
(:func:`export_llm`, :func:`export_decoder`) and generate text with it on edgeport's runtime (:class:`TextRunner`,
:class:`TextGenerator`), with ExecuTorch's LLM metadata and runner semantics.

The runner needs neither torch nor transformers; exporting needs both (``pip install 'edgeport[llm]'``).
"""

from __future__ import annotations

from typing import Any

from edgeport.llm.metadata import METADATA_METHODS, LlmMetadata
from edgeport.llm.runner import GenerationConfig, GenerationResult, GenerationStats, TextRunner
from edgeport.llm.sampling import Sampler, SamplingConfig

__all__ = ["METADATA_METHODS", "GenerationConfig", "GenerationResult", "GenerationStats", "LlmMetadata", "Sampler",
           "SamplingConfig", "TextGenerator", "TextRunner", "export_decoder", "export_llm", "load_tokenizer"]


def __getattr__(name: str) -> Any:  # export needs torch: imported on first use, so the runner stays torch-free
    if name in ("export_decoder", "export_llm", "load_checkpoint", "QUANTIZATION_SCHEMES"):
        from edgeport.llm import export

        return getattr(export, name)
    if name in ("load_tokenizer", "TextGenerator"):
        from edgeport.llm import generator

        return getattr(generator, name)
    raise AttributeError(name)
