"""Next-token sampling as ExecuTorch's runner does it: greedy (temperature 0), or temperature with top-p, seeded."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Sampler", "SamplingConfig"]


@dataclass(frozen=True)
class SamplingConfig:
    """``temperature`` 0 is greedy (argmax); otherwise logits / temperature, softmax, then the smallest set of
    tokens whose probabilities reach ``top_p``, drawn with a generator seeded by ``seed``."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")


class Sampler:
    """Picks the next token from a row of logits."""

    def __init__(self, config: SamplingConfig | None = None) -> None:
        self.config = config or SamplingConfig()
        self._rng = np.random.default_rng(self.config.seed)

    def __call__(self, logits: np.ndarray) -> int:
        row = np.asarray(logits, dtype=np.float64).reshape(-1)
        if not np.all(np.isfinite(row)):
            raise ValueError("the model produced non-finite logits (NaN or inf): the program or its inputs are wrong")
        if self.config.temperature == 0:
            return int(np.argmax(row))
        scaled = row / self.config.temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        if self.config.top_p < 1:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            keep = order[: int(np.searchsorted(cumulative, self.config.top_p) + 1)]
            kept = probs[keep] / probs[keep].sum()
            return int(keep[self._rng.choice(len(keep), p=kept)])
        return int(self._rng.choice(len(probs), p=probs))
