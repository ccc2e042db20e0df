"""TemplateBackend's capability table: what its partitioner takes, what ``preprocess`` accepts, what the
conformance suite tests and what the docs' op-support table lists. Torch-free.

Add a row per operator your backend runs (the name is ``str(torch.ops.aten.<op>.<overload>)``), with the dtypes
of its tensor inputs and outputs and, when support depends on arguments or shapes, a ``constraint(node)`` that
returns ``None`` or the reason the node is not supported. :mod:`edgeport.constraints` has the checks backends
share (static shapes, 2-D convolutions, pooling arguments, padding, slice steps, ...), and ``first_problem``
chains them; write your own only for what is yours.
"""

from __future__ import annotations

from edgeport import CapabilityTable, OpCapability
from edgeport.constraints import non_negative_padding

BACKEND_ID = "TemplateBackend"

_F32 = ("float32",)

CAPABILITIES = CapabilityTable(
    (
        OpCapability("aten.add.Tensor", _F32, notes="broadcasting; alpha"),
        OpCapability("aten.mul.Tensor", _F32, notes="broadcasting"),
        OpCapability("aten.relu.default", _F32),
        # np.pad cannot crop: a negative padding is refused with the reason, so the node stays on the CPU
        OpCapability("aten.constant_pad_nd.default", _F32, non_negative_padding, notes="constant value"),
    )
)


def capabilities() -> CapabilityTable:
    """The table (the factory ``BackendSpec.capabilities`` expects)."""
    return CAPABILITIES
