"""The int8 lowerings decoders need on Ethos-U: ``expand`` (TILE, grouped-query attention's repeat_kv), ``pow`` by
2 / 3 (RMSNorm's square: int32 MULs), ``neg`` and ``cat`` (rotary embeddings' rotate_half), ``silu`` (one TABLE),
``addmm`` with constant weights (GPT-2's ``Conv1D``, made ``linear`` by the quantizer), ``split`` (GPT-2's
q / k / v: SLICEs) and attention with a causal
mask built from ``arange`` (folded into an additive constant before annotation).

Each small model is quantized with ``EthosUQuantizer``, lowered with ``EthosUPartitioner`` (every compute op must
be delegated; Vela compiles each partition in its worker), and run on edgeport's runtime (Arm's TOSA reference
model). Oracle: the pt2e-converted model, output code for output code (bit-exact), on several inputs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from arm_models import quantize_and_lower, run
from test_int8_models import _fully_delegated

from edgeport_arm import EthosUCompileSpec, EthosUPartitioner, EthosUQuantizer
from edgeport_arm.fold import NEG_INF, fold_for_annotation

_ID = "EthosUBackend"


class RepeatKV(torch.nn.Module):
    """Grouped-query attention's repeat_kv: [1, 1, s, d] -> [1, 4, s, d] through expand, then a product."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kv = self.proj(x)[:, None]  # [1, 1, 6, 8]
        rep = kv[:, :, None].expand(1, 1, 4, 6, 8).reshape(1, 4, 6, 8)
        return rep * torch.arange(4.0).reshape(1, 4, 1, 1).add(1.0) * 0.5


class Powers(torch.nn.Module):
    """RMSNorm (pow 2, mean, rsqrt) and a cube."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return norm + 0.1 * x.pow(3)


class Rotary(torch.nn.Module):
    """Rotary embedding with tables computed from ``arange`` (constants once folded): q * cos + rotate_half(q) * sin,
    rotate_half = cat(-x2, x1)."""

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        d = q.shape[-1]
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.arange(q.shape[-2], dtype=torch.float32)[:, None] * inv[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        x1, x2 = q[..., : d // 2], q[..., d // 2:]
        return q * emb.cos() + torch.cat((-x2, x1), dim=-1) * emb.sin()


class SiluMlp(torch.nn.Module):
    """Llama's gated MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class Conv1D(torch.nn.Module):
    """Hugging Face GPT-2's Conv1D: addmm(bias, x.view(-1, nx), weight) with weight [nx, nf]."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 12) * 0.3)
        self.bias = torch.nn.Parameter(torch.randn(12) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return out.view(*x.shape[:-1], 12)


class SplitQKV(torch.nn.Module):
    """GPT-2's fused q / k / v projection, split along the last axis."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(8, dim=2)
        return q * k + v


class CausalAttention(torch.nn.Module):
    """sdpa with a boolean causal mask built from ``arange`` (as Hugging Face's decoders build it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[-2]
        pos = torch.arange(s)
        mask = (pos[None, :] <= pos[:, None])[None, None]
        q = x.view(1, s, 2, 4).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, q * 0.5, q, attn_mask=mask, scale=0.5)


CASES = {
    "expand": (RepeatKV, (1, 6, 8)),
    "pow": (Powers, (1, 6, 16)),
    "neg_cat": (Rotary, (1, 2, 6, 8)),
    "silu": (SiluMlp, (1, 6, 8)),
    "addmm": (Conv1D, (1, 6, 8)),
    "causal_attention": (CausalAttention, (1, 6, 8)),
    "split": (SplitQKV, (1, 6, 8)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_int8_decoder_op_is_bit_exact_on_ethos_u(name):
    cls, shape = CASES[name]
    torch.manual_seed(0)
    model = cls().eval()
    example = torch.randn(shape)
    spec = EthosUCompileSpec("ethos-u55-128")
    lowered = quantize_and_lower(model, example, EthosUQuantizer(spec), EthosUPartitioner(spec))
    assert not lowered.partitioner.refusals, lowered.partitioner.refusals
    _fully_delegated(lowered.program, _ID)
    _, method = run(lowered.program.buffer, [example.numpy()])
    gen = torch.Generator().manual_seed(3)
    for x in [example] + [torch.randn(shape, generator=gen) for _ in range(5)]:
        got = np.asarray(method.execute([x.numpy()])[0])
        want = lowered.converted(x).detach().numpy()
        np.testing.assert_array_equal(got, want, err_msg=f"{name}: integer graph differs from the pt2e model")


def test_folding_keeps_the_function_and_removes_mask_and_position_ops():
    torch.manual_seed(0)
    rotary, attention = Rotary().eval(), CausalAttention().eval()
    for model, x in ((rotary, torch.randn(1, 2, 6, 8)), (attention, torch.randn(1, 6, 8))):
        gm = torch.export.export(model, (x,)).module()
        expect = model(x)
        gm = fold_for_annotation(gm)
        targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
        assert not any(t.startswith(("aten.arange", "aten.cos", "aten.sin", "aten.le")) for t in targets), targets
        torch.testing.assert_close(gm(x), expect, rtol=1e-6, atol=1e-6)


def test_folded_infinities_become_quantizable():
    class AdditiveMask(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = x.shape[-1]
            mask = torch.full((s, s), -math.inf).triu(1)
            return torch.softmax(x + mask, dim=-1)

    x = torch.randn(1, 6, 6)
    gm = fold_for_annotation(torch.export.export(AdditiveMask(), (x,)).module())
    folded = [b for name, b in gm.named_buffers() if name.startswith("_edgeport_folded")]
    assert folded and all(torch.isfinite(b).all() for b in folded)
    assert min(float(b.min()) for b in folded) == NEG_INF
    torch.testing.assert_close(gm(x), AdditiveMask()(x), rtol=0, atol=1e-6)  # exp(-256 - max) is 0 in float32
