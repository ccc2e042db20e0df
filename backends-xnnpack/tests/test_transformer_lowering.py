"""Transformer pieces lowered by XnnpackBackend: layer norm inside the delegate, the encoder's delegate count,
and the view / transpose folding of preprocess (fewer transpose nodes, same numbers), each checked against eager
on edgeport's runtime and on the stock ExecuTorch runtime."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from xnn_helpers import (
    blob_kinds,
    delegate_count,
    eager,
    lower_edgeport,
    needs_xnnpack,
    rel_err,
    run_edgeport,
    run_executorch,
)

LN_RTOL = 1e-5


def run_all(buffer: bytes, args: tuple, runtime: str) -> list:
    if runtime == "edgeport":
        from edgeport.runtime import Runtime

        return list(Runtime.get().load_program(buffer).load_method("forward").execute([a.numpy() for a in args]))
    pytest.importorskip("executorch")
    from executorch.runtime import Runtime as EtRuntime

    outs = EtRuntime.get().load_program(buffer).load_method("forward").execute(list(args))
    return [o.numpy() for o in outs]


class LayerNorm(nn.Module):
    def __init__(self, normalized: list[int], affine: bool, eps: float, stats: bool = False) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.ln = nn.LayerNorm(normalized, eps=eps, elementwise_affine=affine)
        if affine:
            with torch.no_grad():
                self.ln.weight.normal_()
                self.ln.bias.normal_()
        self.normalized, self.stats = normalized, stats

    def forward(self, x: torch.Tensor):
        if self.stats:  # mean and rstd used too
            y, mean, rstd = torch.ops.aten.native_layer_norm(x, self.normalized, self.ln.weight, self.ln.bias,
                                                             self.ln.eps)
            return y + 1.0, mean * 2.0, rstd * 3.0
        return self.ln(x) * 2.0 + 0.5


LN_CASES = {
    "rank2_d10_affine": ((4, 10), [10], True, 1e-5),
    "rank3_d13_plain_eps1e-3": ((2, 5, 13), [13], False, 1e-3),
    "rank4_d7_affine_eps1e-6": ((2, 3, 4, 7), [7], True, 1e-6),
    "rank4_two_dims": ((2, 3, 4, 8), [4, 8], True, 1e-5),
    "rank3_d256_eps_dominant": ((1, 16, 256), [256], True, 1.0),
}


@needs_xnnpack
@pytest.mark.executorch
@pytest.mark.parametrize("case", list(LN_CASES))
def test_layer_norm_is_delegated_and_matches_eager(case):
    shape, normalized, affine, eps = LN_CASES[case]
    model = LayerNorm(normalized, affine, eps).eval()
    torch.manual_seed(2)
    args = (torch.randn(*shape) * 3.0 + 1.0,)
    edge, buffer, partitioner = lower_edgeport(model, args)
    assert delegate_count(edge) == 1 and not partitioner.rejections, partitioner.rejections
    assert "aten.native_layer_norm.default" not in str(edge.exported_program().graph)
    kinds = blob_kinds(edge)
    assert kinds["XNNFullyConnected"] == 2 and kinds["XNNSquareRoot"] == 1, kinds
    ref = eager(model, args)
    assert rel_err(run_edgeport(buffer, args), ref) <= LN_RTOL
    pytest.importorskip("executorch")
    assert rel_err(run_executorch(buffer, args), ref) <= LN_RTOL


@needs_xnnpack
@pytest.mark.executorch
@pytest.mark.parametrize("runtime", ["edgeport", "executorch"])
def test_layer_norm_mean_and_rstd_outputs(runtime):
    model = LayerNorm([9], True, 1e-5, stats=True).eval()
    args = (torch.randn(3, 4, 9) * 2.0,)
    edge, buffer, partitioner = lower_edgeport(model, args)
    assert delegate_count(edge) == 1 and not partitioner.rejections, partitioner.rejections
    with torch.no_grad():
        refs = [r.numpy() for r in model(*args)]
    outs = run_all(buffer, args, runtime)
    assert [o.shape for o in outs] == [r.shape for r in refs]
    for out, ref in zip(outs, refs, strict=True):
        assert rel_err(out, ref) <= LN_RTOL


@needs_xnnpack
@pytest.mark.executorch
def test_layer_norm_with_runtime_weight_and_bias():
    class RuntimeAffine(nn.Module):
        def forward(self, x, w, b):
            return nn.functional.layer_norm(x, [11], w, b, 1e-5)

    model = RuntimeAffine()
    args = (torch.randn(2, 3, 11) * 4.0, torch.randn(11), torch.randn(11))
    edge, buffer, partitioner = lower_edgeport(model, args)
    assert delegate_count(edge) == 1 and not partitioner.rejections, partitioner.rejections
    ref = eager(model, args)
    assert rel_err(run_edgeport(buffer, args), ref) <= LN_RTOL
    pytest.importorskip("executorch")
    assert rel_err(run_executorch(buffer, args), ref) <= LN_RTOL


def encoder(layers: int = 2, d: int = 64, heads: int = 4, seed: int = 0) -> tuple[nn.Module, tuple]:
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()
    return model, (torch.randn(1, 16, d),)


@pytest.fixture(scope="module")
def lowered_encoder():
    model, args = encoder()
    edge, buffer, partitioner = lower_edgeport(model, args)
    return model, args, edge, buffer, partitioner


def test_encoder_delegate_count(lowered_encoder):
    _, _, edge, _, partitioner = lowered_encoder
    # per layer, only the attention's all-masked-row check (eq / logical_not / any / full_like / where) stays
    # outside: attention up to the softmax | rest of the layer + next layer's attention up to its softmax | ...
    assert delegate_count(edge) == 2 + 1
    outside = {str(n.target) for n in edge.exported_program().graph.nodes
               if n.op == "call_function" and n.meta.get("delegate_backend") is None and "getitem" not in str(n.target)}
    assert not any("layer_norm" in t for t in outside), outside
    assert all(("layer_norm" not in why) for why in partitioner.rejections.values())


@needs_xnnpack
@pytest.mark.executorch
@pytest.mark.parametrize("runtime", ["edgeport", "executorch"])
def test_encoder_matches_eager(lowered_encoder, runtime):
    model, args, _, buffer, _ = lowered_encoder
    out = run_all(buffer, args, runtime)[0]
    assert rel_err(out, eager(model, args)) <= 1e-5


def test_encoder_blob_has_one_transpose_per_attention_operand(lowered_encoder):
    """Per layer: q, k^T, v and the heads' merge, nothing else (the unfolded lowering had 10 transposes and 3
    slices per layer). The q / k scalings are folded into the in-projection weights (no XNNMultiply left but the
    two layer norms' affine weights)."""
    _, _, edge, _, _ = lowered_encoder
    kinds = blob_kinds(edge)
    layers = 2
    assert kinds["XNNStaticTranspose"] == 4 * layers, kinds
    assert kinds["XNNStaticSlice"] == 0, kinds
    assert kinds["XNNMultiply"] == 2 * layers, kinds
    assert kinds["XNNBatchMatrixMultiply"] == 2 * layers, kinds
    # q, k, v (split from the in-projection), out-projection, 2 feed-forward, 2 x 2 layer-norm reductions
    assert kinds["XNNFullyConnected"] == 10 * layers, kinds


class Views(nn.Module):
    def __init__(self, variant: str) -> None:
        super().__init__()
        self.variant = variant
        torch.manual_seed(5)
        self.fc = nn.Linear(12, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.variant
        if v == "unit_permute":  # moves only a size-1 dim: a reshape
            return x.permute(1, 0, 2) * 2.0
        if v == "identity_chain":  # permute, clone, inverse permute, no-op expand: nothing
            y = x.permute(2, 0, 1).clone().permute(1, 2, 0).expand(1, 5, 12)
            return y * 2.0
        if v == "chain_to_one":  # three permutes (as in an attention's head merge): one transpose
            y = self.fc(x).view(1, 5, 2, 12).permute(0, 2, 1, 3)
            z = y.permute(2, 0, 1, 3).clone().permute(1, 2, 0, 3).permute(2, 0, 1, 3)
            return z.reshape(5, 24) + 1.0
        if v == "split_and_scale":  # q / k / v style column split of a linear, scalings folded into weights
            q, k, w = self.fc(x).reshape(1, 5, 3, 8).permute(2, 0, 1, 3).unbind(0)
            return torch.bmm(q * 0.5, (k * 0.25).transpose(1, 2)) @ w
        raise ValueError(v)


VIEW_CASES = {
    # variant: (transposes, slices, reshapes at most, multiplies)
    "unit_permute": (0, 0, 1, 1),
    "identity_chain": (0, 0, 0, 1),
    "chain_to_one": (0, 0, 2, 0),
    "split_and_scale": (1, 0, 3, 0),
}


@needs_xnnpack
@pytest.mark.executorch
@pytest.mark.parametrize("variant", list(VIEW_CASES))
def test_view_chains_fold(variant):
    model = Views(variant).eval()
    args = (torch.randn(1, 5, 12),)
    edge, buffer, partitioner = lower_edgeport(model, args)
    assert delegate_count(edge) == 1 and not partitioner.rejections, partitioner.rejections
    kinds = blob_kinds(edge)
    transposes, slices, reshapes, muls = VIEW_CASES[variant]
    assert kinds["XNNStaticTranspose"] == transposes, kinds
    assert kinds["XNNStaticSlice"] == slices, kinds
    assert kinds["XNNStaticReshape"] <= reshapes, kinds
    assert kinds["XNNMultiply"] == muls, kinds
    ref = eager(model, args)
    assert rel_err(run_edgeport(buffer, args), ref) <= 1e-6
    pytest.importorskip("executorch")
    assert rel_err(run_executorch(buffer, args), ref) <= 1e-6
