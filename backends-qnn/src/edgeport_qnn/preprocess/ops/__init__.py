"""Per-op lowerings (one op family per module): edge op name -> function(lowering, node) -> value."""

from __future__ import annotations

from edgeport_qnn.preprocess.ops import (
    activation,
    conv,
    elementwise,
    linear,
    norm,
    pool,
    quant,
    reduce,
    resize,
    shape,
    softmax,
)

LOWERINGS = {}
for _module in (activation, conv, elementwise, linear, norm, pool, quant, reduce, resize, shape, softmax):
    LOWERINGS.update(_module.LOWERINGS)
#: the quantized forms that differ from the float lowering (the others run unchanged on quantized tensors)
QUANTIZED_LOWERINGS = dict(quant.QUANTIZED_LOWERINGS)

__all__ = ["LOWERINGS", "QUANTIZED_LOWERINGS"]
