"""Plugins that ship inside the core and are registered before entry-point plugins."""

from __future__ import annotations

from types import ModuleType


def plugins() -> list[tuple[str, ModuleType]]:
    """(name, module) for each built-in plugin. Imports are local so that ``edgeport`` imports stay light."""
    from edgeport.runtime import portable_plugin

    return [("edgeport-portable-kernels", portable_plugin)]
