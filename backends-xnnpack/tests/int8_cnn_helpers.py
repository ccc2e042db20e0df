"""Helpers for the int8 CNN tests: a pt2e model evaluated in float64, and CNNs with calibrated BatchNorm."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.fx import Interpreter

_QD = torch.ops.quantized_decomposed


class Float64Pt2e(Interpreter):
    """Runs a pt2e-converted model in float64: dequantizes exact, every op in float64, quantizes rounding
    ``x / scale`` half to even. The model input's quantize stays float32, as every runtime does it. (In float32,
    the pt2e model's convolutions land on the wrong side of a .5 rounding boundary now and then.)"""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target == _QD.quantize_per_tensor.default:
            x, scale, zp, qmin, qmax, dtype = args[:6]
            if x.dtype == torch.float32:
                return super().call_function(target, args, kwargs)
            return torch.clamp(torch.round(x / float(scale)) + int(zp), qmin, qmax).to(dtype)
        if target == _QD.dequantize_per_tensor.default:
            return (args[0].double() - int(args[2])) * float(args[1])
        if target == _QD.dequantize_per_channel.default:
            x, scales, zps, axis = args[:4]
            shape = [1] * x.dim()
            shape[axis] = -1
            return (x.double() - zps.double().reshape(shape)) * scales.double().reshape(shape)
        args = tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        return super().call_function(target, args, kwargs)


def pt2e_float64(converted: torch.fx.GraphModule, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        out = Float64Pt2e(converted).run(x)
    return (out[0] if isinstance(out, (tuple, list)) else out).float().numpy()


def int32_biases(converted: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The dequantize nodes of int32 constants (the quantizer's biases) in a converted model."""
    return [n for n in converted.graph.nodes if n.op == "call_function" and n.target in (
        _QD.dequantize_per_channel.default, _QD.dequantize_per_tensor.default) and torch.int32 in n.args]


def _cbr(cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU6()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        mid = cin * expand
        self.block = nn.Sequential(_cbr(cin, mid), _cbr(mid, mid, 3, stride, groups=mid), _cbr(mid, cout, act=False))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


class BatchNormCnn(nn.Module):
    """Conv + BatchNorm + ReLU6 stem, depthwise-separable and inverted residual blocks, a head, a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _cbr(3, 16, 3, 2), _cbr(16, 16, 3, groups=16), _cbr(16, 8, act=False),
            InvertedResidual(8, 12, 2), InvertedResidual(12, 12, 1), InvertedResidual(12, 16, 2), _cbr(16, 32))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pool(self.features(x)).flatten(1))


def calibrate_batch_norm(model: nn.Module, shape: tuple[int, ...], batches: int = 4) -> nn.Module:
    """BatchNorm statistics from a few training-mode batches (as a trained model has them), then eval."""
    gen = torch.Generator().manual_seed(11)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn((8, *shape[1:]), generator=gen))
    return model.eval()
