"""State updated inside an XNNPACK delegate (the new value is a delegate output, copied back) and around it (the
KV-cache write runs as ``index_put_`` on the CPU between delegates): both runtimes match eager step by step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import edgeport
from edgeport.runtime import Runtime
from edgeport.testing.stock_runtime import run_steps

pytest.importorskip("edgeport_xnnpack")


class Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("h", torch.full((1, 8), 0.25))
        self.cell = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.h.copy_(torch.tanh(self.cell(torch.cat([x, self.h], dim=1))))
        return self.h * 3


class Accumulate(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(2, 8))
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.acc.add_(self.fc(x))  # the add is delegated with the linear: the new state leaves the delegate
        return torch.relu(self.acc)


class Cache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 6, 8))
        self.q = torch.nn.Linear(8, 8)
        self.kv = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.k.index_copy_(1, pos, self.kv(x))
        scores = torch.softmax(self.q(x) @ self.k.transpose(1, 2), dim=-1)
        return scores @ self.k


def _steps(name: str) -> list[tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(5)
    if name == "recurrent":
        return [(torch.randn(1, 8, generator=gen),) for _ in range(5)]
    if name == "accumulate":
        return [(torch.randn(2, 8, generator=gen),) for _ in range(5)]
    return [(torch.randn(1, 1, 8, generator=gen), torch.tensor([i])) for i in range(5)]


MODELS = {"recurrent": Recurrent, "accumulate": Accumulate, "cache": Cache}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_state_with_xnnpack_delegates_on_both_runtimes(name):
    from edgeport_xnnpack import XnnpackPartitioner

    steps = _steps(name)
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    manager = edgeport.to_edge_transform_and_lower(torch.export.export(model, steps[0]),
                                                   partitioner=[XnnpackPartitioner()]).to_executorch()
    assert "XnnpackBackend" in manager.delegation_summary()
    torch.manual_seed(0)
    eager = MODELS[name]().eval()
    with torch.no_grad():
        want = [eager(*s).numpy() for s in steps]
    method = Runtime.get().load_program(manager.buffer).load_method()
    for s, w in zip(steps, want):
        np.testing.assert_allclose(method.execute([t.numpy() for t in s])[0], w, rtol=1e-5, atol=1e-5)
    result = run_steps(manager.buffer, [[t.numpy() for t in s] for s in steps])
    assert result.ok, result.describe() + "\n" + result.log
    for outs, w in zip(result.outputs, want):
        np.testing.assert_allclose(outs[0], w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_executorch_stateful_xnnpack_program_on_edgeport_runtime(name):
    """ExecuTorch's own program (its XnnpackPartitioner, initial values kept by its InitializedMutableBufferPass)
    runs on edgeport's runtime with eager's outputs, step by step."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtXnnpack
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    steps = _steps(name)
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["h", "acc", "k"])])
    with torch.no_grad():  # ExecuTorch's passes run the graph on the parameters
        pte = to_edge_transform_and_lower(torch.export.export(model, steps[0]),
                                          partitioner=[EtXnnpack()]).to_executorch(config).buffer
    torch.manual_seed(0)
    eager = MODELS[name]().eval()
    method = Runtime.get().load_program(pte).load_method()
    with torch.no_grad():
        for s in steps:
            np.testing.assert_allclose(method.execute([t.numpy() for t in s])[0], eager(*s).numpy(),
                                       rtol=1e-5, atol=1e-5)
