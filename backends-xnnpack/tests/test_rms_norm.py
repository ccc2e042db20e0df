"""RMSNorm inside one XNNPACK delegate: ``x.pow(2).mean(-1, keepdim=True)`` as a fully connected reduction and
``rsqrt`` as square root + divide (the 2022 library has neither a mean nor a reciprocal square root node).

Before, both ran as portable kernels and split every decoder norm into three delegates. Checked against eager on
edgeport's runtime and on the stock ExecuTorch runtime (child process), static and with a dynamic sequence length,
on transformers' own ``LlamaRMSNorm`` and a hand-written one."""

from __future__ import annotations

import importlib.util

import numpy as np
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
)

RTOL = 1e-5


class RmsNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.weight = nn.Parameter(torch.randn(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def _hf_rms_norm(d: int) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    norm = transformers.models.llama.modeling_llama.LlamaRMSNorm(d, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    return norm


CASES = [(which, shape) for which in ("hand_written", "transformers") for shape in ((2, 7, 64), (5, 33), (1, 3, 4, 16))]


def _lower_dynamic():
    import edgeport
    from edgeport_xnnpack import XnnpackPartitioner

    model = RmsNorm(48).eval()
    seq = torch.export.Dim("seq", min=1, max=32)
    ep = torch.export.export(model, (torch.randn(1, 8, 48),), dynamic_shapes=({1: seq},))
    partitioner = XnnpackPartitioner()
    edge = edgeport.to_edge_transform_and_lower(ep, partitioner=[partitioner])
    return model, edge, edge.to_executorch().buffer, partitioner


@pytest.fixture(scope="module")
def lowered():
    """Every case lowered once; the stock runtime runs them all in one child process."""
    out = {}
    for which, shape in CASES:
        model = (RmsNorm(shape[-1]) if which == "hand_written" else _hf_rms_norm(shape[-1])).eval()
        torch.manual_seed(4)
        args = (torch.randn(*shape) * 2.5,)
        out[(which, shape)] = (model, args, *lower_edgeport(model, args))
    model, edge, buffer, partitioner = _lower_dynamic()
    for n in (1, 5, 32):
        args = (torch.randn(1, n, 48) * 3.0,)
        out[("dynamic", n)] = (model, args, edge, buffer, partitioner)
    stock = {}
    if importlib.util.find_spec("executorch") is not None:
        from edgeport.testing.stock_runtime import run_cases

        keys = list(out)
        results = run_cases([(str(k), out[k][3], "forward", [a.numpy() for a in out[k][1]]) for k in keys])
        stock = dict(zip(keys, results, strict=True))
    return out, stock


def _check(lowered, key) -> None:
    cases, stock = lowered
    model, args, edge, buffer, partitioner = cases[key]
    assert delegate_count(edge) == 1 and not partitioner.rejections, partitioner.rejections
    graph = str(edge.exported_program().graph)
    assert "aten.mean" not in graph and "aten.rsqrt" not in graph
    kinds = blob_kinds(edge)
    assert kinds["XNNFullyConnected"] == 1 and kinds["XNNSquareRoot"] == 1 and kinds["XNNDiv"] == 1, kinds
    ref = eager(model, args)
    assert rel_err(run_edgeport(buffer, args), ref) <= RTOL
    if not stock:
        pytest.skip("executorch (the stock runtime oracle) is not installed")
    assert stock[key].ok, stock[key].describe()
    assert rel_err(np.asarray(stock[key].outputs[0]), ref) <= RTOL


@needs_xnnpack
@pytest.mark.parametrize("case", CASES, ids=[f"{w}-{'x'.join(map(str, s))}" for w, s in CASES])
def test_rms_norm_is_one_delegate_and_matches_eager(lowered, case):
    _check(lowered, case)


@needs_xnnpack
@pytest.mark.parametrize("n", [1, 5, 32])
def test_rms_norm_with_a_dynamic_sequence_length(lowered, n):
    _check(lowered, ("dynamic", n))


@needs_xnnpack
def test_other_means_keep_their_reasons():
    """A mean over the last dim without keepdim, or over two non-spatial dims, stays outside with a reason."""
    from edgeport_xnnpack import XnnpackPartitioner

    class Means(nn.Module):
        def forward(self, x):
            return x.mean(-1) + 1.0, x.mean((0, 1), keepdim=True) * 2.0

    import edgeport

    partitioner = XnnpackPartitioner()
    edgeport.to_edge_transform_and_lower(torch.export.export(Means(), (torch.randn(3, 4, 5),)),
                                         partitioner=[partitioner])
    reasons = [r for r in partitioner.rejections.values() if "mean" in r]
    assert any("without keepdim" in r for r in reasons), partitioner.rejections
    assert any("global average pooling" in r for r in reasons), partitioner.rejections
