"""edgeport plugin module of XnnpackBackend: hook implementations only.

Registration imports neither torch nor libXNNPACK: the partitioner and ``preprocess`` (torch) and the quantizer
(torchao) load when first used, the native library when an executor checks availability or initializes a
delegate.
"""

from __future__ import annotations

from typing import Any

import edgeport
from edgeport.backend import BackendSpec, PreprocessResult
from edgeport_xnnpack._version import __version__
from edgeport_xnnpack.capabilities import BACKEND_ID, capabilities
from edgeport_xnnpack.options import XnnpackCompileOptions, XnnpackRuntimeOptions


def _preprocess(edge_program: Any, compile_specs: Any) -> PreprocessResult:
    from edgeport_xnnpack.preprocess import preprocess

    return preprocess(edge_program, compile_specs)


def _partitioner(*args: Any, **kwargs: Any) -> Any:
    from edgeport_xnnpack.partitioner import XnnpackPartitioner

    return XnnpackPartitioner(*args, **kwargs)


def _executor() -> Any:
    from edgeport_xnnpack.runtime import XnnpackExecutor

    return XnnpackExecutor()


def _int8_quantizer(**options: Any) -> Any:
    """``XnnpackQuantizer(**options)``: static int8 (imports torchao on first use)."""
    from edgeport_xnnpack.quantizer import XnnpackQuantizer

    return XnnpackQuantizer(**options)


def _is_available() -> tuple[bool, str]:
    """The libraries' availability; when available but the C glue is not built, a note saying so."""
    from edgeport_xnnpack.native import glue_status, is_available

    ok, why = is_available()
    if ok:
        kind, why_python = glue_status()
        if kind != "c":
            return True, f"per-call work in Python, slower: {why_python}"
    return ok, why


def _describe_blob(processed: Any) -> dict[str, Any]:
    from edgeport_xnnpack.describe import describe_blob

    return describe_blob(processed)


@edgeport.hookimpl
def edgeport_register_backends(registry: Any) -> None:
    registry.add(
        BackendSpec(
            backend_id=BACKEND_ID,
            version=__version__,
            preprocess=_preprocess,
            partitioner=_partitioner,
            executor=_executor,
            quantizers={"int8": _int8_quantizer},
            capabilities=capabilities,
            compile_options=XnnpackCompileOptions,
            runtime_options=XnnpackRuntimeOptions,
            describe_blob=_describe_blob,
            is_available=_is_available,
            description="CPU: the XNNPACK library (libXNNPACK) through its C subgraph API; "
            "blobs in ExecuTorch's XNNPACK delegate format",
        )
    )
