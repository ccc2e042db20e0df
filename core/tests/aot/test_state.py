"""Stateful programs: buffers a method mutates are planned, start from their initial values, are written back in
place and carry across ``execute`` calls of one loaded method (ExecuTorch's encoding: the mutable-data segment).

Oracles: the eager module called with the same inputs in the same order (its buffers take the same writes), and
the stock ExecuTorch runtime running edgeport's program in a child process.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import edgeport
from edgeport.program.reader import load_pte
from edgeport.runtime import Runtime
from edgeport.testing.stock_runtime import run_steps


class KVCache(torch.nn.Module):
    """A KV-cache write (``index_copy_``, what Hugging Face's static cache does), a counter, attention over the
    cache and a Linear."""

    def __init__(self, slots: int = 6, width: int = 4) -> None:
        super().__init__()
        self.register_buffer("cache", torch.arange(slots * width, dtype=torch.float32).reshape(1, slots, width) / 10)
        self.register_buffer("steps", torch.zeros(1))
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(1, pos, self.proj(x))
        self.steps.add_(1)
        weights = torch.softmax(self.cache @ x.transpose(1, 2), dim=1)
        return (weights * self.cache).sum(1) + self.steps


class Recurrent(torch.nn.Module):
    """RNN-style state replaced whole by a value computed from it (written back with ``copy_``)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("h", torch.full((1, 3), 0.5))
        self.cell = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.cell(torch.cat([x, self.h], dim=1)))
        self.h.copy_(h)
        return h * 2


def _kv_steps(n: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(1, 1, 4, generator=gen), torch.tensor([i % 6])) for i in range(n)]


def _rnn_steps(n: int = 5) -> list[tuple[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(1, 3, generator=gen),) for _ in range(n)]


def _eager(model_cls, steps):
    torch.manual_seed(0)
    model = model_cls().eval()
    with torch.no_grad():
        return [model(*s).numpy() for s in steps]


def _program(model_cls, steps):
    torch.manual_seed(0)
    model = model_cls().eval()
    return edgeport.to_edge(torch.export.export(model, steps[0])).to_executorch()


CASES = [(KVCache, _kv_steps), (Recurrent, _rnn_steps)]


@pytest.mark.parametrize(("model_cls", "make_steps"), CASES, ids=["kv_cache", "recurrent"])
def test_state_carries_across_calls_and_a_fresh_load_starts_over(model_cls, make_steps):
    steps = make_steps()
    expected = _eager(model_cls, steps)
    pte = _program(model_cls, steps).buffer
    program = Runtime.get().load_program(pte)
    for _ in range(2):  # the second load starts again from the initial values
        method = program.load_method("forward")
        for inputs, want in zip(steps, expected):
            np.testing.assert_allclose(method.execute([t.numpy() for t in inputs])[0], want, rtol=1e-5, atol=1e-6)


def test_kv_cache_write_is_in_place_and_initial_values_are_in_the_mutable_segment():
    steps = _kv_steps()
    manager = _program(KVCache, steps)
    plan = manager.executorch_program.execution_plan[0]
    ops = [f"{o.name}.{o.overload}" for o in plan.operators]
    assert "aten::index_put_." in ops  # the cache is written in place, not copied whole
    assert "aten::index_put.out" not in ops
    assert "aten::copy_." in ops  # the counter is written back by copy_
    loaded = load_pte(manager.buffer)
    (segment,) = loaded.program.mutable_data_segments
    assert len(segment.offsets) == 3  # entry 0 (no data), the cache, the counter
    mutable = [v.val for v in plan.values if getattr(v.val, "allocation_info", None) is not None
               and v.val.data_buffer_idx > 0]
    assert sorted(t.sizes for t in mutable) == [[1], [1, 6, 4]]


@pytest.mark.parametrize(("model_cls", "make_steps"), CASES, ids=["kv_cache", "recurrent"])
def test_stock_runtime_runs_edgeport_stateful_program(model_cls, make_steps):
    steps = make_steps()
    expected = _eager(model_cls, steps)
    result = run_steps(_program(model_cls, steps).buffer, [[t.numpy() for t in s] for s in steps])
    assert result.ok, result.describe() + "\n" + result.log
    for outs, want in zip(result.outputs, expected):
        np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-6)


def test_state_only_in_buffers():
    class MutatesInput(torch.nn.Module):
        def forward(self, x):
            x.add_(1)
            return x * 2

    ep = torch.export.export(MutatesInput(), (torch.ones(2),))
    with pytest.raises(edgeport.UnsupportedOperatorError, match="USER_INPUT_MUTATION.*register_buffer"):
        edgeport.to_edge(ep).to_executorch()
