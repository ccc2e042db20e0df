"""edgeport plugin module of ``CoreMLBackend``: hook implementations only.

Registration imports neither torch nor coremltools: they load when the partitioner, ``preprocess``, the executor
or ``describe_blob`` is first used.
"""

from __future__ import annotations

from typing import Any

import edgeport
from edgeport.backend import BackendSpec, PreprocessResult
from edgeport_coreml._version import __version__
from edgeport_coreml.capabilities import capabilities
from edgeport_coreml.options import COREML_BACKEND_ID, CoreMLCompileSpec


def _preprocess(edge_program: Any, compile_specs: Any) -> PreprocessResult:
    from edgeport_coreml.preprocess import preprocess_coreml

    return preprocess_coreml(edge_program, compile_specs)


def _partitioner(*args: Any, **kwargs: Any) -> Any:
    from edgeport_coreml.partitioner import CoreMLPartitioner

    return CoreMLPartitioner(*args, **kwargs)


def _executor() -> Any:
    from edgeport_coreml.runtime import CoreMLExecutor

    return CoreMLExecutor()


def _quantizer(*args: Any, **kwargs: Any) -> Any:
    from edgeport_coreml.quantizer import CoreMLQuantizer

    return CoreMLQuantizer(*args, **kwargs)


def _available() -> tuple[bool, str]:
    from edgeport_coreml.runtime import coreml_available

    return coreml_available()


def _describe(processed: Any) -> dict[str, Any]:
    from edgeport_coreml.describe import describe_coreml_blob

    return describe_coreml_blob(processed)


def _configure_command(parser: Any) -> None:
    from edgeport_coreml.cli import configure

    configure(parser)


def _run_command(args: Any) -> int:
    from edgeport_coreml.cli import run

    return run(args)


@edgeport.hookimpl
def edgeport_register_commands(registry: Any) -> None:
    registry.add(edgeport.CommandSpec("coreml", "Core ML tools (extract the models of a program)",
                                      _configure_command, _run_command))


@edgeport.hookimpl
def edgeport_register_backends(registry: Any) -> None:
    registry.add(BackendSpec(
        backend_id=COREML_BACKEND_ID, version=__version__, preprocess=_preprocess, partitioner=_partitioner,
        executor=_executor, quantizers={"CoreMLQuantizer": _quantizer}, capabilities=capabilities,
        compile_options=CoreMLCompileSpec, describe_blob=_describe,
        is_available=_available, execution_platforms=("darwin",),
        description="Apple Core ML: partitions converted to ML programs by coremltools 9.0 and stored as "
                    "ExecuTorch's flattened Core ML model directory; lowers anywhere, executes on macOS 13+/iOS 16+"))
