"""A planted crash for the isolation tests: stands in for QNN's finalize in the worker and kills it with SIGSEGV
(importable in the worker: the tests' folder is on the ``sys.path`` the worker receives)."""

from __future__ import annotations

import os
import signal
from typing import Any


def segfault(recipe: Any, soc_model: int | None, want_binary: bool) -> Any:
    """Crash like a native library would, whatever is asked."""
    os.kill(os.getpid(), signal.SIGSEGV)


def segfault_when_serializing(recipe: Any, soc_model: int | None, want_binary: bool) -> Any:
    """Crash only when a partition is lowered (``preprocess``); the partitioner's node checks run normally."""
    from edgeport_qnn.isolated import finalize_recipe

    if want_binary:
        os.kill(os.getpid(), signal.SIGSEGV)
    return finalize_recipe(recipe, soc_model, want_binary)
