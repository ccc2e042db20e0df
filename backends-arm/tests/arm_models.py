"""Small models and the quantize-lower-run pipeline shared by the Arm backend's tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from edgeport import to_edge_transform_and_lower
from edgeport.runtime import Runtime
from edgeport.testing.models import keyword_spotter


class ConvBlock(nn.Module):
    """conv+relu, depthwise+relu6, residual add, sigmoid gate, average pool, global mean, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        z = nn.functional.hardtanh(self.dw(y), 0.0, 6.0) + y
        z = torch.sigmoid(z) * z
        z = nn.functional.avg_pool2d(z, 2).mean(dim=(2, 3))
        return self.fc(z)


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Hardswish(), nn.Linear(64, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(x))


class PoolCat(nn.Module):
    """max pooling, cat of two branches, a pad, a slice and a reshape."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(4, 6, 1)
        self.b = nn.Conv2d(4, 6, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(x, 2)
        y = torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x))], dim=1)
        y = nn.functional.pad(y, (1, 1, 1, 1))[:, :, 1:5, :]
        return y.reshape(1, -1)


class SelectScale(nn.Module):
    """a row picked with ``select`` and scaled by a constant (attention's q * scale pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x).reshape(1, 3, 8)[:, 1] * 0.5)


MODELS: dict[str, tuple[Any, tuple[int, ...]]] = {
    "conv_block": (ConvBlock, (1, 3, 8, 8)),
    "keyword_spotter": (lambda: keyword_spotter()[0], (1, 1, 49, 10)),
    "mlp": (Mlp, (1, 32)),
    "pool_cat": (PoolCat, (1, 4, 8, 8)),
    "select_scale": (SelectScale, (1, 16)),
}


@dataclass
class Lowered:
    model: nn.Module
    converted: Any  # the pt2e-converted torch model (fake-quantized reference)
    program: Any
    partitioner: Any
    example: torch.Tensor


def build(name: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    cls, shape = MODELS[name]
    torch.manual_seed(seed)
    model = cls().eval()
    for m in model.modules():  # non-trivial batch-norm statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return model, torch.randn(shape)


def quantize_and_lower(model: nn.Module, example: torch.Tensor, quantizer: Any, partitioner: Any,
                       calibration: int = 16) -> Lowered:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    prepared = prepare_pt2e(torch.export.export(model, (example,)).module(), quantizer)
    gen = torch.Generator().manual_seed(1)
    for _ in range(calibration):
        prepared(torch.randn(example.shape, generator=gen))
    prepared(example)
    converted = convert_pt2e(prepared)
    ep = torch.export.export(converted, (example,))
    program = to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch()
    return Lowered(model, converted, program, partitioner, example)


def run(program_bytes: bytes, inputs: list[Any], **load: Any) -> tuple[list[np.ndarray], Any]:
    method = Runtime.get().load_program(program_bytes, **load).load_method("forward")
    outs = method.execute(inputs)
    return [np.asarray(o) for o in outs], method


def sqnr_db(reference: Any, actual: Any) -> float:
    ref = np.asarray(reference, np.float64)
    err = ref - np.asarray(actual, np.float64)
    noise = float(np.sum(err * err))
    return float("inf") if noise == 0 else 10.0 * np.log10(float(np.sum(ref * ref)) / noise)
