"""``QnnBackend``'s executor: the partition's QNN context is created from the blob's context binary once at
``init`` (no graph rebuild) and executed with numpy buffers; ``destroy`` frees it. Torch-free.

Everything in the blob is checked before QNN sees a byte: edgeport's header (format version, QNN API version and
build, SoC), then the sealed context binary's size and SHA-256 -- a corrupted, truncated, foreign or
version-mismatched blob raises ``ProgramError`` at ``init`` and never reaches QNN's parsers (which do crash on
some corrupted inputs).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeport.backend import CompileSpec
from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport_qnn.blob import BlobError, BlobHeader, unpack_blob
from edgeport_qnn.options import QNN_BACKEND_ID, QnnRuntimeOptions

_LOCK = threading.Lock()
_BACKEND: Any = None


_F32 = np.dtype(np.float32)


def shared_backend() -> Any:
    """The process's HTP backend (loaded once; QNN allows one backend instance of a library per process)."""
    global _BACKEND
    with _LOCK:
        if _BACKEND is None or _BACKEND.closed:
            from edgeport_qnn.sdk import QnnBackend

            _BACKEND = QnnBackend.load("htp")
        return _BACKEND


@dataclass
class _Handle:
    header: BlobHeader
    context: Any
    graph: Any
    shapes: list[tuple[int, ...]]
    binary: bytes = b""  #: the sealed context binary (to load it again, see QnnExecutor.execute)
    soc: int | None = None


class QnnExecutor:
    """Runs QnnBackend delegates on the QNN HTP backend (on x86: Qualcomm's HTP emulator)."""

    thread_safe = True  # every QNN call of the shared backend is serialized by the SDK layer

    def is_available(self) -> tuple[bool, str]:
        from edgeport_qnn.sdk.locate import INSTALL_HINT, qnn_available

        if not qnn_available():
            return False, f"Qualcomm's QNN libraries are not installed; {INSTALL_HINT}"
        return True, ""

    def init(self, processed: memoryview, compile_specs: Sequence[CompileSpec],
             runtime_options: QnnRuntimeOptions | None = None) -> _Handle:
        from edgeport_qnn.sdk import QnnError

        try:
            header, sealed = unpack_blob(processed)
        except BlobError as exc:
            raise ProgramError(f"{QNN_BACKEND_ID}: {exc}") from None
        soc = (runtime_options or QnnRuntimeOptions()).soc_model
        if header.soc_model != soc:
            raise ProgramError(f"{QNN_BACKEND_ID}: the delegate was lowered for SoC {header.soc_model}, this runtime "
                               f"runs {soc} (QnnRuntimeOptions.soc_model); lower the model again for {soc}")
        try:
            backend = shared_backend()
        except (QnnError, OSError) as exc:
            raise ProgramError(f"{QNN_BACKEND_ID}: cannot load the QNN HTP backend: {exc}") from None
        core, backend_api = backend.api_version
        if (header.qnn_core_api, header.qnn_backend_api, header.qnn_build) != (core, backend_api, backend.build_id):
            raise ProgramError(
                f"{QNN_BACKEND_ID}: the delegate's context binary was built by QNN {header.qnn_build} (API "
                f"{header.qnn_core_api}/{header.qnn_backend_api}); this runtime has QNN {backend.build_id} (API "
                f"{core}/{backend_api}); lower the model again with this QNN")
        try:
            from edgeport_qnn.options import QcomChipset

            soc = int(QcomChipset[header.soc_model]) if header.device == "soc" else None
            context = backend.load_context(bytes(sealed), soc_model=soc)
        except (QnnError, ValueError, TypeError) as exc:
            raise ProgramError(f"{QNN_BACKEND_ID}: the context binary is unusable: {exc}") from None
        try:
            graph = context.graph(header.graph)
            shapes = [tuple(t["shape"]) for t in header.inputs]
            if ([tuple(s.shape) for s in graph.inputs] != shapes or
                    [tuple(s.shape) for s in graph.outputs] != [tuple(t["shape"]) for t in header.outputs] or
                    any(s.dtype != np.float32 for s in (*graph.inputs, *graph.outputs))):
                raise ProgramError(f"{QNN_BACKEND_ID}: the context binary's graph does not match the blob header")
        except ValueError as exc:
            context.close()
            raise ProgramError(f"{QNN_BACKEND_ID}: {exc}") from None
        except BaseException:
            context.close()
            raise
        return _Handle(header, context, graph, shapes, bytes(sealed), soc)

    def num_outputs(self, handle: _Handle) -> int:
        return len(handle.graph.outputs)

    def describe_execution(self, handle: _Handle) -> str:
        return f"QNN HTP ({handle.header.soc_model}; x86-64: Qualcomm's HTP emulator), QNN {handle.header.qnn_build}"

    def execute(self, handle: _Handle, inputs: Sequence[Any]) -> list[np.ndarray]:
        if len(inputs) != len(handle.shapes):
            raise RuntimeExecutionError(f"{QNN_BACKEND_ID}: {len(inputs)} inputs given, the graph takes "
                                        f"{len(handle.shapes)}")
        arrays = []
        for i, (x, shape) in enumerate(zip(inputs, handle.shapes, strict=True)):
            if type(x) is np.ndarray and x.dtype == _F32 and x.shape == shape and x.flags.c_contiguous:
                arrays.append(x)  # the common case, without conversions
                continue
            a = np.asarray(x)
            if a.dtype != np.float32 or a.shape != shape:
                raise RuntimeExecutionError(f"{QNN_BACKEND_ID}: input {i} must be float32 of shape {list(shape)}, "
                                            f"got {a.dtype} {list(a.shape)}")
            arrays.append(np.ascontiguousarray(a))
        try:
            return handle.graph.execute(arrays)
        except Exception as exc:
            from edgeport_qnn.sdk import QnnError  # imported here: a run's hot path stays import-free

            if isinstance(exc, QnnError) and "VTCM" in str(exc) and handle.binary:
                return self._reload_and_execute(handle, arrays)
            if isinstance(exc, (QnnError, ValueError)):
                raise RuntimeExecutionError(f"{QNN_BACKEND_ID}: graph execution failed: {exc}") from None
            raise

    @staticmethod
    def _reload_and_execute(handle: _Handle, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The x86 emulator runs contexts of one HTP configuration (a SoC's device, or the default device) at a
        time: after a context of the other one is loaded, this one's ``graphExecute`` fails ("Could't match
        allocated VTCM pointer to a VXU VTCM"). Loading its binary again makes it runnable: done once per failure."""
        from edgeport_qnn.sdk import QnnError

        old = handle.context
        try:
            context = shared_backend().load_context(handle.binary, soc_model=handle.soc)
            handle.context, handle.graph = context, context.graph(handle.header.graph)
            old.close()
            return handle.graph.execute(arrays)
        except (QnnError, ValueError) as exc:
            raise RuntimeExecutionError(f"{QNN_BACKEND_ID}: graph execution failed: {exc}") from None

    def destroy(self, handle: _Handle) -> None:
        handle.context.close()
