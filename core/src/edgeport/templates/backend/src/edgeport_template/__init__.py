"""edgeport-template: ``TemplateBackend``, an edgeport backend plugin.

Torch-free on import (the runtime side needs only numpy); ``TemplatePartitioner`` and ``preprocess``, which need
torch, load on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

from edgeport_template.capabilities import BACKEND_ID, CAPABILITIES
from edgeport_template.options import TemplateCompileOptions
from edgeport_template.runtime import TemplateExecutor

__version__ = "0.1.0"  # keep equal to pyproject.toml's version: it is recorded in every blob

_LAZY = {
    "TemplatePartitioner": "edgeport_template.partitioner",
    "preprocess": "edgeport_template.preprocess",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeport_template' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BACKEND_ID",
    "CAPABILITIES",
    "TemplateCompileOptions",
    "TemplateExecutor",
    "TemplatePartitioner",
    "__version__",
    "preprocess",
]
