"""Real-world architectures: Hugging Face ``transformers`` models built from small configs (random weights, no
download), for edgeport's own tests and for backend authors' (``from edgeport.testing import ARCHITECTURES``).

Each entry of :data:`ARCHITECTURES` is a builder ``(seed=0, size="small") -> Architecture``: the model in eval mode,
wrapped to return one plain tensor (``last_hidden_state`` or ``logits``), its example inputs and, for text models,
a ``dynamic_shapes`` spec with a bounded sequence dimension and the lengths to test it at. ``size="small"`` builds
in well under a second (hidden 32, 2 layers); ``size="medium"`` (hidden 256, 4 layers, sequence 128, images 64x64)
is for slow tests and benchmarks. :func:`assert_close_to_scale` is the comparison the architecture tests use.

``transformers`` is a test-only dependency, imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

SIZES = {
    "small": {"hidden": 32, "layers": 2, "heads": 4, "ffn": 64, "vocab": 128, "seq": 8, "max_seq": 32, "image": 32},
    "medium": {"hidden": 256, "layers": 4, "heads": 8, "ffn": 1024, "vocab": 1000, "seq": 128, "max_seq": 128,
               "image": 64},
}


@dataclass
class Architecture:
    """One architecture, ready to export: ``torch.export.export(a.model, a.example_inputs,
    dynamic_shapes=a.dynamic_shapes)``; ``inputs_for(n)`` gives inputs of sequence length ``n``."""

    name: str
    model: Any
    example_inputs: tuple[Any, ...]
    dynamic_shapes: Any = None  # text models: {"x": {1: Dim("seq", min=2, max=...)}}
    seq_lengths: tuple[int, ...] = ()  # text models: lengths to test, below the bound and the bound itself
    kind: str = "text"  # "text" (token ids [1, seq]) or "vision" (images [1, 3, H, W])
    vocab: int = 0
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def inputs_for(self, length: int) -> tuple[Any, ...]:
        """Token ids of sequence length ``length`` (text models only), seeded."""
        torch = _torch()
        if self.kind != "text":
            raise ValueError(f"{self.name} is a vision model: it has no sequence length")
        gen = torch.Generator().manual_seed(self.seed * 1000 + length)
        return (torch.randint(0, self.vocab, (1, length), generator=gen),)


def _torch() -> Any:
    import torch

    return torch


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("edgeport.testing.architectures needs Hugging Face transformers (a test-only dependency): "
                          "pip install transformers") from exc
    return transformers


def _output(model: Any, key: str) -> Any:
    torch = _torch()

    class Wrapped(torch.nn.Module):
        """Calls the model with its tensors as positional inputs and returns ``output[key]`` as one tensor."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: Any) -> Any:
            return getattr(self.inner(x), key)

    Wrapped.__name__ = f"{type(model).__name__}_{key}"
    return Wrapped().eval()


def _build(make: Callable[[Any, dict[str, int]], Any], key: str, seed: int, size: str) -> Any:
    """The wrapped model, its weights drawn from ``seed`` (the caller's global RNG state is left as it was)."""
    torch = _torch()
    transformers = _transformers()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _output(make(transformers, _size(size)), key)


def _size(size: str) -> dict[str, int]:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; sizes: {sorted(SIZES)}")
    return SIZES[size]


def _text(name: str, make: Callable[[Any, dict[str, int]], Any], key: str, seed: int, size: str) -> Architecture:
    torch = _torch()
    s = _size(size)
    model = _build(make, key, seed, size)
    seq = torch.export.Dim("seq", min=2, max=s["max_seq"])
    arch = Architecture(name, model, (), dynamic_shapes={"x": {1: seq}},
                        seq_lengths=(2, 3, s["seq"] - 1, s["max_seq"]), kind="text", vocab=s["vocab"], seed=seed)
    arch.example_inputs = arch.inputs_for(s["seq"])
    return arch


def _calibrate_batch_norm(model: Any, image: int, seed: int) -> None:
    """Set BatchNorm running statistics from a few random batches (train-mode forwards), as a trained model would
    have them: with the initial ones (mean 0, variance 1) a deep random CNN's output collapses towards zero."""
    torch = _torch()
    gen = torch.Generator().manual_seed(seed + 7)
    model.train()
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # dropout draws from the global RNG: leave it be
        torch.manual_seed(seed)
        for _ in range(4):
            model(torch.randn(4, 3, image, image, generator=gen))
    model.eval()


def _vision(name: str, make: Callable[[Any, dict[str, int]], Any], key: str, seed: int, size: str,
            calibrate_bn: bool = False) -> Architecture:
    torch = _torch()
    s = _size(size)
    model = _build(make, key, seed, size)
    if calibrate_bn:
        _calibrate_batch_norm(model, s["image"], seed)
    gen = torch.Generator().manual_seed(seed)
    return Architecture(name, model, (torch.randn(1, 3, s["image"], s["image"], generator=gen),), kind="vision",
                        seed=seed)


def bert(seed: int = 0, size: str = "small") -> Architecture:
    return _text("bert", lambda T, s: T.BertModel(T.BertConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        intermediate_size=s["ffn"], max_position_embeddings=max(64, s["max_seq"]))), "last_hidden_state", seed, size)


def distilbert(seed: int = 0, size: str = "small") -> Architecture:
    return _text("distilbert", lambda T, s: T.DistilBertModel(T.DistilBertConfig(
        vocab_size=s["vocab"], dim=s["hidden"], n_layers=s["layers"], n_heads=s["heads"], hidden_dim=s["ffn"],
        max_position_embeddings=max(64, s["max_seq"]))), "last_hidden_state", seed, size)


def gpt2(seed: int = 0, size: str = "small") -> Architecture:
    return _text("gpt2", lambda T, s: T.GPT2LMHeadModel(T.GPT2Config(
        vocab_size=s["vocab"], n_embd=s["hidden"], n_layer=s["layers"], n_head=s["heads"],
        n_positions=max(64, s["max_seq"]), use_cache=False, bos_token_id=0, eos_token_id=0)), "logits", seed, size)


def t5_encoder(seed: int = 0, size: str = "small") -> Architecture:
    return _text("t5_encoder", lambda T, s: T.T5EncoderModel(T.T5Config(
        vocab_size=s["vocab"], d_model=s["hidden"], d_kv=s["hidden"] // s["heads"], d_ff=s["ffn"],
        num_layers=s["layers"], num_heads=s["heads"], use_cache=False)), "last_hidden_state", seed, size)


def llama(seed: int = 0, size: str = "small") -> Architecture:
    """A Llama-style decoder: RMSNorm, rotary embeddings, grouped-query attention (half as many KV heads)."""
    return _text("llama", lambda T, s: T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ffn"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["heads"] // 2,
        max_position_embeddings=max(64, s["max_seq"]), use_cache=False, bos_token_id=0, eos_token_id=0)),
        "logits", seed, size)


def qwen2(seed: int = 0, size: str = "small") -> Architecture:
    """A Qwen2-style decoder: grouped-query attention with a single KV head, biased q/k/v projections, tied
    embeddings."""
    return _text("qwen2", lambda T, s: T.Qwen2ForCausalLM(T.Qwen2Config(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ffn"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=1, max_position_embeddings=max(64, s["max_seq"]),
        use_cache=False, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)), "logits", seed, size)


def mobilenet_v2_seg(seed: int = 0, size: str = "small") -> Architecture:
    """Semantic segmentation: a MobileNetV2 backbone (depthwise convs, ReLU6, BatchNorm) and a DeepLabV3 head whose
    image-pooling branch is upsampled (bilinear) back to the feature map; BatchNorm statistics calibrated."""
    return _vision("mobilenet_v2_seg", lambda T, s: T.MobileNetV2ForSemanticSegmentation(T.MobileNetV2Config(
        num_channels=3, image_size=s["image"], depth_multiplier=0.35, num_labels=4, output_stride=8,
        semantic_loss_ignore_index=255)), "logits", seed, size, calibrate_bn=True)


def vit(seed: int = 0, size: str = "small") -> Architecture:
    return _vision("vit", lambda T, s: T.ViTModel(T.ViTConfig(
        image_size=s["image"], patch_size=8, num_channels=3, hidden_size=s["hidden"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], intermediate_size=s["ffn"])), "last_hidden_state", seed, size)


def convnext(seed: int = 0, size: str = "small") -> Architecture:
    return _vision("convnext", lambda T, s: T.ConvNextModel(T.ConvNextConfig(
        num_channels=3, num_stages=2, hidden_sizes=[s["hidden"] // 2, s["hidden"]], depths=[1, s["layers"] // 2],
        image_size=s["image"])), "last_hidden_state", seed, size)


def resnet(seed: int = 0, size: str = "small") -> Architecture:
    return _vision("resnet", lambda T, s: T.ResNetForImageClassification(T.ResNetConfig(
        num_channels=3, embedding_size=s["hidden"] // 2, hidden_sizes=[s["hidden"] // 2, s["hidden"]],
        depths=[1, s["layers"] // 2], num_labels=10)), "logits", seed, size)


ARCHITECTURES: dict[str, Callable[..., Architecture]] = {
    "bert": bert,
    "distilbert": distilbert,
    "gpt2": gpt2,
    "t5_encoder": t5_encoder,
    "llama": llama,
    "qwen2": qwen2,
    "vit": vit,
    "convnext": convnext,
    "resnet": resnet,
    "mobilenet_v2_seg": mobilenet_v2_seg,
}
"""Architecture name -> builder ``(seed=0, size="small") -> Architecture``."""

TEXT_ARCHITECTURES = ("bert", "distilbert", "gpt2", "t5_encoder", "llama", "qwen2")


def scale_error(got: Any, want: Any) -> float:
    """``max |got - want| / max(1, max |want|)``: the error relative to the output's scale."""
    import numpy as np

    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        raise AssertionError(f"shape {list(g.shape)}, expected {list(w.shape)}")
    return float(np.abs(g - w).max() / max(1.0, float(np.abs(w).max()))) if w.size else 0.0


def assert_close_to_scale(got: Any, want: Any, where: str, tolerance: float = 1e-4) -> None:
    """Assert ``got`` is within ``tolerance`` of ``want`` relative to the output's scale (see :func:`scale_error`)."""
    import numpy as np

    err = scale_error(got, want)
    peak = float(np.abs(np.asarray(want)).max()) if np.asarray(want).size else 0.0
    assert err <= tolerance, f"{where}: error {err:.2e} of the output's scale (max |eager| = {peak:.3g}) " \
                             f"exceeds {tolerance:g}"


def eager_outputs(arch: Architecture, inputs: Sequence[Any] | None = None) -> Any:
    """The model's output on ``inputs`` (default: its example inputs) as a numpy array."""
    torch = _torch()
    with torch.no_grad():
        return arch.model(*(inputs if inputs is not None else arch.example_inputs)).numpy()


def swin(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """A windowed-attention vision transformer (``transformers.SwinModel``, tiny config, random weights) returning
    its last hidden state, and a 32x32 example image: the profiling benchmark's and tests' model (not in
    :data:`ARCHITECTURES`, so the per-backend suites do not run it)."""
    import torch
    import transformers as T

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inner = T.SwinModel(T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                         num_heads=[2, 4], window_size=4)).eval()

    class Swin(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            return self.inner(x).last_hidden_state

    return Swin().eval(), (torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed)),)
