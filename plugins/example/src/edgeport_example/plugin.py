"""edgeport plugin module of ExampleBackend: hook implementations only.

Registration imports nothing heavy: the partitioner and ``preprocess`` (which need torch) are imported when first
used, so the torch-free runtime can discover this backend.
"""

from __future__ import annotations

from typing import Any

import edgeport
from edgeport.backend import BackendSpec, PreprocessResult
from edgeport_example._version import __version__
from edgeport_example.capabilities import BACKEND_ID, capabilities
from edgeport_example.options import ExampleCompileOptions
from edgeport_example.runtime import ExampleExecutor


def _preprocess(edge_program: Any, compile_specs: Any) -> PreprocessResult:
    from edgeport_example.preprocess import preprocess

    return preprocess(edge_program, compile_specs)


def _partitioner(*args: Any, **kwargs: Any) -> Any:
    from edgeport_example.partitioner import ExamplePartitioner

    return ExamplePartitioner(*args, **kwargs)


def _describe_blob(processed: Any) -> dict[str, Any]:
    from edgeport_example.describe import describe_blob

    return describe_blob(processed)


@edgeport.hookimpl
def edgeport_register_backends(registry: Any) -> None:
    registry.add(
        BackendSpec(
            backend_id=BACKEND_ID,
            version=__version__,
            preprocess=_preprocess,
            partitioner=_partitioner,
            executor=ExampleExecutor,
            capabilities=capabilities,
            compile_options=ExampleCompileOptions,
            describe_blob=_describe_blob,
            description="Tiny reference backend: float32 elementwise ops, mm/addmm/linear, run by numpy",
        )
    )
