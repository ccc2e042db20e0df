"""Small models for the end-to-end tests (tiny shapes: the HTP emulator is slow)."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.sigmoid(self.fc2(torch.relu(self.fc1(x)))))


class SmallCNN(nn.Module):
    """conv + batch norm + relu6, depthwise conv + hardswish, max pool, avg pool, residual add, global mean, fc."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 8, 1)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.relu6(self.bn(self.conv(x)))
        y = self.pool(y)
        y = y + nn.functional.hardswish(self.pw(self.dw(y)))
        y = self.avg(y)
        return self.fc(y.mean(dim=(2, 3)))


class TinyEncoder(nn.Module):
    """Single-head self-attention + layer norms + gelu MLP."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.scale = d ** -0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        att = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * self.scale, dim=-1)
        x = x + self.o(torch.bmm(att, v))
        return x + self.ff2(nn.functional.gelu(self.ff1(self.ln2(x))))


def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    if name == "mlp":
        return MLP().eval(), (torch.randn(2, 16),)
    if name == "cnn":
        m = SmallCNN().eval()
        with torch.no_grad():  # non-trivial batch-norm statistics
            m.bn.running_mean.uniform_(-0.5, 0.5)
            m.bn.running_var.uniform_(0.5, 2.0)
            m.bn.weight.uniform_(0.5, 1.5)
            m.bn.bias.uniform_(-0.2, 0.2)
        return m, (torch.randn(1, 3, 8, 8),)
    if name == "encoder":
        return TinyEncoder().eval(), (torch.randn(1, 6, 16),)
    raise KeyError(name)


def tiny_bert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A 1-layer ``transformers.BertModel`` (hidden 32, 2 heads, random weights, no download) on embeddings."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=16,
                     max_position_embeddings=16, attn_implementation="eager")
    bert = BertModel(cfg, add_pooling_layer=False).eval()

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bert(inputs_embeds=x).last_hidden_state

    return Wrapped().eval(), (torch.randn(1, 8, 32),)
