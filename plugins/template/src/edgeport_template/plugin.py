"""The edgeport plugin module of TemplateBackend: hook implementations only.

edgeport imports this module through the entry point in ``pyproject.toml``. Keep it cheap: registering must not
import torch or a vendor SDK, so the partitioner and ``preprocess`` are imported when first used.
"""

from __future__ import annotations

from typing import Any

import edgeport
from edgeport import BackendSpec, PreprocessResult
from edgeport_template.capabilities import BACKEND_ID, capabilities
from edgeport_template.options import TemplateCompileOptions
from edgeport_template.quantizer import quantizers
from edgeport_template.runtime import TemplateExecutor, is_available


def _preprocess(edge_program: Any, compile_specs: Any) -> PreprocessResult:
    from edgeport_template.preprocess import preprocess

    return preprocess(edge_program, compile_specs)


def _partitioner(*args: Any, **kwargs: Any) -> Any:
    from edgeport_template.partitioner import TemplatePartitioner

    return TemplatePartitioner(*args, **kwargs)


@edgeport.hookimpl
def edgeport_register_backends(registry: Any) -> None:
    from edgeport_template import __version__

    registry.add(
        BackendSpec(
            backend_id=BACKEND_ID,
            version=__version__,
            preprocess=_preprocess,
            partitioner=_partitioner,
            executor=TemplateExecutor,
            quantizers=quantizers(),
            capabilities=capabilities,
            compile_options=TemplateCompileOptions,
            is_available=is_available,
            description="TemplateBackend: float32 add/mul/relu/pad, run by numpy",
        )
    )
