"""Rewrites of a partition's graph that coremltools 9.0's torch frontend needs (node arguments only).

Each rewrite keeps the computation and fixes a shape of the arguments the frontend mishandles (found by
converting single-op programs):

* ``max_pool2d_with_indices`` / ``max_pool2d`` / ``avg_pool2d`` with trailing default arguments omitted: the
  frontend counts positional inputs (``max_pool2d_with_indices(x, [2, 2])`` fails with "expected minimum 3
  inputs"), so the defaults of the op's schema are written out;
* ``hardtanh`` / ``clamp`` / ``elu`` / ``leaky_relu`` with integer scalars on a float tensor (``hardtanh(x, 0,
  6)``, ``elu``'s default ``alpha=1``): the frontend makes int32 MIL scalars ("alpha has dtype int32 whereas x has
  dtype fp32"), so they become Python floats; ``hardtanh`` / ``leaky_relu`` / ``elu`` with omitted defaults get
  them written out (the frontend counts inputs: "got 1 input(s), expected [3]").

:func:`contiguous_user_inputs` gives the partition's inputs contiguous example values: the edge graph's
``*_copy`` ops keep the strides of the view they replaced (a ``permute_copy``'s value is strided like the
``permute``), but every value of a program is materialized contiguous (the emitter writes ``dim_order =
range(rank)``), and coremltools refuses an input whose example value has another dim order ("Core ML does not have
general support for non-contiguous dim order").
"""

from __future__ import annotations

from typing import Any

import torch

from edgeport.aot.capability_partitioner import op_name

_FILL_DEFAULTS = ("aten.max_pool2d_with_indices.default", "aten.max_pool2d.default", "aten.avg_pool2d.default",
                  "aten.hardtanh.default", "aten.leaky_relu.default", "aten.elu.default")
_FLOAT_SCALARS = {"aten.hardtanh.default": (1, 2), "aten.clamp.default": (1, 2), "aten.elu.default": (1, 2, 3),
                  "aten.leaky_relu.default": (1,)}


_SCALAR_KWARGS = ("min", "max", "min_val", "max_val", "alpha", "scale", "input_scale", "negative_slope")


def _is_float(node: Any) -> bool:
    val = getattr(node, "meta", {}).get("val")
    return isinstance(val, torch.Tensor) and val.dtype.is_floating_point


def normalize_for_coremltools(graph: torch.fx.Graph) -> int:
    """Apply the rewrites in place; returns how many nodes changed."""
    changed = 0
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        name = op_name(node.target)
        overload = node.target if isinstance(node.target, torch._ops.OpOverload) else getattr(node.target, "_op",
                                                                                             None)
        if name in _FILL_DEFAULTS and overload is not None:
            args = list(node.args)
            schema_args = overload._schema.arguments
            for i in range(len(args), len(schema_args)):
                a = schema_args[i]
                if a.kwarg_only:
                    break
                if a.name in node.kwargs:
                    args.append(node.kwargs[a.name])
                elif a.has_default_value():
                    default = a.default_value
                    if a.name == "stride" and (default is None or list(default) == []):
                        default = list(args[1])  # stride defaults to the kernel size
                    args.append(list(default) if isinstance(default, (list, tuple)) else default)
                else:
                    break
            if len(args) != len(node.args):
                node.args = tuple(args)
                node.kwargs = {k: v for k, v in node.kwargs.items()
                               if k not in {a.name for a in schema_args[:len(args)]}}
                changed += 1
        if name in _FLOAT_SCALARS and node.args and _is_float(node.args[0]):
            def is_int(v: Any) -> bool:
                return isinstance(v, int) and not isinstance(v, bool)

            positions = [i for i in _FLOAT_SCALARS[name] if i < len(node.args) and is_int(node.args[i])]
            keys = [k for k, v in node.kwargs.items() if k in _SCALAR_KWARGS and is_int(v)]
            if positions or keys:  # 0 == 0.0 in Python: decide by type, not by comparing values
                node.args = tuple(float(a) if i in positions else a for i, a in enumerate(node.args))
                node.kwargs = {k: float(v) if k in keys else v for k, v in node.kwargs.items()}
                changed += 1
    return changed


def match_zero_point_dtypes(program: Any) -> int:
    """Give constant zero points of ``dequantize_per_channel`` / ``dequantize_per_tensor`` the dtype of the data
    they dequantize (pt2e stores them as int64; coremltools otherwise inserts an int8 ``cast``, which only iOS17+
    has, so weight-only quantized graphs failed for iOS16). The values are within the data type's range by
    construction (they lie in [quant_min, quant_max]); returns how many constants changed. Works in place on
    ``program`` (an ``ExportedProgram`` copy)."""
    sig = program.graph_signature
    where = {**{k: ("state_dict", v) for k, v in sig.inputs_to_parameters.items()},
             **{k: ("state_dict", v) for k, v in sig.inputs_to_buffers.items()},
             **{k: ("constants", v) for k, v in sig.inputs_to_lifted_tensor_constants.items()}}
    changed = 0
    for node in program.graph.nodes:
        if node.op != "call_function" or op_name(node.target) not in (
                "quantized_decomposed.dequantize_per_channel.default",
                "quantized_decomposed.dequantize_per_tensor.tensor"):
            continue
        data, zero_point = node.args[0], node.args[2]
        if not (isinstance(data, torch.fx.Node) and isinstance(zero_point, torch.fx.Node)
                and zero_point.name in where):
            continue
        dtype = getattr(data.meta.get("val"), "dtype", None)
        store_name, fqn = where[zero_point.name]
        store = program.state_dict if store_name == "state_dict" else program.constants
        tensor = store.get(fqn)
        if dtype not in (torch.int8, torch.uint8) or tensor is None or tensor.dtype == dtype:
            continue
        info = torch.iinfo(dtype)
        if tensor.numel() and (int(tensor.min()) < info.min or int(tensor.max()) > info.max):
            continue
        store[fqn] = tensor.to(dtype)
        val = zero_point.meta.get("val")
        if val is not None:
            zero_point.meta["val"] = val.to(dtype)
        changed += 1
    return changed


def contiguous_user_inputs(program: Any) -> int:
    """Replace the example value of each user input whose strides are not contiguous by a contiguous one of the
    same shape and dtype (in place on ``program``, an ``ExportedProgram`` copy); returns how many changed."""
    user_inputs = set(program.graph_signature.user_inputs)
    changed = 0
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.is_contiguous():
            continue
        node.meta["val"] = val.contiguous()  # a fake tensor stays fake (its own mode computes the op)
        changed += 1
    return changed
