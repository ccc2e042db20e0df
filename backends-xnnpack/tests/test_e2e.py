"""edgeport-lowered programs on edgeport's runtime and on the stock ExecuTorch 1.5.1 runtime, against eager."""

from __future__ import annotations

import pytest
import torch
import xnn_zoo as zoo
from torch import nn
from xnn_helpers import (
    RTOL,
    delegate_count,
    eager,
    lower_edgeport,
    needs_xnnpack,
    rel_err,
    run_edgeport,
    run_executorch,
)

from edgeport.testing import models
from edgeport_xnnpack import native

F = nn.functional
XNNPACK_OK = native.is_available()[0]


class OpMix(nn.Module):
    """Each variant exercises a group of capability-table ops inside one partition."""

    def __init__(self, variant: str) -> None:
        super().__init__()
        self.variant = variant
        torch.manual_seed(3)
        self.conv = nn.Conv2d(4, 8, 3, stride=2, padding=1, dilation=1)
        self.dw = nn.Conv2d(8, 16, 3, padding=2, dilation=2, groups=8)  # depth multiplier 2
        self.grouped = nn.Conv2d(8, 8, 1, groups=2)
        self.bn = nn.BatchNorm2d(8).eval()
        self.fc = nn.Linear(16, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.variant
        if v == "activations":
            y = self.conv(x)
            return F.hardswish(y) + torch.sigmoid(y) * F.leaky_relu(y, 0.2) - F.elu(y, 0.5)
        if v == "unary":
            y = self.conv(x)
            return torch.abs(y) + torch.neg(y).floor() + torch.ceil(y) + torch.sqrt(torch.abs(y)) + y.pow(2)
        if v == "pooling":
            y = torch.clamp(self.conv(x), -0.5, 0.5)
            return F.max_pool2d(y, 2, 1) + F.avg_pool2d(y, 2, 1) + F.adaptive_avg_pool2d(y, 1)
        if v == "convs":
            y = self.grouped(torch.relu(self.conv(x)))
            return F.hardtanh(self.dw(self.bn(y)), -1.0, 2.0)  # batch norm not after a conv: multiply-add
        if v == "layout":
            y = self.conv(x)
            z = torch.cat([y, y * 2, F.pad(y, (0, 0, 0, 0))], dim=1)  # channel concat stays NHWC
            return z[:, 4:20].mean([2, 3]) + z.mean([-1, -2], keepdim=True).flatten(1)[:, :16]
        if v == "broadcast":
            y = self.conv(x)
            return (y / (torch.sigmoid(y).mean([2, 3], keepdim=True) + 1.0)) - y[:, :1] + 0.5
        if v == "head":
            y = self.dw(self.conv(x)).mean([2, 3])
            return torch.softmax(self.fc(y) * 2.0, dim=-1)
        raise ValueError(v)


class Attention(nn.Module):
    """Linear projections, head split (view/permute), bmm, softmax, select, cat, constant pad."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
        q, k, v = (z.reshape(b * 2, t, 8) for z in (q, k, v))
        att = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 8 ** -0.5, dim=-1)
        y = torch.bmm(att, v).reshape(b, 2, t, 8).permute(0, 2, 1, 3).reshape(b, t, 16)
        y = self.out(y) + x
        return torch.cat([y[:, :1], F.pad(y[:, 1:], (0, 0, 0, 0))], dim=1)


SMALL = {
    "mlp": models.mlp,
    "simple_conv": models.simple_conv,
    "mobilenet_v2_style": models.mobilenet_v2_style,
    "cnn_bn_pool": models.cnn_bn_pool,
    "resnet_block": models.resnet_block,
    **{f"ops_{v}": (lambda v=v: (OpMix(v).eval(), (torch.randn(1, 4, 12, 12),)))
       for v in ("activations", "unary", "pooling", "convs", "layout", "broadcast", "head")},
    "attention": lambda: (Attention().eval(), (torch.randn(2, 5, 16),)),
}


@pytest.fixture(scope="module")
def lowered():
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            model, args = SMALL[name]()
            edge, buffer, partitioner = lower_edgeport(model, args)
            cache[name] = (model, args, edge, buffer, partitioner)
        return cache[name]

    return get


@needs_xnnpack
@pytest.mark.parametrize("name", list(SMALL))
def test_small_models_on_edgeport_runtime(name, lowered):
    model, args, edge, buffer, partitioner = lowered(name)
    assert delegate_count(edge) == 1, partitioner.rejections
    assert not partitioner.rejections, partitioner.rejections
    assert rel_err(run_edgeport(buffer, args), eager(model, args)) <= RTOL


@pytest.mark.executorch
@pytest.mark.parametrize("name", list(SMALL))
def test_small_models_on_executorch_runtime(name, lowered):
    pytest.importorskip("executorch")
    model, args, edge, buffer, _ = lowered(name)
    assert rel_err(run_executorch(buffer, args), eager(model, args)) <= RTOL


@pytest.mark.slow
@pytest.mark.executorch
@pytest.mark.parametrize("build", [zoo.mobilenet_v2, zoo.resnet18], ids=["mobilenet_v2", "resnet18"])
def test_imagenet_models_fully_delegated_on_both_runtimes(build):
    model, args = build()
    edge, buffer, partitioner = lower_edgeport(model, args)
    assert delegate_count(edge) == 1 and not partitioner.rejections, partitioner.rejections
    ref = eager(model, args)
    if XNNPACK_OK:
        assert rel_err(run_edgeport(buffer, args), ref) <= RTOL
    pytest.importorskip("executorch")
    assert rel_err(run_executorch(buffer, args), ref) <= RTOL


@pytest.mark.slow
@pytest.mark.executorch
def test_transformer_encoder_layer_on_both_runtimes():
    model, args = zoo.transformer_encoder()
    edge, buffer, partitioner = lower_edgeport(model, args)
    # attention up to the softmax | attention output, residual, layer norms and feed-forward; only the
    # attention's all-masked-row check stays on the portable kernels
    assert delegate_count(edge) == 2
    ref = eager(model, args)
    if XNNPACK_OK:
        assert rel_err(run_edgeport(buffer, args), ref) <= RTOL
    pytest.importorskip("executorch")
    assert rel_err(run_executorch(buffer, args), ref) <= RTOL
