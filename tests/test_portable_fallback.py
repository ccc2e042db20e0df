"""Portable fallbacks: a program can carry, per delegate, a method that computes the partition with portable ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import edgeport
from edgeport import ExecutorchBackendConfig, to_edge
from edgeport.backend import PORTABLE_FALLBACK_SPEC
from edgeport.runtime import Runtime


class TwoMM(torch.nn.Module):
    def forward(self, a, x, b):
        y = torch.mm(a, x) + b
        a = y - a
        return torch.mm(a, x) + b


def _program(demo_partitioner, fallbacks: bool):
    inputs = (torch.randn(2, 2), torch.randn(2, 2), torch.randn(2, 2))
    edge = to_edge(torch.export.export(TwoMM(), inputs)).to_backend(demo_partitioner())
    return inputs, edge.to_executorch(ExecutorchBackendConfig(portable_fallbacks=fallbacks))


def test_fallback_methods_are_written_and_named_in_compile_specs(demo_partitioner):
    _, program = _program(demo_partitioner, True)
    plans = {p.name: p for p in program.executorch_program.execution_plan}
    assert set(plans) == {"forward", "forward__fallback_0", "forward__fallback_1"}
    named = [dict((s.key, s.value) for s in d.compile_specs)[PORTABLE_FALLBACK_SPEC] for d in plans["forward"].delegates]
    assert named == [b"forward__fallback_0", b"forward__fallback_1"]


def test_runtime_without_the_backend_uses_the_fallback_only_when_allowed(demo_partitioner):
    # The tutorial's demo backend has no runtime executor: the delegates cannot run on edgeport's runtime.
    inputs, program = _program(demo_partitioner, True)
    loaded = Runtime.get().load_program(program.buffer)
    with pytest.raises(edgeport.EdgeportError, match="BackendWithCompilerDemo"):
        loaded.load_method("forward")
    method = loaded.load_method("forward", allow_fallback=True)
    (out,) = method.execute([t.numpy() for t in inputs])
    np.testing.assert_allclose(out, TwoMM()(*inputs).numpy(), rtol=1e-6, atol=1e-6)
    assert "fallback" in str(method.profile).lower()


def test_without_fallbacks_the_error_says_so(demo_partitioner):
    _, program = _program(demo_partitioner, False)
    loaded = Runtime.get().load_program(program.buffer)
    with pytest.raises(edgeport.EdgeportError, match="BackendWithCompilerDemo"):
        loaded.load_method("forward", allow_fallback=True)


def test_executorch_runtime_runs_the_fallback_method(demo_partitioner):
    et_runtime = pytest.importorskip("executorch.runtime")
    inputs, program = _program(demo_partitioner, True)
    loaded = et_runtime.Runtime.get().load_program(program.buffer)
    a, x, b = inputs
    (y,) = loaded.load_method("forward__fallback_0").execute([a, x, b])
    torch.testing.assert_close(y, torch.mm(a, x) + b)
