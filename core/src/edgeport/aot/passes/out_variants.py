"""Out-variant conversion: every functional op becomes its ``.out`` overload writing into ``alloc`` tensors.

After this pass the graph reads like ExecuTorch's execution dialect::

    %alloc = call_function[target=edgeport.aot.passes.out_variants.alloc](((2, 2), torch.float32))
    %mm = call_function[target=aten.mm.out](%a, %b, out=%alloc)
"""

from __future__ import annotations

import functools
import operator

import torch
from torch._ops import OpOverload

from edgeport.aot.delegate_op import CALL_DELEGATE
from edgeport.aot.passes.edge_passes import normalize_symbolic_arguments
from edgeport.errors import UnsupportedOperatorError

# Ops that stay as they are: they compute sizes (symbolic ints), not tensors.
SCALAR_OPS: frozenset[object] = frozenset({torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default})

# Out variants of the ``quantized_decomposed`` ops that torch defines only functionally. The schemas are those of
# ExecuTorch's quantized kernel library (``kernels/quantized/quantized.yaml``), keyed by the functional overload
# they replace. edgeport defines them in a namespace of its own: defining them in ``quantized_decomposed`` would
# clash with ExecuTorch's AOT library, which aborts the process when it is loaded after them. The emitter writes
# them under ExecuTorch's names (:func:`executorch_name`).
QUANTIZED_NAMESPACE = "edgeport_quantized"
_QUANTIZED_OUTS: dict[str, str] = {
    "quantize_per_tensor.default": "quantize_per_tensor.out(Tensor input, float scale, int zero_point, "
    "int quant_min, int quant_max, ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)",
    "quantize_per_tensor.tensor": "quantize_per_tensor.Tensor_out(Tensor input, Tensor scale, Tensor zero_point, "
    "int quant_min, int quant_max, ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)",
    "dequantize_per_tensor.default": "dequantize_per_tensor.out(Tensor input, float scale, int zero_point, "
    "int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None, Tensor(a!) out) -> Tensor(a!)",
    "dequantize_per_tensor.tensor": "dequantize_per_tensor.Tensor_out(Tensor input, Tensor scale, "
    "Tensor zero_point, int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None, "
    "Tensor(a!) out) -> Tensor(a!)",
    "quantize_per_channel.default": "quantize_per_channel.out(Tensor input, Tensor scales, Tensor zero_points, "
    "int axis, int quant_min, int quant_max, ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)",
    "dequantize_per_channel.default": "dequantize_per_channel.out(Tensor input, Tensor scales, "
    "Tensor? zero_points, int axis, int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None, "
    "Tensor(a!) out) -> Tensor(a!)",
    "choose_qparams.tensor": "choose_qparams.Tensor_out(Tensor input, int quant_min, int quant_max, float eps, "
    "ScalarType dtype, *, Tensor(a!) scale_out, Tensor(b!) zero_point_out) -> (Tensor(a!), Tensor(b!))",
}
#: torch op namespace -> the namespace of its out variants defined by edgeport
_OUT_NAMESPACES = {"quantized_decomposed": QUANTIZED_NAMESPACE}
#: namespace of an edgeport-defined out variant -> the namespace ExecuTorch's runtime registers it under
EMITTED_NAMESPACES = {QUANTIZED_NAMESPACE: "quantized_decomposed"}


def executorch_name(schema: torch._C.FunctionSchema) -> str:
    """The operator name a program calls for ``schema`` (``"quantized_decomposed::quantize_per_tensor"``)."""
    ns, _, name = schema.name.partition("::")
    return f"{EMITTED_NAMESPACES.get(ns, ns)}::{name}"


def _reference_out(functional: str, out_names: list[str]) -> object:
    """A torch implementation of an out variant: the functional op, copied into the out tensors."""

    def run(*args: object, **kwargs: object) -> object:
        import torch.ao.quantization.fx._decomposed  # noqa: F401 - defines torch.ops.quantized_decomposed

        outs = [kwargs.pop(name) for name in out_names]
        packet, _, overload = functional.partition(".")
        result = getattr(getattr(torch.ops.quantized_decomposed, packet), overload)(*args, **kwargs)
        results = result if isinstance(result, tuple) else (result,)
        for out, value in zip(outs, results):
            out.resize_(value.shape).copy_(value)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return run


@functools.cache
def _quantized_library() -> torch.library.Library:
    """Define edgeport's ``quantized_decomposed`` out variants (once; the library must stay alive)."""
    lib = torch.library.Library(QUANTIZED_NAMESPACE, "FRAGMENT")
    for functional, schema in _QUANTIZED_OUTS.items():
        name = schema.split("(", 1)[0]
        packet_name, _, overload = name.partition(".")
        packet = getattr(getattr(torch.ops, QUANTIZED_NAMESPACE), packet_name, None)
        if packet is not None and overload in packet.overloads():
            continue  # defined by an earlier copy of this module
        lib.define(schema)
        outs = [a.name for a in _out_args(torch._C.parse_schema(f"{QUANTIZED_NAMESPACE}::{schema}"))]
        lib.impl(name, _reference_out(functional, outs), "CompositeExplicitAutograd")
    return lib


def _out_packets(op: OpOverload) -> list[object]:
    """Overload packets to look for ``op``'s out variant in: its own, then edgeport's for its namespace."""
    packets: list[object] = [op.overloadpacket]
    namespace = _OUT_NAMESPACES.get(op.namespace)
    if namespace is not None:
        _quantized_library()
        packet = getattr(getattr(torch.ops, namespace), op._schema.name.partition("::")[2], None)
        if packet is not None:
            packets.append(packet)
    return packets


def alloc(spec: object) -> None:
    """Graph marker for a planned tensor: ``spec`` is ``(shape, dtype)``. Never executed."""
    raise RuntimeError("alloc is a graph marker for memory planning and is never executed")


def _out_args(schema: torch._C.FunctionSchema) -> list[torch._C.Argument]:
    return [a for a in schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]


# Tensor-creation options that the out tensor itself fixes; functional overloads have them, out overloads not.
CREATION_KWARGS = frozenset({"dtype", "layout", "device", "pin_memory"})


def _signature(schema: torch._C.FunctionSchema, *, drop_creation: bool = False) -> list[tuple[str, str]]:
    return [
        (a.name, str(a.type))
        for a in schema.arguments
        if not (a.kwarg_only and a.alias_info and a.alias_info.is_write)
        and not (drop_creation and a.kwarg_only and a.name in CREATION_KWARGS)
    ]


@functools.cache
def out_variant(op: OpOverload) -> OpOverload:
    """The out overload matching ``op``'s arguments; raises ``UnsupportedOperatorError`` if there is none."""
    if _out_args(op._schema):
        return op
    want = _signature(op._schema)
    loose = _signature(op._schema, drop_creation=True)
    candidates = []
    for packet in _out_packets(op):
        for name in packet.overloads():
            overload = getattr(packet, name)
            schema = overload._schema
            outs = _out_args(schema)
            if not outs or len(outs) != max(1, len(op._schema.returns)):
                continue
            if _signature(schema) in (want, loose):
                candidates.append(overload)
        if candidates:
            break
    if not candidates:
        raise UnsupportedOperatorError(
            f"operator {op} has no out-variant overload, so it can run neither in a delegate nor as a portable "
            "kernel; delegate it with a partitioner, decompose it, or rewrite the model to avoid it"
        )
    preferred = [c for c in candidates if c._overloadname in ("out", f"{op._overloadname}_out")]
    return (preferred or candidates)[0]


def _alloc_spec(val: object) -> tuple[tuple[object, ...], torch.dtype]:
    if not isinstance(val, torch.Tensor):
        raise UnsupportedOperatorError(f"expected a tensor result, got {type(val).__name__}")
    return tuple(d if isinstance(d, int) else str(d) for d in val.shape), val.dtype


def to_out_variants(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite every tensor-producing op node to its out variant with ``alloc`` nodes for its outputs (after
    giving symbolic sizes in tensor arguments a scalar form: :func:`normalize_symbolic_arguments`)."""
    normalize_symbolic_arguments(gm)
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, OpOverload):
            continue
        if node.target is CALL_DELEGATE or node.target in SCALAR_OPS:
            continue
        try:
            out_op = out_variant(node.target)
        except UnsupportedOperatorError as exc:
            raise UnsupportedOperatorError(f"node {node.name!r}: {exc}") from None
        if out_op is node.target:
            continue
        outs = _out_args(out_op._schema)
        vals = node.meta["val"]
        vals = list(vals) if isinstance(vals, (tuple, list)) else [vals]
        if len(outs) == 1 and outs[0].type.kind() == "ListType":  # one Tensor[] out (split, unbind)
            kwargs = {k: v for k, v in node.kwargs.items() if k in {a.name for a in out_op._schema.arguments}}
            with graph.inserting_before(node):
                allocs = []
                for val in vals:
                    a = graph.call_function(alloc, (_alloc_spec(val),))
                    a.meta["val"] = val
                    allocs.append(a)
            kwargs[outs[0].name] = allocs
            node.target = out_op
            node.kwargs = kwargs
            continue
        if len(vals) != len(outs):
            raise UnsupportedOperatorError(
                f"node {node.name!r}: {node.target} returns {len(vals)} values but {out_op} has {len(outs)} outputs"
            )
        accepted = {a.name for a in out_op._schema.arguments}
        kwargs = {k: v for k, v in node.kwargs.items() if k in accepted}
        with graph.inserting_before(node):
            for arg, val in zip(outs, vals):
                a = graph.call_function(alloc, (_alloc_spec(val),))
                a.meta["val"] = val
                kwargs[arg.name] = a
        node.target = out_op
        node.kwargs = kwargs
    gm.recompile()
    return gm


def storage_root(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node that owns the memory of ``node``'s tensor value (itself, its ``alloc``, or its producer's)."""
    if node.op == "placeholder":
        return node
    if node.op != "call_function":
        return None
    if node.target is alloc:
        return node
    if node.target is operator.getitem:
        src = node.args[0]
        if isinstance(src, torch.fx.Node) and src.target is CALL_DELEGATE:
            return node
        if isinstance(src, torch.fx.Node) and isinstance(src.target, OpOverload):
            outs = _out_args(src.target._schema)
            if len(outs) == 1 and outs[0].type.kind() == "ListType":
                return src.kwargs[outs[0].name][node.args[1]]
            if outs:
                return src.kwargs.get(outs[node.args[1]].name)
        return None
    if isinstance(node.target, OpOverload):
        schema = node.target._schema
        outs = _out_args(schema)
        if len(outs) == 1 and outs[0].type.kind() != "ListType":
            return node.kwargs.get(outs[0].name)
        first = schema.arguments[0] if schema.arguments else None
        if (not outs and first is not None and first.alias_info is not None and first.alias_info.is_write
                and node.args and isinstance(node.args[0], torch.fx.Node)):
            return storage_root(node.args[0])  # an in-place op (index_put_, copy_): its first argument's memory
    return None
