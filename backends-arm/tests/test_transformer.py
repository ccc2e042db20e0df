"""Transformer blocks in int8 on TOSABackend and EthosUBackend: softmax, layer norm and attention decomposed by the
quantizer, lowered to TOSA INT (TABLE, REDUCE_*, MATMUL, TRANSPOSE), compiled by Vela, run on the reference model.

Oracles: the pt2e-converted torch model (SQNR >= 35 dB, >= 99% of elements within one output step), fp32 eager
(SQNR >= 20 dB), and for the decomposition itself the undecomposed float module.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from arm_models import quantize_and_lower, run, sqnr_db
from test_int8_models import _check, _fully_delegated

from edgeport.testing.models import transformer_encoder_layer
from edgeport_arm import (
    EthosUCompileSpec,
    EthosUPartitioner,
    EthosUQuantizer,
    TosaCompileSpec,
    TOSAPartitioner,
    TOSAQuantizer,
)
from edgeport_arm.capabilities import ethos_u_problem
from edgeport_arm.decompose import decompose_for_annotation
from edgeport_arm.keys import estimates_key


class _Wrapped(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).last_hidden_state


def _tiny_vit() -> tuple[torch.nn.Module, torch.Tensor]:
    """A Hugging Face ViT from a tiny config with random weights (no download): hidden 32, 1 layer, 2 heads."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 image_size=16, patch_size=8, num_channels=3, attn_implementation="sdpa")
    torch.manual_seed(0)
    return _Wrapped(transformers.ViTModel(cfg, add_pooling_layer=False).eval()).eval(), torch.randn(1, 3, 16, 16)


def _encoder() -> tuple[torch.nn.Module, torch.Tensor]:
    model, (x,) = transformer_encoder_layer()
    return model, x


def _lower_tosa(model, x):
    spec = TosaCompileSpec("TOSA-1.0+INT")
    return quantize_and_lower(model, x, TOSAQuantizer(spec), TOSAPartitioner(spec))


def _lower_ethos_u(model, x, target):
    spec = EthosUCompileSpec(target)
    return quantize_and_lower(model, x, EthosUQuantizer(spec), EthosUPartitioner(spec))


@pytest.mark.parametrize("build", [_encoder, _tiny_vit], ids=["encoder_layer", "hf_vit"])
def test_decomposition_keeps_the_float_function(build):
    model, x = build()
    gm = torch.export.export(model, (x,)).module()
    expect = gm(x)
    gm = decompose_for_annotation(gm)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any(t in targets for t in ("aten.layer_norm.default", "aten.scaled_dot_product_attention.default",
                                          "aten.softmax.int", "aten._safe_softmax.default")), targets
    assert {"aten.bmm.default", "aten.exp.default", "aten.rsqrt.default", "aten.amax.default"} <= targets
    # q / k / v are selected from the in-projection directly: no transpose of it is left (it costs the U85 most)
    assert not any(n.target is torch.ops.aten.transpose.int and n.args[0].meta["val"].dim() == 5
                   for n in gm.graph.nodes if n.op == "call_function")
    torch.testing.assert_close(gm(x), expect, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)


def test_encoder_layer_tosa_int8():
    model, x = _encoder()
    lowered = _lower_tosa(model, x)
    _fully_delegated(lowered.program, "TOSABackend")
    _, method = run(lowered.program.buffer, [x])
    _check(lowered, method, "transformer_encoder", runs=4)


def test_hf_vit_tosa_int8():
    model, x = _tiny_vit()
    lowered = _lower_tosa(model, x)
    _fully_delegated(lowered.program, "TOSABackend")
    _, method = run(lowered.program.buffer, [x])
    _check(lowered, method, "hf_vit", runs=4)


def _check_vela_all_npu(program, target: str) -> dict:
    from edgeport.program.reader import load_pte

    lp = load_pte(program.buffer)
    est = json.loads(bytes(lp.named_data(estimates_key(bytes(lp.delegate_data(0, 0))))).decode())
    assert est["target"] == target and est["cpu_ops"] == 0 and est["npu_ops"] > 20, est
    return est


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_encoder_layer_ethos_u_all_on_the_npu(target):
    model, x = _encoder()
    lowered = _lower_ethos_u(model, x, target)
    _fully_delegated(lowered.program, "EthosUBackend")
    _check_vela_all_npu(lowered.program, target)
    _, method = run(lowered.program.buffer, [x])
    _check(lowered, method, "transformer_encoder", runs=4)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_hf_vit_ethos_u_all_on_the_npu(target):
    model, x = _tiny_vit()
    lowered = _lower_ethos_u(model, x, target)
    _fully_delegated(lowered.program, "EthosUBackend")
    _check_vela_all_npu(lowered.program, target)
    _, method = run(lowered.program.buffer, [x])
    _check(lowered, method, "hf_vit", runs=4)


class _MaskedAttention(torch.nn.Module):
    """A mask computed from the input (a constant mask is folded into an additive constant since 9a22dd2)."""

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        mask = q.sum(-1, keepdim=True) > 0
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def test_attention_with_a_real_mask_is_left_whole_and_named():
    """A mask that depends on the input is not dropped: the attention stays float and Ethos-U refuses it by name."""
    x = torch.randn(1, 2, 4, 8)
    gm = decompose_for_annotation(torch.export.export(_MaskedAttention(), (x,)).module())
    assert any("scaled_dot_product_attention" in str(n.target) for n in gm.graph.nodes)
    from edgeport.errors import LoweringError

    with pytest.raises(LoweringError, match=r"would run in float on the CPU[\s\S]*cpu_fallback"):
        _lower_ethos_u(_MaskedAttention(), x, "ethos-u55-128")


def test_u55_transpose_and_reduction_limits():
    """Beyond the U55's 65536-element limits a permute or a reduction is not claimed; the U85 has no such rule."""

    class Big(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.permute(0, 2, 1, 3), x.sum(dim=3, keepdim=True)

    from edgeport import to_edge

    edge = to_edge(torch.export.export(Big(), (torch.randn(1, 300, 300, 2),))).exported_program()
    permute = next(n for n in edge.graph.nodes if "permute" in str(n.target))
    reduce = next(n for n in edge.graph.nodes if "sum" in str(n.target))
    assert "65536" in ethos_u_problem(permute, "aten.permute_copy.default", "ethos-u55-128")
    assert "65536" in ethos_u_problem(reduce, "aten.sum.dim_IntList", "ethos-u55-128")
    assert ethos_u_problem(permute, "aten.permute_copy.default", "ethos-u85-256") is None
    small = to_edge(torch.export.export(Big(), (torch.randn(1, 8, 8, 2),))).exported_program()
    for n in small.graph.nodes:
        if "permute" in str(n.target):
            assert ethos_u_problem(n, "aten.permute_copy.default", "ethos-u55-128") is None


def test_int8_tables_saturate_like_the_quantized_model():
    """rsqrt of a zero code and 1/0 saturate to the top output code in both the table and the pt2e model."""

    class Norm(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.layer_norm(torch.relu(x), (8,)) * 0.5

    x = torch.randn(1, 4, 8)
    x[0, 0] = -1.0  # an all-zero row after relu: variance 0, rsqrt(eps) is large
    model = Norm().eval()
    lowered = _lower_tosa(model, x)
    _fully_delegated(lowered.program, "TOSABackend")
    outs, _ = run(lowered.program.buffer, [x])
    expect = lowered.converted(x).detach().numpy()
    assert sqnr_db(expect, outs[0]) >= 35.0
    np.testing.assert_allclose(outs[0], expect, atol=1e-6 + 1.001 * float(np.max(np.abs(expect))) / 127)


def test_float_profile_lowers_the_primitives():
    """The primitives of the decomposition in a TOSA-1.0+FP graph (EXP, RECIPROCAL, RSQRT, REDUCE_*) vs eager."""

    class Prims(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            e = torch.exp(x - torch.amax(x, dim=-1, keepdim=True))
            s = torch.reciprocal(torch.sum(e, dim=-1, keepdim=True))
            return e * s + torch.rsqrt(x * x + 1e-3) + torch.sum(x, dim=1)[:, None, :]

    from edgeport import to_edge_transform_and_lower

    x = torch.randn(2, 4, 8)
    program = to_edge_transform_and_lower(torch.export.export(Prims(), (x,)), partitioner=[
        TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))]).to_executorch()
    _fully_delegated(program, "TOSABackend")
    outs, _ = run(program.buffer, [x])
    np.testing.assert_allclose(outs[0], Prims()(x).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_hf_bert_tosa_int8_only_the_embedding_lookup_on_the_cpu():
    """A 2-layer Hugging Face BERT (tiny config, random weights): everything but the token-id lookup delegated."""
    transformers = pytest.importorskip("transformers")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeport import to_edge_transform_and_lower

    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=16, attn_implementation="sdpa")
    torch.manual_seed(0)

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = transformers.BertModel(cfg, add_pooling_layer=False).eval()

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids).last_hidden_state

    model, ids = LastHidden().eval(), torch.randint(0, 64, (1, 8))
    spec = TosaCompileSpec("TOSA-1.0+INT")
    prepared = prepare_pt2e(torch.export.export(model, (ids,)).module(), TOSAQuantizer(spec))
    for _ in range(8):
        prepared(torch.randint(0, 64, (1, 8)))
    converted = convert_pt2e(prepared)
    program = to_edge_transform_and_lower(torch.export.export(converted, (ids,)),
                                          partitioner=[TOSAPartitioner(spec)]).to_executorch()
    summary = program.delegation_summary()
    kernels = [line.split()[1] for line in summary.splitlines() if line.strip().startswith("portable")]
    assert "delegated to TOSABackend: 1 call(s)" in summary
    assert sorted(kernels) == ["aten::embedding.out:", "quantized_decomposed::dequantize_per_tensor.out:",
                               "quantized_decomposed::quantize_per_tensor.out:"], summary
    got, expect, eager = [], [], []
    for i in range(4):
        x = ids if i == 0 else torch.randint(0, 64, (1, 8))
        got.append(run(program.buffer, [x])[0][0].ravel())
        expect.append(converted(x).detach().numpy().ravel())
        eager.append(model(x).detach().numpy().ravel())
    got, expect, eager = (np.concatenate(a) for a in (got, expect, eager))
    assert sqnr_db(expect, got) >= 35.0 and sqnr_db(eager, got) >= 20.0
