"""A broadcasting expand_copy inside the partition (``preprocess/ops/expand.py``): grouped-query attention's
``repeat_kv`` of a key / value computed in the graph becomes concatenations of its input, so the attention stays in
the delegate of the projections feeding it. Checked against eager PyTorch on edgeport's runtime and on the stock
ExecuTorch runtime (child process), on a hand-written block and on Hugging Face's Llama (GQA) from a small config;
expands of inputs and into many copies stay outside, with the reason."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from torch import nn
from xnn_helpers import blob_kinds, delegate_count, eager, lower_edgeport, needs_xnnpack, rel_err, run_edgeport

RTOL = 1e-5


class GroupedAttention(nn.Module):
    """Keys and values of 2 heads shared by 4 query heads (HF's repeat_kv: unsqueeze, expand, reshape)."""

    def __init__(self, d: int = 32, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * kv_heads * self.hd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
        groups = self.heads // self.kv_heads
        k = k[:, :, None].expand(b, self.kv_heads, groups, s, self.hd).reshape(b, self.heads, s, self.hd)
        v = v[:, :, None].expand(b, self.kv_heads, groups, s, self.hd).reshape(b, self.heads, s, self.hd)
        w = torch.softmax(q @ k.transpose(-1, -2) / self.hd ** 0.5, dim=-1)
        return (w @ v).transpose(1, 2).reshape(b, s, -1)


class TwoAxes(nn.Module):
    """An expand that adds a leading dim and broadcasts two more."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)  # [3, 1, 5, 1]
        return y.expand(2, 3, 4, 5, 2) * 2.0


class Broadcasts(nn.Module):
    """An expand of the input itself and one into 32 copies: both left outside."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x.expand(4, 6).clone() + 1.0
        b = torch.relu(x).expand(32, 6) * 3.0
        return a, b


def _stock(cases: dict) -> dict:
    if importlib.util.find_spec("executorch") is None:
        return {}
    from edgeport.testing.stock_runtime import run_cases

    keys = list(cases)
    results = run_cases([(k, cases[k][1], "forward", [a.numpy() for a in cases[k][0]]) for k in keys])
    return dict(zip(keys, results, strict=True))


def _hf_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      attn_implementation="eager", use_cache=False)
    llama = transformers.LlamaModel(config).eval()

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llama = llama

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.llama(input_ids=ids).last_hidden_state

    return Llama().eval(), (torch.randint(0, 64, (1, 8)),)


@pytest.fixture(scope="module")
def lowered():
    cases = {"gqa": (GroupedAttention().eval(), (torch.randn(1, 6, 32),)),
             "two_axes": (TwoAxes().eval(), (torch.randn(3, 1, 5, 1),)),
             "llama": _hf_llama()}
    out = {name: (model, args, *lower_edgeport(model, args)) for name, (model, args) in cases.items()}
    stock = _stock({name: (args, pte) for name, (_, args, _, pte, _) in out.items()})
    return out, stock


@needs_xnnpack
@pytest.mark.parametrize("name", ["gqa", "two_axes", "llama"])
def test_broadcasting_expands_run_inside_the_delegate(lowered, name):
    cases, stock = lowered
    model, args, edge, pte, partitioner = cases[name]
    left = [n.name for n in edge.exported_program().graph.nodes
            if "expand_copy" in str(n.target) and n.meta["val"].dtype == torch.float32]
    assert not left, left  # (Llama's mask is built from bool expands: not float32, not the delegate's)
    kinds = blob_kinds(edge)
    assert sum(v for k, v in kinds.items() if k.startswith("XNNConcatenate")) > 0, kinds
    if name != "llama":  # the hand-written graphs: one delegate; Llama's is split by the masked-row guard only
        assert delegate_count(edge) == 1
    ref = eager(model, args)
    assert rel_err(run_edgeport(pte, args), ref) <= RTOL
    if not stock:
        pytest.skip("executorch (the stock runtime oracle) is not installed")
    assert stock[name].ok, stock[name].describe()
    assert rel_err(np.asarray(stock[name].outputs[0]), ref) <= RTOL


@needs_xnnpack
def test_expands_of_inputs_and_into_many_copies_stay_outside():
    model, args = Broadcasts().eval(), (torch.randn(1, 6),)
    edge, pte, partitioner = lower_edgeport(model, args)
    reasons = " ".join(partitioner.rejections.values())
    assert "expand of a program input, buffer or cache" in reasons, reasons
    assert "into 32 copies" in reasons, reasons
    assert str(edge.exported_program().graph).count("expand_copy") == 2
    from edgeport.runtime import Runtime

    got = Runtime.get().load_program(pte).load_method("forward").execute([args[0].numpy()])
    with torch.no_grad():
        want = model(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=RTOL, atol=1e-6)
