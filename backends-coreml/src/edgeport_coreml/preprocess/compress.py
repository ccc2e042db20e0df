"""Post-conversion weight compression (``coremltools.optimize.coreml``) chosen by the compile specs.

``op_linear_quantizer_config`` -> ``linear_quantize_weights`` (``constexpr_affine_dequantize`` before iOS18,
``constexpr_blockwise_shift_scale`` from iOS18); ``op_palettizer_config`` -> ``palettize_weights``
(``constexpr_lut_to_dense``). Every const above ``weight_threshold`` elements is compressed (the partitioner claims
no ``gather``/embedding, so ExecuTorch's exception for embedding tables does not arise). coremltools' progress bars
are captured, never printed.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

from edgeport_coreml.compression import LINEAR_QUANTIZER_KEY, PALETTIZER_KEY
from edgeport_coreml.options import COREML_BACKEND_ID, CoreMLCompileSpec, UnconvertiblePartition

__all__ = ["compress_weights"]


def compress_weights(mlmodel: Any, options: CoreMLCompileSpec) -> Any:
    """``mlmodel`` with its weights compressed as ``options`` asks (unchanged when it asks for nothing)."""
    linear, palette = options.op_linear_quantizer_config, options.op_palettizer_config
    if linear is None and palette is None:
        return mlmodel
    import coremltools.optimize.coreml as cto

    key = LINEAR_QUANTIZER_KEY if linear is not None else PALETTIZER_KEY
    log = io.StringIO()
    try:
        with contextlib.redirect_stderr(log), contextlib.redirect_stdout(log):
            config = (cto.OpLinearQuantizerConfig(**linear) if linear is not None
                      else cto.OpPalettizerConfig(**palette))  # type: ignore[arg-type]
            opt = cto.OptimizationConfig(global_config=config)
            if linear is not None:
                return cto.linear_quantize_weights(mlmodel, config=opt)
            return cto.palettize_weights(mlmodel, config=opt)
    except Exception as exc:  # noqa: BLE001 - coremltools raises many kinds; report them as a lowering error
        raise UnconvertiblePartition(f"{COREML_BACKEND_ID}: weight compression ({key}) failed in coremltools: "
                            f"{type(exc).__name__}: {exc}") from exc
