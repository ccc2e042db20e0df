"""Fixtures for the AOT tests: the seed tutorial's demo backend, registered as a user-script plugin."""

from __future__ import annotations

import pytest
import torch

import edgeport
from edgeport import BackendSpec, CapabilityTable, CompileSpec, OpCapability, PreprocessResult
from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner

DEMO_ID = "BackendWithCompilerDemo"
DEMO_OPS = {"aten.sin.default", "aten.mm.default", "aten.add.Tensor"}


def demo_preprocess(edge_program, compile_specs):
    """Like the tutorial's demo backend: one text record per supported op."""
    records = []
    for node in edge_program.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        name = str(node.target)
        if name not in DEMO_OPS:
            raise RuntimeError(f"{name} is not supported in backend {DEMO_ID}")
        val = node.meta["val"]
        records.append(f"op:demo::{name}, numel:{val.numel()}, dtype:{val.dtype}#")
    return PreprocessResult(processed_bytes=(f"{len(records)}#" + "".join(records)).encode())


class AddMulPartitionerDemo(CapabilityBasedPartitioner):
    def __init__(self) -> None:
        table = CapabilityTable(ops=(OpCapability("aten.add.Tensor"), OpCapability("aten.mm.default")))
        super().__init__(DEMO_ID, table, [CompileSpec("max_value", bytes([4]))])


class DemoPlugin:
    @edgeport.hookimpl
    def edgeport_register_backends(self, registry):
        registry.add(BackendSpec(backend_id=DEMO_ID, version="0.0.1", preprocess=demo_preprocess,
                                 partitioner=AddMulPartitionerDemo, description="tutorial demo"))


_PLUGIN = DemoPlugin()


@pytest.fixture
def demo_backend():
    edgeport.register_plugin(_PLUGIN, name="tutorial-demo")
    yield DEMO_ID
    edgeport.unregister_plugin(_PLUGIN)


@pytest.fixture
def seeded():
    torch.manual_seed(0)


@pytest.fixture
def demo_partitioner(demo_backend):
    return AddMulPartitionerDemo
