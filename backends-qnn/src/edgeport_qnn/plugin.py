"""edgeport plugin module of ``QnnBackend``: hook implementations only.

Registration imports neither torch nor Qualcomm's libraries: they load when a partitioner, ``preprocess`` or an
executor is first used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import edgeport
from edgeport.backend import BackendSpec, PreprocessResult
from edgeport_qnn import __version__
from edgeport_qnn.capabilities import capabilities
from edgeport_qnn.options import QNN_BACKEND_ID, QnnCompileOptions, QnnRuntimeOptions


def _preprocess(edge_program: Any, compile_specs: Any) -> PreprocessResult:
    from edgeport_qnn.preprocess import preprocess

    return preprocess(edge_program, compile_specs)


def _partitioner(*args: Any, **kwargs: Any) -> Any:
    from edgeport_qnn.partitioner import QnnPartitioner

    return QnnPartitioner(*args, **kwargs)


def _executor() -> Any:
    from edgeport_qnn.runtime import QnnExecutor

    return QnnExecutor()


def _quantizer(quant_dtype: str = "use_8a8w") -> Callable[..., Any]:
    """A factory of ``QnnQuantizer`` for one ``QuantDtype`` name."""

    def make(**options: Any) -> Any:
        from edgeport_qnn.quantizer import QnnQuantizer, QuantDtype

        return QnnQuantizer(quant_dtype=QuantDtype[quant_dtype], **options)
    return make


def _available() -> tuple[bool, str]:
    from edgeport_qnn.sdk.locate import INSTALL_HINT, QnnLibrariesNotFound, find_qnn_libraries

    try:
        libs = find_qnn_libraries()
    except QnnLibrariesNotFound:
        return False, f"Qualcomm's QNN libraries are not installed; {INSTALL_HINT}"
    if "htp" not in libs.backends:
        return False, f"no libQnnHtp.so in {libs.directory}; {INSTALL_HINT}"
    return True, (f"QNN {libs.qnn_version or '?'} HTP from {libs.source}; on x86-64 the HTP runs in Qualcomm's "
                  "emulator (correct, slow)")


def _describe(processed: Any) -> dict[str, Any]:
    from edgeport_qnn.blob import describe_blob

    return describe_blob(processed)


@edgeport.hookimpl
def edgeport_register_backends(registry: Any) -> None:
    registry.add(BackendSpec(
        backend_id=QNN_BACKEND_ID, version=__version__, preprocess=_preprocess, partitioner=_partitioner,
        executor=_executor, capabilities=capabilities,
        quantizers={"uint8": _quantizer(), "16a8w": _quantizer("use_16a8w"), "16a16w": _quantizer("use_16a16w")},
        compile_options=QnnCompileOptions,
        runtime_options=QnnRuntimeOptions, describe_blob=_describe, is_available=_available,
        description="Qualcomm QNN HTP graphs built through the QNN C API, stored as context binaries "
                    "(x86-64: Qualcomm's HTP emulator)"))
