"""ExampleBackend's capability table: what its partitioner takes, what preprocess accepts, what the docs list.

Torch-free: the constraints only read ``node.args`` and ``node.meta["val"]``.
"""

from __future__ import annotations

from typing import Any

from edgeport.backend import CapabilityTable, OpCapability

BACKEND_ID = "ExampleBackend"


def _rank(value: Any) -> int | None:
    val = getattr(value, "meta", {}).get("val")
    return val.dim() if hasattr(val, "dim") else None


def _transpose_2d(node: Any) -> str | None:
    rank = _rank(node.args[0])
    if rank != 2:
        return f"only 2-D transposes are supported (input has rank {rank})"
    dims = [d % 2 for d in node.args[1]]
    if dims != [1, 0]:
        return f"only the 2-D transpose [1, 0] is supported, got dims {list(node.args[1])}"
    return None


def _linear(node: Any) -> str | None:
    weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
    if _rank(weight) != 2:
        return "linear needs a 2-D weight"
    return None


_F32 = ("float32",)

CAPABILITIES = CapabilityTable(
    (
        OpCapability("aten.add.Tensor", _F32, notes="broadcasting; alpha"),
        OpCapability("aten.mul.Tensor", _F32, notes="broadcasting"),
        OpCapability("aten.sub.Tensor", _F32, notes="broadcasting; alpha"),
        OpCapability("aten.sin.default", _F32),
        OpCapability("aten.relu.default", _F32),
        OpCapability("aten.mm.default", _F32),
        OpCapability("aten.addmm.default", _F32, notes="beta, alpha"),
        OpCapability("aten.permute_copy.default", _F32, constraint=_transpose_2d, notes="2-D transpose only"),
        OpCapability(
            "aten.linear.default",
            _F32,
            constraint=_linear,
            notes="kept whole via ops_to_not_decompose; optional bias",
        ),
    )
)


def capabilities() -> CapabilityTable:
    """The table (the factory ``BackendSpec.capabilities`` expects)."""
    return CAPABILITIES
