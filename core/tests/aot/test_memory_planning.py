"""Memory planning: the greedy planner never overlaps live tensors, and a custom planner is used and checked."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeport import ExecutorchBackendConfig, to_edge
from edgeport.aot.memory_planning import GreedyMemoryPlanner, TensorLifetime, plan_memory


def _overlaps(a: TensorLifetime, oa: int, b: TensorLifetime, ob: int) -> bool:
    live_together = a.start <= b.end and b.start <= a.end
    return live_together and oa < ob + b.nbytes and ob < oa + a.nbytes


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 40), st.integers(0, 10)), min_size=1, max_size=40))
def test_greedy_plan_never_overlaps_live_tensors(specs):
    tensors = [TensorLifetime(f"t{i}", size, start, start + length) for i, (size, start, length) in enumerate(specs)]
    plan = plan_memory(tensors)
    for i, a in enumerate(tensors):
        assert plan.offsets[i] % 16 == 0
        assert plan.offsets[i] + a.nbytes <= plan.arena_bytes
        for j in range(i):
            assert not _overlaps(a, plan.offsets[i], tensors[j], plan.offsets[j])
    assert plan.arena_bytes <= plan.naive_bytes


def test_chain_of_tensors_reuses_memory():
    # A chain where each tensor dies right after the next is made needs two buffers, not N.
    tensors = [TensorLifetime(f"t{i}", 1024, i, i + 1) for i in range(100)]
    plan = plan_memory(tensors)
    assert plan.arena_bytes == 2 * 1024
    assert plan.naive_bytes == 100 * 1024


def test_custom_planner_is_used():
    calls = []

    def no_reuse(tensors):
        calls.append(len(tensors))
        offsets, at = [], 0
        for t in tensors:
            offsets.append(at)
            at += (t.nbytes + 15) // 16 * 16
        return offsets

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x + 1) * 2

    edge = to_edge(torch.export.export(M(), (torch.randn(8),)))
    greedy = edge.to_executorch().memory_reports[0]
    naive = edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=no_reuse)).memory_reports[0]
    assert calls and naive.arena_bytes == naive.naive_bytes
    assert greedy.arena_bytes < naive.arena_bytes


def test_planner_scales_to_thousands_of_tensors():
    rng = random.Random(0)
    tensors = []
    for i in range(3000):
        start = i
        tensors.append(TensorLifetime(f"t{i}", rng.randint(64, 4096), start, start + rng.randint(1, 5)))
    plan = plan_memory(tensors, GreedyMemoryPlanner())
    assert plan.arena_bytes < plan.naive_bytes / 50


def test_planner_returning_wrong_count_is_rejected():
    with pytest.raises(ValueError, match="returned 0 offsets for 1 tensors"):
        plan_memory([TensorLifetime("a", 4, 0, 1)], lambda ts: [])
