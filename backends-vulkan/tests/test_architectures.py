"""Real architectures on Vulkan: ``edgeport.lower(model, inputs, backends=["VulkanBackend"])``, run on edgeport's
runtime (lavapipe here), within 1e-3 of eager PyTorch relative to the output's scale.

Every architecture of :data:`edgeport.testing.architectures.ARCHITECTURES`, plus a Qwen2 decoder built here whose
attention starts from ``transformers``' empty KV cache (``torch.tensor([])`` concatenated with the first keys: the
zero-element tensors that failed at load before). The share of compute ops inside Vulkan delegates is checked
against a floor per architecture (what this backend reaches today; ``bench/vulkan_coreml_architectures.py`` prints it
next to ExecuTorch's Vulkan partitioner on the same export).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import edgeport
from edgeport.runtime import Runtime
from edgeport.testing.architectures import ARCHITECTURES, Architecture, eager_outputs, scale_error

pytest.importorskip("transformers")

BACKEND = "VulkanBackend"
TOLERANCE = 1e-3
# share of compute ops delegated, measured 2026-11-28 with int / bool tensors on the device (small configs,
# bench/vulkan_coreml_architectures.py; ExecuTorch 1.5.1's Vulkan partitioner: 92-96% on the transformers); a drop
# below it is a regression (architectures without a floor: 0.5)
FLOORS = {"bert": 1.0, "distilbert": 1.0, "gpt2": 0.97, "t5_encoder": 0.98, "llama": 0.98, "vit": 1.0,
          "convnext": 1.0, "resnet": 1.0, "qwen2": 0.98, "mobilenet_v2_seg": 1.0,
          "qwen2_empty_cache": 0.97}


def qwen2_empty_cache(seed: int = 0) -> Architecture:
    """A Qwen2 decoder (grouped-query attention) with ``use_cache=True``: its layers concatenate onto empty caches."""
    import transformers as T

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = T.Qwen2ForCausalLM(T.Qwen2Config(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, use_cache=True, bos_token_id=0, eos_token_id=0))

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x):
            return self.inner(x).logits

    arch = Architecture("qwen2_empty_cache", Logits().eval(), (), kind="text", vocab=128, seed=seed)
    arch.example_inputs = arch.inputs_for(8)
    return arch


BUILDERS = {**ARCHITECTURES, "qwen2_empty_cache": qwen2_empty_cache}


def delegated_share(report) -> tuple[int, int]:
    """(compute ops inside delegates, compute ops left on the CPU) of a ``LoweringReport``."""
    return sum(ops for _, ops in report.delegates), len(report.portable_ops)


@functools.cache
def _lowered(name: str):
    arch = BUILDERS[name]()
    return arch, edgeport.lower(arch.model, arch.example_inputs, backends=[BACKEND])


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_architecture_lowers_and_runs_on_vulkan(device, name):
    arch, manager = _lowered(name)
    report = manager.lowering_report
    inside, outside = delegated_share(report)
    assert report.delegates and all(b == BACKEND for b, _ in report.delegates)
    method = Runtime.get().load_program(manager.buffer).load_method("forward")
    got = method.execute([t.numpy() for t in arch.example_inputs])[0]
    err = scale_error(np.asarray(got), eager_outputs(arch))
    assert err <= TOLERANCE, f"{name}: error {err:.2e} of the output's scale"
    share = inside / (inside + outside)
    assert share >= FLOORS.get(name, 0.5), (f"{name}: {inside} of {inside + outside} ops delegated ({share:.1%}); "
                                            f"left: {[(op, why) for _, op, why in report.portable_ops]}")
    # nothing refused for an empty tensor except where computing on it was asked
    empty = [(node, why) for node, _, why in report.portable_ops if "no elements" in why]
    assert not empty, empty
