"""XnnpackBackend's ``preprocess``: one edge sub-program -> an ExecuTorch-format XNNPACK blob.

Each supported op has a lowering function in :mod:`edgeport_xnnpack.preprocess.ops` registered in
:data:`LOWERINGS` by its capability-table name. Before lowering, a convolution whose only user is a batch norm
with constant statistics is marked for folding: the batch norm's lowering emits the convolution with the
folded weights. Nodes whose tensor inputs are all constants are evaluated here (constant folding, e.g. the
``permute_copy`` of a Linear weight). Getitems of multi-output ops (batch norm, max pool with indices) alias
output 0.

Quantized partitions: :class:`~edgeport_xnnpack.preprocess.quantized.QuantPlan` picks the ops lowered in int8
before the loop (see :mod:`edgeport_xnnpack.preprocess.quantized`); it lowers them (and skips the quantize /
dequantize nodes they absorb) ahead of constant folding and the float lowerings.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from edgeport.aot.capability_partitioner import op_name
from edgeport.backend import CompileSpec, PreprocessResult
from edgeport.errors import LoweringError
from edgeport_xnnpack.options import XnnpackCompileOptions
from edgeport_xnnpack.preprocess import dynamic, passes
from edgeport_xnnpack.preprocess.builder import NCHW, GraphBuilder, Val
from edgeport_xnnpack.preprocess.constant_inputs import externalize_unpacked
from edgeport_xnnpack.preprocess.named_constants import external_tag_of, move_constants_to_named_data
from edgeport_xnnpack.preprocess.quantized import QuantPlan
from edgeport_xnnpack.preprocess.registry import LOWERINGS
from edgeport_xnnpack.preprocess.views import Views
from edgeport_xnnpack.schema.writer import serialize

__all__ = ["LOWERINGS", "preprocess"]

_BN = "aten._native_batch_norm_legit_no_training.default"


def _constants(ep: ExportedProgram) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            target = spec.target
            t = ep.state_dict.get(target, ep.constants.get(target))
            if not isinstance(t, torch.Tensor):
                raise LoweringError(f"constant {spec.arg.name!r} ({target}) has no tensor data")
            if isinstance(t, torch._subclasses.fake_tensor.FakeTensor) or t.device.type == "meta":
                raise LoweringError(f"constant {spec.arg.name!r} has no data (fake or meta tensor)")
            out[spec.arg.name] = t
    return out


def _fold_plan(graph: torch.fx.Graph, b: GraphBuilder) -> dict[torch.fx.Node, torch.fx.Node]:
    """conv node -> the batch norm it folds into."""
    plan = {}
    for node in graph.nodes:
        if node.op != "call_function" or op_name(node.target) != _BN:
            continue
        conv = node.args[0]
        if (isinstance(conv, torch.fx.Node) and conv.op == "call_function"
                and op_name(conv.target) == "aten.convolution.default" and len(conv.users) == 1
                and conv not in b.outputs and all(b.is_constant(a) for a in node.args[1:5])):
            plan[conv] = node
    return plan


def _quantized(graph: torch.fx.Graph) -> bool:
    return any(n.op == "call_function" and ("quantized_decomposed" in str(n.target) or "torchao" in str(n.target))
               for n in graph.nodes)


def _fold_constant(b: GraphBuilder, node: torch.fx.Node) -> bool:
    inputs = node.all_input_nodes
    if not inputs or not all(b.is_constant(a) for a in inputs):
        return False

    def sub(a: Any) -> Any:
        return b.constants[a] if isinstance(a, torch.fx.Node) else a

    args = torch.fx.node.map_aggregate(node.args, sub)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, sub)
    with torch.no_grad():
        result = node.target(*args, **kwargs)
    if not isinstance(result, torch.Tensor):
        return False
    b.constants[node] = result
    return True


def lower_graph(ep: ExportedProgram, fold_views: bool = True) -> tuple[GraphBuilder, Any]:
    """Lower ``ep``'s graph (with view folding unless ``fold_views`` is false); returns the builder and the
    finished :class:`Graph`."""
    b = GraphBuilder()
    consts = _constants(ep)
    user_inputs = {s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    inputs: list[Val] = []
    slots: list[int] = []
    num_slots = 0
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    out_args = list(torch.fx.node.map_aggregate(out_node.args[0], lambda a: a))
    flat_out = [a for a in torch.utils._pytree.tree_leaves(out_args) if isinstance(a, torch.fx.Node)]
    b.outputs = set(flat_out)
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            if node.name in consts:
                b.constants[node] = consts[node.name]
            elif node.name in user_inputs:
                val = node.meta.get("val")
                num_slots += 1
                if isinstance(val, (int, torch.SymInt)) and not isinstance(val, bool):
                    continue  # a symbolic size read by a view: an argument slot, no value (see dynamic.py)
                if not isinstance(val, torch.Tensor) or val.dtype != torch.float32:
                    raise LoweringError(f"input {node.name!r} must be a float32 tensor")
                if any(type(d) is not int for d in val.shape):
                    raise LoweringError(f"input {node.name!r} has a dynamic shape {list(val.shape)}")
                slots.append(num_slots - 1)
                inputs.append(b.set(node, b.new_val(tuple(val.shape), NCHW)))
            else:
                raise LoweringError(f"placeholder {node.name!r} is neither a user input nor a constant")
        elif node.op == "get_attr":
            b.constants[node] = getattr(ep.graph_module, node.target)
    b.fold = _fold_plan(ep.graph, b)
    quant = b.quant_plan = QuantPlan(ep.graph, b)
    b.views = Views(b, enabled=fold_views and not _quantized(ep.graph))
    deferred = set(b.fold)
    for node in ep.graph.nodes:
        if node.op != "call_function" or node in deferred:
            continue
        if quant.dynamic is not None and node in quant.dynamic.absorbed:
            continue  # choose_qparams, its getitems, quantize, dequantize of a dynamic linear: emit nothing
        if node.target is operator.getitem:
            src, index = node.args
            if index and (src, index) in b.extra_outputs:
                b.set(node, b.extra_outputs[(src, index)])
                continue
            if index != 0 or src not in b.env:
                raise LoweringError(f"{node.name}: output {index} of {getattr(src, 'name', src)} is not lowered")
            b.set(node, b.env[src])
            continue
        handle = node.meta.get("debug_handle")
        b.current_handle = handle if isinstance(handle, int) and 0 < handle < 2**32 else 0
        if quant.lower(node):
            continue
        if _fold_constant(b, node):
            continue
        name = op_name(node.target)
        lowering = LOWERINGS.get(name)
        if lowering is None:
            raise LoweringError(f"{node.name}: {name} is not supported by XnnpackBackend")
        try:
            lowering(b, node)
        except LoweringError:
            raise
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise LoweringError(f"{node.name} ({name}): {type(exc).__name__}: {exc}") from exc
    outputs = []
    for o in flat_out:
        if o in b.views.pending:
            b.val(o)
        if o not in b.env:
            raise LoweringError(f"output {o.name!r} is a constant or an input; nothing to compute")
        outputs.append(b.env[o])
    return b, b.finish(inputs, outputs, slots, num_slots)


def _lower_dynamic(ep: ExportedProgram, pts: tuple[dynamic.Point, dynamic.Point]) -> tuple[Any, bytearray]:
    """Lower a partition with bounded dynamic dims (see :mod:`~edgeport_xnnpack.preprocess.dynamic`)."""
    why = ""
    for fold_views in (True, False):
        lowered = []
        for point in pts:
            with dynamic.at_point(ep, point):
                lowered.append(lower_graph(ep, fold_views))
        (b_hi, g_hi), (b_lo, g_lo) = lowered
        try:
            graph = dynamic.merge(g_hi, g_lo, b_hi.data, b_lo.data)
        except dynamic.NotEncodable as exc:
            why = str(exc)
            continue
        data = b_hi.data
        if not _quantized(ep.graph):
            data = passes.prune(graph, data)
            passes.schedule(graph)
        return graph, data
    raise LoweringError(f"the partition's dynamic dims cannot be expressed in an XNNPACK blob: {why}")


def preprocess(edge_program: ExportedProgram, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
    """Lower a partition to the ExecuTorch XNNPACK blob format; its constants go to the program's named data.

    A partition with bounded dynamic dims declares every value at its upper bound; see
    :mod:`~edgeport_xnnpack.preprocess.dynamic`."""
    try:
        XnnpackCompileOptions.from_compile_specs(list(compile_specs))
    except ValueError as exc:
        raise LoweringError(str(exc)) from exc
    from edgeport_xnnpack.preprocess import ops  # noqa: F401  (registers the lowerings)

    pts = dynamic.points(edge_program)
    if pts is not None:
        graph, data = _lower_dynamic(edge_program, pts)
    else:
        b, graph = lower_graph(edge_program)
        data = b.data
        if b.views.enabled:  # float partitions; quantized ones keep the op-by-op lowering and its order
            data = passes.prune(graph, b.data)
            passes.schedule(graph)
    try:
        tag = external_tag_of(edge_program)
    except ValueError as exc:
        raise LoweringError(str(exc)) from exc
    constant_inputs = externalize_unpacked(graph, data)
    named = move_constants_to_named_data(graph, data, tag)
    return PreprocessResult(processed_bytes=serialize(graph, b""), debug_handle_map=delegate_map(graph),
                            data_store_output=named, constant_inputs=tuple(constant_inputs))


def delegate_map(graph: Any) -> dict[str, tuple[int, ...]]:
    """ExecuTorch's delegate map of a blob: each profiling event id a runtime reports for it -> the debug handles
    of the edge nodes that event carries out.

    Keys: the ids ExecuTorch's XNNPACK delegate gives its per-operator events (``"Fully Connected (NC, F32) GEMM
    #3"``, see :mod:`edgeport_xnnpack.schema.operator_names`); a node XNNPACK fuses into another adds its handles
    to that node's events. edgeport's executor identifies a step that carries out one blob node by the same id.
    Nodes without a debug handle (none in an edge program's partition) have no key."""
    from edgeport_xnnpack.schema.operator_names import stock_event_ids

    stock = stock_event_ids(graph)
    handles: list[set[int]] = [{n.debug_handle} if n.debug_handle else set() for n in graph.nodes]
    for i, j in stock.fused_into.items():
        handles[j] |= handles[i]
    out: dict[str, tuple[int, ...]] = {}
    for i, keys in enumerate(stock.keys()):
        for key in keys:
            if handles[i]:
                out[key] = tuple(sorted(handles[i]))
    return out
