"""Small helpers over torch.fx graphs and exported programs used by several pipeline stages."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputSpec,
    TensorArgument,
)


def graph_fingerprint(graph: torch.fx.Graph) -> list[tuple[str, str, str, str]]:
    """A structural summary of a graph (names, ops, targets, arguments) to detect unwanted changes."""

    def fmt(arg: object) -> str:
        return repr(torch.fx.node.map_arg(arg, lambda n: f"%{n.name}"))

    return [(n.name, n.op, str(n.target), fmt((n.args, n.kwargs))) for n in graph.nodes]


def stable_toposort(graph: torch.fx.Graph) -> None:
    """Reorder ``graph`` topologically, keeping the existing order wherever it is already valid."""
    nodes = list(graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    pending = {n: len(n.all_input_nodes) for n in nodes}
    import heapq

    ready = [(position[n], n.name) for n in nodes if pending[n] == 0]
    by_name = {n.name: n for n in nodes}
    heapq.heapify(ready)
    order: list[torch.fx.Node] = []
    while ready:
        _, name = heapq.heappop(ready)
        node = by_name[name]
        order.append(node)
        for user in node.users:
            pending[user] -= 1
            if pending[user] == 0:
                heapq.heappush(ready, (position[user], user.name))
    if len(order) != len(nodes):
        raise RuntimeError("graph has a cycle")
    if order == nodes:
        return
    # Placeholders must stay first; relink every node in the new order.
    anchor = order[0]
    if anchor is not nodes[0]:
        nodes[0].prepend(anchor)
    for prev, node in zip(order, order[1:]):
        if prev.next is not node:
            prev.append(node)


def input_spec_by_name(signature: ExportGraphSignature) -> dict[str, InputSpec]:
    return {spec.arg.name: spec for spec in signature.input_specs if isinstance(spec.arg, TensorArgument)}


def rebuild_signature(
    graph: torch.fx.Graph, old: ExportGraphSignature, extra_inputs: dict[str, InputSpec] | None = None
) -> ExportGraphSignature:
    """A signature for ``graph`` after placeholders were removed/added and outputs renamed.

    Input specs are kept (by placeholder name) for the placeholders that remain; ``extra_inputs`` gives specs for
    new placeholders. Output specs keep their kind and target and take the new output argument names.
    """
    by_name = input_spec_by_name(old)
    by_name.update(extra_inputs or {})
    non_tensor = [s for s in old.input_specs if not isinstance(s.arg, TensorArgument)]
    input_specs: list[InputSpec] = []
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    positional = len(placeholders) == len(old.input_specs) and not extra_inputs
    for index, node in enumerate(placeholders):
        spec = by_name.get(node.name)
        if spec is None and positional:  # a re-tracing pass renamed the placeholder
            old_spec = old.input_specs[index]
            arg = TensorArgument(node.name) if isinstance(old_spec.arg, TensorArgument) else old_spec.arg
            spec = InputSpec(old_spec.kind, arg, old_spec.target, old_spec.persistent)
        if spec is None:
            # A non-tensor user input (e.g. a specialized int) keeps its original spec.
            match = [s for s in non_tensor if getattr(s.arg, "name", None) == node.name]
            if not match:
                raise RuntimeError(f"placeholder {node.name!r} has no input spec")
            spec = match[0]
        input_specs.append(spec)
    out_node = graph.output_node()
    out_args = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    if len(out_args) != len(old.output_specs):
        raise RuntimeError(f"graph returns {len(out_args)} values but the signature lists {len(old.output_specs)}")
    output_specs = []
    for arg, spec in zip(out_args, old.output_specs):
        new_arg = TensorArgument(arg.name) if isinstance(arg, torch.fx.Node) else spec.arg
        output_specs.append(OutputSpec(kind=spec.kind, arg=new_arg, target=spec.target))
    return ExportGraphSignature(input_specs=input_specs, output_specs=output_specs)


def new_exported_program(
    ep: ExportedProgram,
    gm: torch.fx.GraphModule,
    signature: ExportGraphSignature,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
    constants: dict[str, object] | None = None,
    verifiers: Iterable[type] | None = None,
) -> ExportedProgram:
    """An ExportedProgram like ``ep`` but with a new graph module and signature."""
    new = ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=signature,
        state_dict=ep.state_dict if state_dict is None else state_dict,
        range_constraints=copy.copy(ep.range_constraints),
        module_call_graph=copy.deepcopy(ep.module_call_graph),
        example_inputs=None,
        constants=ep.constants if constants is None else constants,
        verifiers=list(verifiers) if verifiers is not None else list(ep.verifiers),
    )
    keep_children(gm, new.graph_module)
    return new


def keep_children(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Carry lowered modules (attributes no get_attr node names) over to a rebuilt graph module."""
    for name, child in source.named_children():
        if not hasattr(target, name):
            setattr(target, name, child)


def prune_state(ep_state: dict, constants: dict, signature: ExportGraphSignature) -> tuple[dict, dict]:
    """Keep only the state_dict / constants entries that the signature still references."""
    targets = {
        s.target
        for s in signature.input_specs
        if s.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ)
    }
    return (
        {k: v for k, v in ep_state.items() if k in targets},
        {k: v for k, v in constants.items() if k in targets},
    )


def placeholder_tensor(ep: ExportedProgram, node: torch.fx.Node) -> torch.Tensor | None:
    """The real tensor behind a parameter/buffer/constant placeholder, or None for user inputs."""
    spec = input_spec_by_name(ep.graph_signature).get(node.name)
    if spec is None or spec.kind == InputKind.USER_INPUT or spec.target is None:
        return None
    if spec.target in ep.state_dict:
        return ep.state_dict[spec.target]
    value = ep.constants.get(spec.target)
    return value if isinstance(value, torch.Tensor) else None


def copy_program(ep: ExportedProgram) -> ExportedProgram:
    """A copy of ``ep`` whose graph can be tagged and rewritten; tensors (state_dict, constants) are shared."""
    gm = torch.fx.GraphModule(ep.graph_module, copy.deepcopy(ep.graph))
    keep_children(ep.graph_module, gm)
    gm.meta.update(ep.graph_module.meta)
    # Copying a graph may rename nodes (e.g. a placeholder called "input"): rebuild the signature from it.
    signature = rebuild_signature(gm.graph, ep.graph_signature)
    return new_exported_program(ep, gm, signature, state_dict=dict(ep.state_dict), constants=dict(ep.constants))


def graph_modules(gm: torch.fx.GraphModule) -> Iterator[torch.fx.GraphModule]:
    """``gm`` and the graph modules its ``get_attr`` nodes reach (control-flow branches), depth first."""
    yield gm
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            sub = getattr(gm, str(node.target), None)
            if isinstance(sub, torch.fx.GraphModule):
                yield from graph_modules(sub)
