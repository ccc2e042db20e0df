"""The seed tutorial's demo backend (``BackendWithCompilerDemo``) and its ``AddMulPartitionerDemo``.

Used by tests to exercise the lowering contract with a backend defined in a script (registered with
``edgeport.register_plugin``), exactly as a user would. ``preprocess`` writes one text record per op.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import edgeport
from edgeport.backend import BackendSpec, CapabilityTable, CompileSpec, OpCapability, PreprocessResult

DEMO_ID = "BackendWithCompilerDemo"
DEMO_OPS = frozenset({"aten.sin.default", "aten.mm.default", "aten.add.Tensor"})


def demo_preprocess(edge_program: Any, compile_specs: list[CompileSpec]) -> PreprocessResult:
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


def add_mul_partitioner() -> Any:
    """The tutorial's partitioner: tags ``add.Tensor`` and ``mm`` (despite its name) for the demo backend."""
    from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner

    class AddMulPartitionerDemo(CapabilityBasedPartitioner):
        def __init__(self) -> None:
            table = CapabilityTable(ops=(OpCapability("aten.add.Tensor"), OpCapability("aten.mm.default")))
            super().__init__(DEMO_ID, table, [CompileSpec("max_value", bytes([4]))])

    return AddMulPartitionerDemo()


class DemoPlugin:
    @edgeport.hookimpl
    def edgeport_register_backends(self, registry: Any) -> None:
        registry.add(BackendSpec(backend_id=DEMO_ID, version="0.0.1", preprocess=demo_preprocess,
                                 partitioner=add_mul_partitioner, description="the seed tutorial's demo backend"))


_PLUGIN = DemoPlugin()


@contextmanager
def demo_backend_registered() -> Iterator[str]:
    """Register the demo backend for the duration of a ``with`` block; yields its backend id."""
    edgeport.register_plugin(_PLUGIN, name="tutorial-demo")
    try:
        yield DEMO_ID
    finally:
        edgeport.unregister_plugin(_PLUGIN)
