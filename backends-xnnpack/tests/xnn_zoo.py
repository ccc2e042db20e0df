"""Models for the XNNPACK tests: the full-size MobileNetV2 and ResNet-18 shipped in ``edgeport.testing.vision``
(torchvision's layer structure, random weights, randomized batch-norm statistics) and a small encoder layer."""

from __future__ import annotations

import torch
from torch import nn

from edgeport.testing import vision


def mobilenet_v2(resolution: int = 224, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return vision.mobilenet_v2(seed=seed, resolution=resolution)


def resnet18(resolution: int = 224, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return vision.resnet18(seed=seed, resolution=resolution)


def transformer_encoder(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
    return layer.eval(), (torch.randn(2, 10, 64),)
