"""edgeport-example: ``ExampleBackend``, the tiny reference backend edgeport's own tests lower to.

Torch-free on import. ``ExamplePartitioner`` and ``preprocess`` (which need torch) load on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

from edgeport_example._version import __version__
from edgeport_example.capabilities import BACKEND_ID, CAPABILITIES
from edgeport_example.options import ExampleCompileOptions
from edgeport_example.runtime import ExampleExecutor

_LAZY = {
    "ExamplePartitioner": "edgeport_example.partitioner",
    "preprocess": "edgeport_example.preprocess",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeport_example' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BACKEND_ID",
    "CAPABILITIES",
    "ExampleCompileOptions",
    "ExampleExecutor",
    "ExamplePartitioner",
    "__version__",
    "preprocess",
]
