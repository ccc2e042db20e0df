"""edgeport's Python runtime: load a ``.pte`` program and run it on numpy, without torch.

Mirrors ``executorch.runtime``::

    from edgeport.runtime import Runtime
    program = Runtime.get().load_program("model.pte")      # memory-mapped, verified
    method = program.load_method("forward")
    outputs = method.execute([x])                          # numpy arrays in and out
    method.metadata.input_shapes, method.profile

or, shorter, ``edgeport.load("model.pte").forward(x)``.

Non-delegated ops run on kernels from the kernel registry (``edgeport_register_kernels``; the portable numpy
library is a built-in plugin), delegate calls on the executors of registered backends. This package imports
neither torch nor any backend SDK; its dependencies are numpy and flatbuffers.
"""

from __future__ import annotations

from edgeport.runtime._api import LoadedProgram, Method, MethodMeta, Program, Runtime, TensorInfo, load
from edgeport.runtime._backends import BackendStatus, backends
from edgeport.runtime._delegates import FALLBACK_COMPILE_SPEC
from edgeport.runtime._profile import DelegateInfo, MethodProfile

__all__ = [
    "BackendStatus",
    "backends",
    "FALLBACK_COMPILE_SPEC",
    "DelegateInfo",
    "LoadedProgram",
    "Method",
    "MethodMeta",
    "MethodProfile",
    "Program",
    "Runtime",
    "TensorInfo",
    "load",
]
