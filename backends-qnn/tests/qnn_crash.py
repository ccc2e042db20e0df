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


def refuse_two_multiplies(recipe: Any, soc_model: int | None, want_binary: bool) -> Any:
    """Refuse (as QNN refuses some graphs only when it prepares them whole) every graph holding two or more
    ``ElementWiseMultiply`` nodes, without naming a node; finalize the others for real."""
    from edgeport_qnn.isolated import finalize_recipe
    from edgeport_qnn.sdk import QnnError

    if sum(op == "ElementWiseMultiply" for op in recipe.qnn_ops()) >= 2:
        raise QnnError("graphFinalize 'forward' failed (planted refusal)", 1002)
    return finalize_recipe(recipe, soc_model, want_binary)
