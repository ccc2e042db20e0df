"""edgeport's Core ML backend (``CoreMLBackend``): ML programs converted by coremltools, ExecuTorch's blob format.

Public names load lazily (torch and coremltools are imported on first use).
"""

from __future__ import annotations

from typing import Any

from edgeport_coreml._version import __version__
from edgeport_coreml.options import (
    COREML_BACKEND_ID,
    CoreMLBackend,
    CoreMLCompileSpec,
    generate_compile_specs,
)

_LAZY = {"CoreMLPartitioner": "edgeport_coreml.partitioner", "CoreMLQuantizer": "edgeport_coreml.quantizer",
         "generate_enumerated_shapes_compile_spec": "edgeport_coreml.shapes"}

__all__ = ["COREML_BACKEND_ID", "CoreMLBackend", "CoreMLCompileSpec", "CoreMLPartitioner", "CoreMLQuantizer",
           "__version__", "generate_compile_specs", "generate_enumerated_shapes_compile_spec"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeport_coreml' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
