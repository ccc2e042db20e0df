"""The lowering table: capability-table op name -> function(builder, node) emitting XNNPACK nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LOWERINGS: dict[str, Callable[[Any, Any], None]] = {}


def lowers(*ops: str) -> Callable[[Callable[[Any, Any], None]], Callable[[Any, Any], None]]:
    """Register the decorated function as the lowering of ``ops``."""

    def register(fn: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        for op in ops:
            LOWERINGS[op] = fn
        return fn

    return register
