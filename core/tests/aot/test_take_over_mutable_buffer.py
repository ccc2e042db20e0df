"""``take_over_mutable_buffer``: a delegate owns a buffer the program mutates (ExecuTorch's option; Core ML state).

A test backend whose blob is the partition's own exported program (``torch.export.save``) and whose executor keeps
``program.module()`` -- and with it the buffer -- between calls. Oracle: the eager module called the same number of
times (its buffer accumulates the same writes).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

import edgeport
from edgeport import BackendSpec, PreprocessResult
from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner
from edgeport.backend import CapabilityTable, OpCapability
from edgeport.runtime import Runtime

BACKEND = "StatefulToyBackend"
SEEN: list[torch.export.ExportedProgram] = []


class Cache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(2, 4))
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.acc.add_(self.fc(x))  # the buffer's new value is computed inside the partition
        return torch.relu(self.acc) * 2


def _preprocess(program, compile_specs):
    SEEN.append(program)
    buf = io.BytesIO()
    torch.export.save(program, buf)
    return PreprocessResult(processed_bytes=buf.getvalue())


class _Executor:
    def init(self, processed, compile_specs):
        return torch.export.load(io.BytesIO(bytes(processed))).module()

    def execute(self, module, inputs):
        with torch.no_grad():
            out = module(*[torch.from_numpy(np.array(a)) for a in inputs])
        return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else (out,))]


TABLE = CapabilityTable(ops=tuple(OpCapability(op, ("float32",)) for op in (
    "aten.linear.default", "aten.addmm.default", "aten.permute_copy.default", "aten.add.Tensor",
    "aten.relu.default", "aten.mul.Tensor", "aten.mul.Scalar")))


class _Plugin:
    @edgeport.hookimpl
    def edgeport_register_backends(self, registry):
        registry.add(BackendSpec(backend_id=BACKEND, version="0", preprocess=_preprocess, executor=_Executor))


@pytest.fixture
def toy_backend():
    plugin = _Plugin()
    edgeport.register_plugin(plugin, name="stateful-toy")
    SEEN.clear()
    yield
    edgeport.unregister_plugin(plugin)


def _lower(take_over: bool):
    ep = torch.export.export(Cache().eval(), (torch.randn(2, 4),))
    part = CapabilityBasedPartitioner(BACKEND, TABLE, take_over_mutable_buffer=take_over)
    return edgeport.to_edge_transform_and_lower(ep, partitioner=[part])


def test_the_delegate_owns_the_buffer_and_runs_match_eager(toy_backend):
    edge = _lower(take_over=True)
    program = edge.exported_program()
    assert not program.graph_signature.buffers_to_mutate and "acc" not in program.state_dict
    assert [p.name for p in program.graph.nodes if p.op == "placeholder"] == ["x"]
    inner = SEEN[-1].graph_signature
    assert list(inner.buffers_to_mutate.values()) == ["acc"] and len(inner.user_outputs) == 1
    torch.manual_seed(3)
    model = Cache().eval()
    model.load_state_dict({"fc.weight": SEEN[-1].state_dict["fc.weight"], "fc.bias": SEEN[-1].state_dict["fc.bias"],
                           "acc": torch.zeros(2, 4)})
    method = Runtime.get().load_program(edge.to_executorch().buffer).load_method("forward")
    for step in range(3):
        x = torch.randn(2, 4)
        with torch.no_grad():
            want = model(x).numpy()
        got = method.execute([x.numpy()])[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"call {step}")


def test_without_take_over_the_buffer_stays_in_the_program(toy_backend):
    edge = _lower(take_over=False)
    assert list(edge.exported_program().graph_signature.buffers_to_mutate.values()) == ["acc"]
    assert all(not p.graph_signature.buffers_to_mutate for p in SEEN)
