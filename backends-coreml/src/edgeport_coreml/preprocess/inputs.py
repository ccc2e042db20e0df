"""coremltools input types for a partition with enumerated shapes (compile spec ``enumerated_shapes``)."""

from __future__ import annotations

from typing import Any

from edgeport.errors import LoweringError
from edgeport_coreml.options import COREML_BACKEND_ID, CoreMLCompileSpec, UnconvertiblePartition
from edgeport_coreml.shapes import symbolic_shape

__all__ = ["enumerated_inputs"]

_IOS18 = 9


def enumerated_inputs(program: Any, options: CoreMLCompileSpec) -> list[Any] | None:
    """``ct.TensorType`` per user input (``ct.EnumeratedShapes`` for the dynamic ones), or ``None`` when the
    compile specs give no enumerated shapes (coremltools then uses the export's ranges)."""
    if options.enumerated_shapes is None:
        return None
    import coremltools as ct
    from coremltools.converters.mil.frontend.torch.utils import TORCH_DTYPE_TO_MIL_DTYPE

    user_inputs = set(program.graph_signature.user_inputs)
    inputs, enumerated = [], []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        val = node.meta.get("val")
        dims = symbolic_shape(val.shape, program.range_constraints)
        dtype = TORCH_DTYPE_TO_MIL_DTYPE.get(val.dtype)
        if dtype is None:
            raise UnconvertiblePartition(f"{COREML_BACKEND_ID}: input {node.name!r} has dtype {val.dtype}, which Core ML "
                                "inputs cannot take")
        if all(isinstance(d, int) for d in dims):
            inputs.append(ct.TensorType(name=node.name, shape=tuple(dims), dtype=dtype))
            continue
        key = tuple(d if isinstance(d, int) else d["key_name"] for d in dims)
        if key not in options.enumerated_shapes:
            raise LoweringError(f"{COREML_BACKEND_ID}: input {node.name!r} of the partition has the dynamic shape "
                                f"{key}, which the enumerated_shapes compile spec does not list (it lists "
                                f"{sorted(map(str, options.enumerated_shapes))})")
        shapes = options.enumerated_shapes[key][1]
        inputs.append(ct.TensorType(name=node.name, shape=ct.EnumeratedShapes(shapes=shapes), dtype=dtype))
        enumerated.append(node.name)
    if len(enumerated) > 1 and options.deployment_target_value < _IOS18:
        raise LoweringError(f"{COREML_BACKEND_ID}: inputs {enumerated} have enumerated shapes; more than one "
                            "enumerated input needs minimum_deployment_target iOS18 or newer")
    return inputs
