"""Mutable buffers become Core ML state (iOS18+): a KV-cache-like buffer written with ``index_put_`` converts to a
state of the buffer's name and shape, read and written by ``read_state`` / ``write_state``, and the
buffer's new value is no model output -- lowering the whole program with ``to_backend(backend_id, edge_program,
compile_specs)`` or through ``CoreMLPartitioner`` (``take_over_mutable_buffer=True``: the delegate owns the buffer,
which leaves the program). ExecuTorch 1.5.1's ``CoreMLPartitioner`` writes the same state description (oracle)."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from coreml_models import load_package, mil_ops

from edgeport import to_edge
from edgeport.aot.to_backend import to_backend
from edgeport.errors import LoweringError
from edgeport_coreml import generate_compile_specs
from edgeport_coreml.schema.flat_directory import read_flat_directory


class KvCache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, 8, 16))
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.k_cache.index_put_((torch.tensor([0]), pos), self.proj(x).reshape(1, 16))
        return torch.relu(self.k_cache).sum(dim=1)


def _export():
    torch.manual_seed(0)
    return torch.export.export(KvCache().eval(), (torch.randn(1, 1, 16), torch.tensor([3])))


@functools.cache
def _blob(target: str = "iOS18") -> bytes:
    edge = to_edge(_export()).exported_program()
    assert edge.graph_signature.buffers_to_mutate
    specs = generate_compile_specs(minimum_deployment_target=target, compute_precision="float32")
    return bytes(to_backend("CoreMLBackend", edge, specs).processed_bytes)


def _states(blob: bytes):
    _root, mlmodel = load_package(blob)
    spec = mlmodel.get_spec()
    return spec, [(s.name, list(s.type.stateType.arrayType.shape), s.type.stateType.arrayType.dataType)
                  for s in spec.description.state]


def test_mutable_buffer_becomes_state():
    spec, states = _states(_blob())
    assert spec.specificationVersion == 9
    assert states == [("k_cache", [1, 8, 16], 65552)]  # FLOAT16: "Core ML only supports fp16 states"
    assert {"read_state", "write_state", "scatter_nd"} <= set(mil_ops(spec))
    assert [i.name for i in spec.description.input] == ["x", "pos"]
    meta = json.loads(read_flat_directory(_blob()).read("metadata.json"))
    assert meta["outputNames"] == [o.name for o in spec.description.output] and len(meta["outputNames"]) == 1


def test_state_needs_ios18():
    with pytest.raises(LoweringError, match=r"mutates buffers \['k_cache'\].*needs minimum_deployment_target iOS18"):
        _blob("iOS17")


@pytest.mark.executorch
def test_executorch_writes_the_same_state():
    pytest.importorskip("executorch.backends.apple.coreml.partition")
    import coremltools as ct
    from executorch.backends.apple.coreml.compiler import CoreMLBackend
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner as EtPartitioner
    from executorch.exir import to_edge_transform_and_lower as et_lower

    specs = CoreMLBackend.generate_compile_specs(compute_precision=ct.precision.FLOAT32,
                                                 minimum_deployment_target=ct.target.iOS18)
    edge = et_lower(_export(), partitioner=[EtPartitioner(compile_specs=specs, take_over_mutable_buffer=True)])
    blob = bytes(edge.exported_program().graph_module.lowered_module_0.processed_bytes)
    _spec, theirs = _states(blob)
    assert theirs == _states(_blob())[1]


def test_the_partitioner_hands_the_buffer_to_core_ml():
    """Through ``to_edge_transform_and_lower``: the buffer and its write-back leave the program, the delegate's
    Core ML model holds it as state, and the program still serializes."""
    from edgeport import to_edge_transform_and_lower
    from edgeport_coreml import CoreMLPartitioner

    specs = generate_compile_specs(minimum_deployment_target="iOS18", compute_precision="float32")
    edge = to_edge_transform_and_lower(_export(), partitioner=[CoreMLPartitioner(compile_specs=specs)])
    program = edge.exported_program()
    assert not program.graph_signature.buffers_to_mutate and "k_cache" not in program.state_dict
    lowered = program.graph_module.lowered_module_0
    inner = lowered.original_module.graph_signature
    assert list(inner.buffers_to_mutate.values()) == ["k_cache"]
    assert len(lowered.output_metas()) == 1  # the user output only
    _spec, states = _states(bytes(lowered.processed_bytes))
    assert states == [("k_cache", [1, 8, 16], 65552)]
    assert edge.to_executorch().buffer  # the program serializes with the delegate owning the state


def test_below_ios18_the_buffer_stays_in_the_program():
    from edgeport import to_edge_transform_and_lower
    from edgeport_coreml import CoreMLPartitioner

    specs = generate_compile_specs(minimum_deployment_target="iOS17", compute_precision="float32")
    edge = to_edge_transform_and_lower(_export(), partitioner=[CoreMLPartitioner(compile_specs=specs)])
    program = edge.exported_program()
    assert list(program.graph_signature.buffers_to_mutate.values()) == ["k_cache"]
    for name, child in program.graph_module.named_children():
        if name.startswith("lowered_module_"):
            assert not child.original_module.graph_signature.buffers_to_mutate
