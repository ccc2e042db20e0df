"""From a Hugging Face decoder to a text-generation program: static KV cache as state, a dynamic sequence length
for prefill, optional torchao quantization, lowering, and ExecuTorch's LLM metadata as constant methods.

Needs torch, Hugging Face ``transformers`` (its ``TorchExportableModuleForDecoderOnlyLM`` makes the static cache
exportable) and, to quantize, ``torchao``: ``pip install 'edgeport[llm]'``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from edgeport.errors import ExportError
from edgeport.llm.metadata import LlmMetadata

__all__ = ["QUANTIZATION_SCHEMES", "ExportedLlm", "export_decoder", "export_llm", "load_checkpoint"]

#: ``--quantize`` schemes (torchao ``quantize_`` configs on every ``nn.Linear``)
QUANTIZATION_SCHEMES = {
    "8da4w": "int8 dynamic activations, int4 weights per group (Int8DynamicActivationIntxWeightConfig)",
    "8da8w": "int8 dynamic activations, int8 weights per channel (Int8DynamicActivationIntxWeightConfig)",
}
#: ``--quantize-embedding`` schemes (torchao ``IntxWeightOnlyConfig`` on ``nn.Embedding``)
EMBEDDING_SCHEMES = {"4": "int4 weights per group", "8": "int8 weights per channel"}


@dataclass
class ExportedLlm:
    """A lowered generation program (``manager``: an ``ExecutorchProgramManager``) and its metadata."""

    manager: Any
    metadata: LlmMetadata

    def save(self, path: str) -> list[str]:
        """Write the ``.pte`` to ``path`` and, when the weights are stored apart, their ``.ptd`` beside it;
        returns the paths written."""
        self.manager.save(path)
        return [path, *self.manager.write_tensor_data_to_file(os.path.dirname(os.path.abspath(path)))]


def _stage(progress: Callable[[str], None] | None, text: str) -> None:
    if progress is not None:
        progress(text)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ImportError("edgeport.llm export needs Hugging Face transformers: pip install 'edgeport[llm]'") from exc
    return transformers


def load_checkpoint(path: str | os.PathLike[str]) -> Any:
    """A causal LM from a checkpoint directory as ``save_pretrained`` writes it (``config.json`` + safetensors),
    in float32 and eval mode."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint {path!r} is not a directory: give the folder save_pretrained wrote "
                                "(config.json and *.safetensors)")
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"no config.json in {path}: a checkpoint directory holds config.json and the "
                                "weights (*.safetensors), as model.save_pretrained(dir) writes them")
    try:
        with open(config_file, encoding="utf-8") as f:
            json.load(f)
    except ValueError as exc:
        raise ValueError(f"{config_file} is not valid JSON: {exc}") from exc
    import torch

    transformers = _transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


def _check_schemes(quantize: str | None, quantize_embedding: str | None, group_size: int) -> None:
    if quantize is not None and quantize not in QUANTIZATION_SCHEMES:
        raise ValueError(f"unsupported quantization scheme {quantize!r}; supported: "
                         + ", ".join(f"{k} ({v})" for k, v in QUANTIZATION_SCHEMES.items()))
    if quantize_embedding is not None and quantize_embedding not in EMBEDDING_SCHEMES:
        raise ValueError(f"unsupported embedding quantization {quantize_embedding!r}; supported: "
                         + ", ".join(f"{k} ({v})" for k, v in EMBEDDING_SCHEMES.items()))
    if group_size not in (32, 64, 128, 256):
        raise ValueError(f"group size {group_size} is not supported: use 32, 64, 128 or 256")


def _quantize(model: Any, quantize: str | None, quantize_embedding: str | None, group_size: int) -> None:
    """torchao ``quantize_`` in place, as ExecuTorch's LLM flow applies it."""
    if quantize is None and quantize_embedding is None:
        return
    try:
        import torch
        from torchao.quantization import quantize_
        from torchao.quantization.granularity import PerAxis, PerGroup
        from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig
    except ImportError as exc:
        raise ImportError("quantization needs torchao: pip install 'edgeport[quantize]'") from exc
    if quantize_embedding is not None:
        bits = torch.int4 if quantize_embedding == "4" else torch.int8
        granularity = PerGroup(group_size) if quantize_embedding == "4" else PerAxis(0)
        quantize_(model, IntxWeightOnlyConfig(weight_dtype=bits, granularity=granularity),
                  filter_fn=lambda m, _fqn: isinstance(m, torch.nn.Embedding))
    if quantize is not None:
        bits = torch.int4 if quantize == "8da4w" else torch.int8
        granularity = PerGroup(group_size) if quantize == "8da4w" else PerAxis(0)
        quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=bits, weight_granularity=granularity))


def _eos_ids(model: Any) -> list[int]:
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and v not in ids:
                ids.append(v)
    return ids


def export_decoder(model: Any, *, max_seq_len: int = 128, max_context_len: int | None = None,
                   quantize: str | None = None, quantize_embedding: str | None = None, group_size: int = 32,
                   target: str = "cpu", backends: Sequence[str] | None = None, weights_file: str | None = None,
                   progress: Callable[[str], None] | None = None) -> ExportedLlm:
    """Export a Hugging Face causal LM (``model``) with a static KV cache of ``max_context_len`` positions,
    prefill of up to ``max_seq_len`` tokens per call, quantize it (``quantize``: :data:`QUANTIZATION_SCHEMES`),
    lower it for ``target`` (default: XNNPACK) and add ExecuTorch's LLM metadata methods.

    ``weights_file``: a tag; the delegates' weights go to ``<tag>.ptd`` (ExecuTorch's delegate constant tags),
    shipped and updated apart from the program, loaded with ``data_path=``."""
    import torch

    from edgeport.aot.edge import to_edge_transform_and_lower
    from edgeport.targets import partitioners_for

    _check_schemes(quantize, quantize_embedding, group_size)
    context = max_context_len or max_seq_len
    if not (isinstance(max_seq_len, int) and max_seq_len >= 1):
        raise ValueError(f"max_seq_len must be a positive int, got {max_seq_len!r}")
    if context < max_seq_len:
        raise ValueError(f"max_context_len ({context}) must be at least max_seq_len ({max_seq_len})")
    _transformers()
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model = model.eval()
    config = model.config.get_text_config()
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    _stage(progress, "quantize" if quantize or quantize_embedding else "prepare")
    _quantize(model, quantize, quantize_embedding, group_size)
    if quantize_embedding is not None:
        from edgeport.llm.embedding import gather_quantized_embeddings

        gather_quantized_embeddings(model)  # dequantize the rows a call reads, not the whole table
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=context)
    dynamic = max_seq_len > 1
    example = min(max_seq_len, 4) if dynamic else 1
    ids = torch.zeros((1, example), dtype=torch.long)
    shapes = None
    if dynamic:
        seq = torch.export.Dim("seq_len", min=1, max=max_seq_len)
        shapes = {"input_ids": {1: seq}, "cache_position": {0: seq}}
    _stage(progress, "export")
    try:
        with torch.no_grad():
            ep = wrapper.export(input_ids=ids, cache_position=torch.arange(example, dtype=torch.long),
                                dynamic_shapes=shapes)
    except Exception as exc:
        raise ExportError(f"torch.export of {type(model).__name__} with a static cache failed: "
                          f"{type(exc).__name__}: {exc}") from exc
    if weights_file is not None:
        from edgeport.aot.passes.external_constants import tag_delegate_constants
        from edgeport.aot.passes.state import mutated_buffers

        if not isinstance(weights_file, str) or not weights_file or "/" in weights_file:
            raise ValueError(f"weights_file must be a file tag such as 'model_weights', got {weights_file!r}")
        state = set(mutated_buffers(ep))  # the KV cache is state, never external weights
        tag_delegate_constants(ep, lambda node: None if node.name in state else weights_file)
    eos = _eos_ids(model)
    bos = getattr(model.config, "bos_token_id", None)
    metadata = LlmMetadata(max_seq_len=max_seq_len, max_context_len=context, vocab_size=int(config.vocab_size),
                           bos_id=int(bos) if isinstance(bos, int) else (eos[0] if eos else 0), eos_ids=tuple(eos),
                           n_layers=int(getattr(config, "num_hidden_layers", 0)), enable_dynamic_shape=dynamic)
    _stage(progress, "lower")
    edge = to_edge_transform_and_lower(ep, partitioner=partitioners_for(target, backends),
                                       constant_methods=metadata.constant_methods())
    _stage(progress, "serialize")
    manager = edge.to_executorch()
    return ExportedLlm(manager, metadata)


def export_llm(checkpoint: str | os.PathLike[str], **kwargs: Any) -> ExportedLlm:
    """:func:`export_decoder` on the model of a checkpoint directory (:func:`load_checkpoint`)."""
    _check_schemes(kwargs.get("quantize"), kwargs.get("quantize_embedding"), kwargs.get("group_size", 32))
    progress = kwargs.get("progress")
    _stage(progress, "load checkpoint")
    return export_decoder(load_checkpoint(checkpoint), **kwargs)
