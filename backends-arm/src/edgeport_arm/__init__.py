"""edgeport's Arm backends: ``TOSABackend`` (TOSA 1.0 graphs) and ``EthosUBackend`` (Vela for Ethos-U NPUs).

Public names load lazily (torch, tosa-tools and Vela are imported on first use).
"""

from __future__ import annotations

from typing import Any

from edgeport_arm._version import __version__
from edgeport_arm.options import (
    ETHOSU_BACKEND_ID,
    ETHOSU_TARGETS,
    TOSA_BACKEND_ID,
    EthosUCompileSpec,
    TosaCompileSpec,
    TosaSpecification,
)

_LAZY = {
    "TOSAPartitioner": "edgeport_arm.partitioner",
    "EthosUPartitioner": "edgeport_arm.partitioner",
    "TOSAQuantizer": "edgeport_arm.quantizer",
    "EthosUQuantizer": "edgeport_arm.quantizer",
}

__all__ = ["ETHOSU_BACKEND_ID", "ETHOSU_TARGETS", "TOSA_BACKEND_ID", "EthosUCompileSpec", "EthosUPartitioner",
           "EthosUQuantizer", "TOSAPartitioner", "TOSAQuantizer", "TosaCompileSpec", "TosaSpecification",
           "__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeport_arm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
