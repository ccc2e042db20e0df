"""edgeport: export PyTorch models, delegate subgraphs to hardware backends, write ExecuTorch-compatible programs.

Importing ``edgeport`` is light: it does not import torch. The AOT names (``to_edge`` and friends) are loaded
on first use; ``edgeport.runtime`` never needs torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from edgeport.backend import (
    BackendSpec,
    CapabilityTable,
    CompileOptions,
    CompileSpec,
    DelegationSpec,
    OpCapability,
    PreprocessResult,
    RuntimeExecutor,
    RuntimeOptions,
)
from edgeport.errors import (
    BackendNotFoundError,
    BackendOptionsError,
    EdgeportError,
    ExportError,
    LoweringError,
    PartitionError,
    PluginLoadError,
    ProgramError,
    SerializationError,
    UnsupportedOperatorError,
    VerificationError,
)
from edgeport.hookspecs import hookimpl, hookspec
from edgeport.registry import (
    BackendRegistry,
    CommandRegistry,
    CommandSpec,
    KernelRegistry,
    get_backend,
    list_backends,
    plugin_errors,
    register_plugin,
    unregister_plugin,
)

__version__ = "0.1.0"

# name -> module holding it; imported lazily because these modules import torch.
_LAZY = {
    "to_edge": "edgeport.aot.edge",
    "to_edge_transform_and_lower": "edgeport.aot.edge",
    "EdgeProgramManager": "edgeport.aot.edge",
    "EdgeCompileConfig": "edgeport.aot.config",
    "ExecutorchBackendConfig": "edgeport.aot.config",
    "ExecutorchProgramManager": "edgeport.aot.executorch_manager",
    "to_backend": "edgeport.aot.to_backend",
    "LoweredBackendModule": "edgeport.aot.lowered_module",
    "Partitioner": "edgeport.aot.partitioner",
    "PartitionResult": "edgeport.aot.partitioner",
    "CapabilityBasedPartitioner": "edgeport.aot.capability_partitioner",
    "ExportPass": "edgeport.aot.passes.base",
    "tag_delegate_constants": "edgeport.aot.passes.external_constants",
    "load": "edgeport.runtime",
    "lower": "edgeport.targets",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeport' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BackendOptionsError",
    "BackendNotFoundError",
    "BackendRegistry",
    "BackendSpec",
    "CapabilityTable",
    "CommandRegistry",
    "CommandSpec",
    "CompileOptions",
    "CompileSpec",
    "DelegationSpec",
    "EdgeportError",
    "ExportError",
    "KernelRegistry",
    "LoweringError",
    "OpCapability",
    "PartitionError",
    "PluginLoadError",
    "PreprocessResult",
    "ProgramError",
    "RuntimeExecutor",
    "RuntimeOptions",
    "SerializationError",
    "UnsupportedOperatorError",
    "VerificationError",
    "get_backend",
    "hookimpl",
    "hookspec",
    "list_backends",
    "plugin_errors",
    "register_plugin",
    "unregister_plugin",
    *_LAZY,
]
