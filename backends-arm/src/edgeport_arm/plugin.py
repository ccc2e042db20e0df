"""edgeport plugin module of the Arm backends (``TOSABackend``, ``EthosUBackend``): hook implementations only.

Registration imports neither torch, ``tosa-tools`` nor Vela: they load when a partitioner, ``preprocess``, a
quantizer or an executor is first used.
"""

from __future__ import annotations

from typing import Any

import edgeport
from edgeport.backend import BackendSpec, PreprocessResult
from edgeport_arm._version import __version__
from edgeport_arm.capabilities import capabilities
from edgeport_arm.options import ETHOSU_BACKEND_ID, TOSA_BACKEND_ID, EthosUCompileSpec, TosaCompileSpec


def _preprocess_tosa(edge_program: Any, compile_specs: Any) -> PreprocessResult:
    from edgeport_arm.preprocess import preprocess_tosa

    return preprocess_tosa(edge_program, compile_specs)


def _preprocess_ethos_u(edge_program: Any, compile_specs: Any) -> PreprocessResult:
    from edgeport_arm.ethos_u import preprocess_ethos_u

    return preprocess_ethos_u(edge_program, compile_specs)


def _tosa_partitioner(*args: Any, **kwargs: Any) -> Any:
    from edgeport_arm.partitioner import TOSAPartitioner

    return TOSAPartitioner(*args, **kwargs)


def _ethos_u_partitioner(*args: Any, **kwargs: Any) -> Any:
    from edgeport_arm.partitioner import EthosUPartitioner

    return EthosUPartitioner(*args, **kwargs)


def _tosa_executor() -> Any:
    from edgeport_arm.runtime import TosaReferenceExecutor

    return TosaReferenceExecutor(TOSA_BACKEND_ID)


def _ethos_u_executor() -> Any:
    from edgeport_arm.runtime import TosaReferenceExecutor

    return TosaReferenceExecutor(ETHOSU_BACKEND_ID)


def _tosa_quantizer(**options: Any) -> Any:
    from edgeport_arm.quantizer import TOSAQuantizer

    return TOSAQuantizer(**options)


def _ethos_u_quantizer(**options: Any) -> Any:
    from edgeport_arm.quantizer import EthosUQuantizer

    return EthosUQuantizer(**options)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown version"


def _available() -> tuple[bool, str]:
    try:
        import tosa_reference_model  # noqa: F401
        import tosa_serializer  # noqa: F401
    except ImportError as exc:
        return False, (f"Arm's tosa-tools (TOSA serializer and reference model) cannot be imported: {exc}. "
                       "Fix: pip install tosa-tools (edgeport-arm depends on it)")
    return True, f"executes on Arm's TOSA reference model (tosa-tools {_version('tosa-tools')})"


def _ethos_u_available() -> tuple[bool, str]:
    ok, why = _available()
    if not ok:
        return ok, why
    try:
        import ethosu.vela  # noqa: F401
    except ImportError as exc:
        return False, f"Arm's Vela cannot be imported: {exc}. Fix: pip install ethos-u-vela==5.2.0"
    return True, (f"compiles with Vela {_version('ethos-u-vela')}; executes the carried TOSA graph on the reference "
                  f"model (tosa-tools {_version('tosa-tools')}), not on an NPU")


def _describe(processed: Any) -> dict[str, Any]:
    from edgeport_arm.describe import describe_tosa_blob

    return describe_tosa_blob(processed)


def _describe_ethos_u(processed: Any, named_data: Any = None) -> dict[str, Any]:
    from edgeport_arm.describe import describe_ethos_u_blob

    return describe_ethos_u_blob(processed, named_data=named_data)


@edgeport.hookimpl
def edgeport_register_backends(registry: Any) -> None:
    registry.add(BackendSpec(
        backend_id=TOSA_BACKEND_ID, version=__version__, preprocess=_preprocess_tosa,
        partitioner=_tosa_partitioner, executor=_tosa_executor, quantizers={"int8": _tosa_quantizer},
        capabilities=capabilities, compile_options=TosaCompileSpec, describe_blob=_describe,
        is_available=_available,
        description="Arm TOSA 1.0 graphs (INT and FP profiles), written with Arm's tosa_serializer and executed "
                    "on Arm's TOSA reference model; blobs as ExecuTorch's TOSABackend writes them"))
    registry.add(BackendSpec(
        backend_id=ETHOSU_BACKEND_ID, version=__version__, preprocess=_preprocess_ethos_u,
        partitioner=_ethos_u_partitioner, executor=_ethos_u_executor, quantizers={"int8": _ethos_u_quantizer},
        capabilities=capabilities, compile_options=EthosUCompileSpec, describe_blob=_describe_ethos_u,
        is_available=_ethos_u_available,
        description="Arm Ethos-U55/U65/U85 NPUs: int8 TOSA compiled by Arm's Vela into ExecuTorch's Ethos-U "
                    "block stream; runs here as reference execution of the carried TOSA graph"))
