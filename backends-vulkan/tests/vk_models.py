"""Small models and helpers shared by the Vulkan backend's end-to-end tests."""

from __future__ import annotations

import numpy as np
import torch

import edgeport


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


class CNN(torch.nn.Module):
    """conv, hardswish, max pool, depthwise conv, relu, avg pool, flatten, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.c = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = torch.nn.Linear(8 * 2 * 2, 5)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.c(x))
        y = torch.nn.functional.max_pool2d(y, 2)
        y = torch.relu(self.dw(y))
        y = torch.nn.functional.avg_pool2d(y, 2)
        return self.fc(y.flatten(1))


class Attention(torch.nn.Module):
    """A tiny pre-norm attention + MLP block built from ops the shader library has (fully delegated)."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.h, self.d = heads, d
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.h
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.h, hd).permute(0, 2, 1, 3).reshape(b * self.h, t, hd) for z in (q, k, v))
        att = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * (hd ** -0.5), dim=-1)
        y = torch.bmm(att, v).reshape(b, self.h, t, hd).permute(0, 2, 1, 3).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


def lower(model: torch.nn.Module, example: tuple, partitioner) -> bytes:
    ep = torch.export.export(model.eval(), example)
    return edgeport.to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch().buffer


def load(pte: bytes):
    from edgeport.runtime import Runtime

    return Runtime.get().load_program(pte).load_method("forward")


def run_pte(pte: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(o) for o in load(pte).execute(inputs)]


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-12))
