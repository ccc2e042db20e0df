"""The built-in plugin that registers edgeport's portable (numpy) kernels.

It is listed in :func:`edgeport.builtin_plugins.plugins` and so registers before entry-point plugins: a kernel
library installed as a plugin that registers the same op name overrides the portable kernel.
"""

from __future__ import annotations

from edgeport.hookspecs import hookimpl


@hookimpl
def edgeport_register_kernels(registry) -> None:
    from edgeport.runtime.portable import KERNELS, LIBRARY

    for op, fn in KERNELS.items():
        registry.add(op, fn, library=LIBRARY)
