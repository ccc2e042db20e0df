"""The hook specifications of edgeport's plugin contract.

Every hook is prefixed ``edgeport_`` and documented here; implement one with ``@edgeport.hookimpl`` in a
module that a distribution exposes under the entry-point group ``edgeport.backends``::

    [project.entry-points."edgeport.backends"]
    mybackend = "mybackend_pkg.plugin"

Registration hooks receive a typed registry object and add to it; they return nothing. New hooks are added
here without changing the signature of existing ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from edgeport.registry import BackendRegistry, CommandRegistry, KernelRegistry

PROJECT_NAME = "edgeport"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def edgeport_register_backends(registry: BackendRegistry) -> None:
    """Register the plugin's backends.

    Call ``registry.add(BackendSpec(...))`` once per backend. Keep this hook cheap: import heavy SDKs inside the
    factories the spec carries, not at module import time. An exception raised here is reported against the
    plugin's distribution and does not affect other plugins.
    """


@hookspec
def edgeport_register_kernels(registry: KernelRegistry) -> None:
    """Register kernels for non-delegated operators, used by the Python runtime.

    Call ``registry.add(op_name, kernel, library=...)`` where ``op_name`` is the ExecuTorch operator name with its
    out overload (``"aten::add.out"``) and ``kernel`` is a callable over numpy arrays following the calling
    convention documented in :mod:`edgeport.runtime.kernel_utils` (schema arguments in order, preallocated out
    arrays included; the kernel writes and returns the outs). A later registration of the same op from another
    library overrides the built-in portable kernel; the runtime reports which library each op came from in the
    method's profile.
    """


@hookspec
def edgeport_register_commands(registry: CommandRegistry) -> None:
    """Register subcommands of the ``edgeport`` command line (``edgeport coreml extract ...``).

    Call ``registry.add(CommandSpec(name, help, configure, run))``: ``configure(parser)`` adds the command's
    arguments (and its own subcommands) to an ``argparse`` parser, ``run(args)`` does the work and returns the exit
    status. Import heavy modules inside ``run``, not at module import time. A name that a built-in command or
    another plugin already uses is refused and reported as a plugin failure.
    """
