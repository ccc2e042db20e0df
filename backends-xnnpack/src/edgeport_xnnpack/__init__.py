"""edgeport-xnnpack: ``XnnpackBackend``, a CPU delegate running the real XNNPACK library.

Torch-free on import. ``XnnpackPartitioner``, ``XnnpackQuantizer`` and ``preprocess`` (which need torch) load on
first access.
"""

from __future__ import annotations

import importlib
from typing import Any

from edgeport_xnnpack._version import __version__
from edgeport_xnnpack.capabilities import BACKEND_ID, CAPABILITIES
from edgeport_xnnpack.options import XnnpackCompileOptions, XnnpackRuntimeOptions

_LAZY = {
    "XnnpackPartitioner": "edgeport_xnnpack.partitioner",
    "preprocess": "edgeport_xnnpack.preprocess",
    "XnnpackExecutor": "edgeport_xnnpack.runtime",
    "XnnpackQuantizer": "edgeport_xnnpack.quantizer",
    "is_available": "edgeport_xnnpack.native",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeport_xnnpack' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BACKEND_ID",
    "CAPABILITIES",
    "XnnpackCompileOptions",
    "XnnpackRuntimeOptions",
    "XnnpackExecutor",
    "XnnpackPartitioner",
    "XnnpackQuantizer",
    "__version__",
    "is_available",
    "preprocess",
]
