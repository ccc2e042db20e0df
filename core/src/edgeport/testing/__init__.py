"""Test support shipped with the core: the model zoo (:mod:`edgeport.testing.models`), the seed tutorial's demo
backend (:mod:`edgeport.testing.tutorial_backend`), real-world architectures from Hugging Face ``transformers``
(:mod:`edgeport.testing.architectures`), the stock ExecuTorch runtime in a child process
(:mod:`edgeport.testing.stock_runtime`) and the backend conformance suite
(:mod:`edgeport.testing.conformance`; ``from edgeport.testing import BackendConformance``).

Importing this package is light; the conformance suite (which needs pytest and torch) loads on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ARCHITECTURES": "edgeport.testing.architectures",
    "Architecture": "edgeport.testing.architectures",
    "assert_close_to_scale": "edgeport.testing.architectures",
    "BackendConformance": "edgeport.testing.conformance",
    "Const": "edgeport.testing.conformance",
    "Sample": "edgeport.testing.conformance",
    "SAMPLES": "edgeport.testing.conformance",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeport.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["ARCHITECTURES", "SAMPLES", "Architecture", "BackendConformance", "Const", "Sample", "assert_close_to_scale"]
