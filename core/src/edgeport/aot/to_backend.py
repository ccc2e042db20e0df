"""``to_backend`` in ExecuTorch's three forms, and the partition → delegate rewrite behind them.

1. ``to_backend(backend_id, edge_program, compile_specs) -> LoweredBackendModule`` lowers a whole program.
2. ``to_backend(edge_program, partitioner) -> ExportedProgram`` lowers each tagged partition and replaces it with
   a ``call_delegate`` node.
3. A ``LoweredBackendModule`` used inside another module that is exported again (see ``delegate_op``).
"""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Collection, Sequence

import torch
from torch.export import ExportedProgram
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)

from edgeport.aot.delegate_op import CALL_DELEGATE
from edgeport.aot.graph_utils import (
    copy_program,
    graph_fingerprint,
    input_spec_by_name,
    new_exported_program,
    prune_state,
    rebuild_signature,
    stable_toposort,
)
from edgeport.aot.lowered_module import LoweredBackendModule
from edgeport.aot.partitioner import DELEGATION_TAG, Partitioner, PartitionResult
from edgeport.backend import CompileSpec, DelegationSpec, PreprocessResult
from edgeport.errors import EdgeportError, LoweringError, PartitionError
from edgeport.named_data import NamedDataStoreOutput
from edgeport.registry import get_backend


@functools.singledispatch
def to_backend(*args, **kwargs):  # type: ignore[no-untyped-def]
    """Lower a program to backends; see the module docstring for the accepted forms."""
    raise TypeError(
        "to_backend expects (backend_id: str, edge_program, compile_specs) or (edge_program, partitioner); "
        f"got {tuple(type(a).__name__ for a in args)}"
    )


@to_backend.register
def _lower_whole_program(
    backend_id: str, edge_program: ExportedProgram, compile_specs: Sequence[CompileSpec]
) -> LoweredBackendModule:
    return lower_program(backend_id, edge_program, list(compile_specs))


@to_backend.register
def _lower_partitions(edge_program: ExportedProgram, partitioner: Partitioner) -> ExportedProgram:
    return partition_and_lower(edge_program, partitioner)


def lower_program(backend_id: str, program: ExportedProgram, compile_specs: list[CompileSpec]) -> LoweredBackendModule:
    """Run ``backend_id``'s preprocess on ``program`` and wrap the result."""
    spec = get_backend(backend_id)
    try:
        result = spec.preprocess(copy.deepcopy(program), compile_specs)
    except EdgeportError:
        raise
    except Exception as exc:
        raise LoweringError(f"backend {backend_id!r}: preprocess failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, PreprocessResult):
        raise LoweringError(
            f"backend {backend_id!r}: preprocess must return a PreprocessResult, got {type(result).__name__}"
        )
    if not isinstance(result.processed_bytes, (bytes, bytearray, memoryview)):
        raise LoweringError(f"backend {backend_id!r}: processed_bytes must be bytes")
    store = result.data_store_output
    if store is not None and not isinstance(store, NamedDataStoreOutput):
        raise LoweringError(f"backend {backend_id!r}: data_store_output must be a NamedDataStoreOutput "
                            f"(edgeport.named_data.NamedDataStore().output()), got {type(store).__name__}")
    constants = tuple(result.constant_inputs)
    if not all(isinstance(t, torch.Tensor) for t in constants):
        raise LoweringError(f"backend {backend_id!r}: constant_inputs must be torch tensors")
    return LoweredBackendModule(program, backend_id, bytes(result.processed_bytes), compile_specs,
                                result.debug_handle_map, store, constants)


def partition_and_lower(ep: ExportedProgram, partitioner: Partitioner) -> ExportedProgram:
    """Ask ``partitioner`` for tags, check its result, and replace each partition with a delegate call."""
    name = type(partitioner).__name__
    work = copy_program(ep)
    for node in work.graph.nodes:
        node.meta.pop(DELEGATION_TAG, None)
    before = graph_fingerprint(work.graph)
    result = partitioner(work)
    if not isinstance(result, PartitionResult):
        raise PartitionError(f"{name}.partition must return a PartitionResult, got {type(result).__name__}")
    tagged = result.tagged_exported_program
    if graph_fingerprint(tagged.graph) != before:
        raise PartitionError(
            f"{name} changed the graph; a partitioner may only set node.meta['{DELEGATION_TAG}'] on nodes"
        )
    groups = _check_tags(tagged, result.partition_tags, name)
    if not groups:
        return tagged
    _check_acyclic(tagged.graph, groups, name)
    gm = tagged.graph_module
    state, consts = dict(tagged.state_dict), dict(tagged.constants)
    count = sum(1 for n, _ in gm.named_children() if n.startswith("lowered_module_"))
    taken_over: set[str] = set()  # mutated buffers whose state a delegate now owns
    extra_specs: dict[str, InputSpec] = {}
    for tag, nodes in groups.items():
        spec = result.partition_tags[tag]
        lowered = _lower_partition(tagged, nodes, spec, tag)
        attr = f"lowered_module_{count}"
        count += 1
        setattr(gm, attr, lowered)
        state_nodes = _taken_over_state(tagged.graph_signature, nodes)
        taken_over.update(state_nodes.values())
        extra = _constant_placeholders(gm.graph, lowered, tagged.graph_signature.user_inputs, consts, extra_specs)
        _replace_partition(gm.graph, nodes, lowered, _read_only_constants(tagged.graph_signature), state_nodes, extra)
    # Users of a partition's outputs may precede its last node: reorder before anything lints the graph.
    stable_toposort(gm.graph)
    gm.graph.eliminate_dead_code()
    _drop_unused_placeholders(gm.graph, tagged.graph_signature)
    gm.recompile()
    old = tagged.graph_signature
    if taken_over:
        old = ExportGraphSignature(input_specs=list(old.input_specs), output_specs=[
            s for s in old.output_specs if not (s.kind == OutputKind.BUFFER_MUTATION and s.target in taken_over)])
    signature = rebuild_signature(gm.graph, old, extra_specs)
    state, consts = prune_state(state, consts, signature)
    return new_exported_program(tagged, gm, signature, state_dict=state, constants=consts)


def _taken_over_state(signature: ExportGraphSignature, nodes: list[torch.fx.Node]) -> dict[torch.fx.Node, str]:
    """Nodes of a partition that compute the new value of a mutated buffer the partition owns (its placeholder
    is tagged, as ``take_over_mutable_buffer`` does) -> that buffer's name: the state stays inside the delegate."""
    owned = {signature.inputs_to_buffers[n.name] for n in nodes
             if n.op == "placeholder" and n.name in signature.inputs_to_buffers}
    mutated = {s.arg.name: s.target for s in signature.output_specs
               if s.kind == OutputKind.BUFFER_MUTATION and s.target in owned and hasattr(s.arg, "name")}
    return {n: mutated[n.name] for n in nodes if n.op != "placeholder" and n.name in mutated}


def _check_tags(
    ep: ExportedProgram, partition_tags: dict[str, DelegationSpec], name: str
) -> dict[str, list[torch.fx.Node]]:
    groups: dict[str, list[torch.fx.Node]] = {}
    specs = input_spec_by_name(ep.graph_signature)
    for node in ep.graph.nodes:
        tag = node.meta.get(DELEGATION_TAG)
        if tag is None:
            continue
        if tag not in partition_tags:
            raise PartitionError(f"{name} tagged node {node.name!r} with {tag!r}, which is not in partition_tags")
        if node.op == "output":
            raise PartitionError(f"{name} tagged the output node; only computation nodes may be tagged")
        if node.op == "placeholder":
            spec = specs.get(node.name)
            if spec is None or spec.kind == InputKind.USER_INPUT:
                raise PartitionError(
                    f"{name} tagged user input {node.name!r}; only parameters, buffers and constants may be tagged"
                )
        groups.setdefault(tag, []).append(node)
    for tag, spec in partition_tags.items():
        if not isinstance(spec, DelegationSpec):
            raise PartitionError(f"{name}: partition_tags[{tag!r}] must be a DelegationSpec, got {type(spec).__name__}")
        get_backend(spec.backend_id)  # raises BackendNotFoundError with the installed list
    return {tag: nodes for tag, nodes in groups.items() if any(n.op == "call_function" for n in nodes)}


def _check_acyclic(graph: torch.fx.Graph, groups: dict[str, list[torch.fx.Node]], name: str) -> None:
    """Contract each partition to one vertex and check the quotient graph has no cycle (Kahn's algorithm)."""
    group_of: dict[torch.fx.Node, object] = {}
    for tag, nodes in groups.items():
        for n in nodes:
            group_of[n] = tag
    vertex = {n: group_of.get(n, n) for n in graph.nodes}
    edges: dict[object, set[object]] = {}
    indegree: dict[object, int] = {v: 0 for v in set(vertex.values())}
    for n in graph.nodes:
        for user in n.users:
            a, b = vertex[n], vertex[user]
            if a is b or a == b:
                continue
            targets = edges.setdefault(a, set())
            if b not in targets:
                targets.add(b)
                indegree[b] += 1
    ready = [v for v, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        v = ready.pop()
        seen += 1
        for w in edges.get(v, ()):
            indegree[w] -= 1
            if indegree[w] == 0:
                ready.append(w)
    if seen != len(indegree):
        stuck = sorted(str(v) for v, d in indegree.items() if d > 0 and isinstance(v, str))
        raise PartitionError(
            f"{name} produced partitions that form a cycle through non-delegated nodes (tags {stuck}); "
            "a partition must not consume, through a node outside it, a value it produces"
        )


def _read_only_constants(signature: ExportGraphSignature) -> set[str]:
    """Placeholders holding weights no method writes: parameters, constant tensors, buffers never mutated."""
    mutated = set(signature.buffers_to_mutate.values()) | set(getattr(signature, "parameters_to_mutate", {}).values())
    kinds = (InputKind.PARAMETER, InputKind.CONSTANT_TENSOR, InputKind.BUFFER)
    return {s.arg.name for s in signature.input_specs
            if s.kind in kinds and s.target not in mutated and isinstance(s.arg, TensorArgument)}


def _partition_io(nodes: list[torch.fx.Node], shareable: set[str] = frozenset(),  # type: ignore[assignment]
                  state: Collection[torch.fx.Node] = ()) -> tuple[list[torch.fx.Node], list[torch.fx.Node],
                                                                   list[torch.fx.Node]]:
    """(owned placeholders, external inputs, outputs) of a partition, in graph order.

    A read-only weight (``shareable``) used by several partitions or by other nodes is owned by every partition
    that uses it, as ExecuTorch does: each backend gets it as a constant (static weights can be packed), and
    named data stores its bytes once. Other placeholders used outside the partition are passed in as inputs.
    A ``state`` node (the new value of a buffer the partition owns) is an output only if something other than
    the program's output (the buffer mutation) uses it.
    """
    members = set(nodes)
    owned: list[torch.fx.Node] = []
    inputs: list[torch.fx.Node] = []
    seen: set[torch.fx.Node] = set()
    outputs: list[torch.fx.Node] = []

    def take(arg: torch.fx.Node) -> None:
        if arg in seen:
            return
        seen.add(arg)
        tagged_alone = arg in members and all(u in members for u in arg.users)
        if arg.op == "placeholder" and (arg.name in shareable or tagged_alone):
            owned.append(arg)
        else:
            inputs.append(arg)

    for n in nodes:
        if n.op == "placeholder":
            take(n)
            continue
        for arg in n.all_input_nodes:
            if arg not in members:
                take(arg)
        if any(u not in members and not (n in state and u.op == "output") for u in n.users):
            outputs.append(n)
    return owned, inputs, outputs


def _lower_partition(
    parent: ExportedProgram, nodes: list[torch.fx.Node], spec: DelegationSpec, tag: str
) -> LoweredBackendModule:
    sub = extract_subprogram(parent, nodes)
    try:
        return lower_program(spec.backend_id, sub, list(spec.compile_specs))
    except LoweringError as exc:
        raise LoweringError(f"partition {tag!r} ({len(nodes)} nodes): {exc}") from exc


def extract_subprogram(parent: ExportedProgram, nodes: list[torch.fx.Node]) -> ExportedProgram:
    """An ExportedProgram holding exactly ``nodes`` (a convex set of parent nodes)."""
    state_nodes = _taken_over_state(parent.graph_signature, nodes)
    owned, inputs, outputs = _partition_io(nodes, _read_only_constants(parent.graph_signature), state_nodes)
    members = [n for n in nodes if n.op != "placeholder"]
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    specs = input_spec_by_name(parent.graph_signature)
    input_specs: list[InputSpec] = []
    state: dict[str, torch.Tensor] = {}
    consts: dict[str, object] = {}
    for p in owned:
        new = graph.placeholder(p.name)
        new.meta = copy.copy(p.meta)
        env[p] = new
        spec = specs[p.name]
        input_specs.append(InputSpec(spec.kind, TensorArgument(new.name), spec.target, spec.persistent))
        if spec.target in parent.state_dict:
            state[spec.target] = parent.state_dict[spec.target]
        elif spec.target in parent.constants:
            consts[spec.target] = parent.constants[spec.target]
    for i in inputs:
        new = graph.placeholder(i.name)
        new.meta = {"val": i.meta.get("val")}
        env[i] = new
        input_specs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(new.name), None))
    for n in members:
        env[n] = graph.node_copy(n, lambda a: env[a])
        env[n].meta.pop(DELEGATION_TAG, None)
    graph.output(tuple(env[o] for o in [*state_nodes, *outputs]))  # mutations first, as torch.export orders them
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    signature = ExportGraphSignature(
        input_specs=input_specs,
        output_specs=[OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument(env[n].name), buffer)
                      for n, buffer in state_nodes.items()]
        + [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(env[o].name), None) for o in outputs],
    )
    example = tuple(i.meta.get("val") for i in inputs)
    in_spec = torch.utils._pytree.tree_flatten((example, {}))[1]
    out_spec = torch.utils._pytree.tree_flatten(tuple(o.meta.get("val") for o in outputs))[1]
    call_graph = [ModuleCallEntry("", ModuleCallSignature(inputs=[], outputs=[], in_spec=in_spec, out_spec=out_spec))]
    return ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=signature,
        state_dict=state,
        range_constraints=copy.copy(parent.range_constraints),
        module_call_graph=call_graph,
        constants=consts,
        verifiers=list(parent.verifiers),
    )


def _constant_placeholders(graph: torch.fx.Graph, lowered: LoweredBackendModule, user_inputs: Collection[str],
                           consts: dict[str, object], specs: dict[str, InputSpec]) -> list[torch.fx.Node]:
    """A lifted-constant placeholder for each of ``lowered``'s constant inputs, placed before the user inputs
    (``user_inputs``: their names); its tensor goes to ``consts`` and its spec to ``specs``."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = next((p for p in placeholders if p.name in user_inputs), None)
    out = []
    for tensor in lowered.constant_inputs:
        if anchor is not None:
            ctx = graph.inserting_before(anchor)
        else:
            ctx = graph.inserting_after(placeholders[-1]) if placeholders else graph.inserting_before(None)
        with ctx:
            node = graph.placeholder(f"_delegate_constant_{len(specs)}")
        node.meta["val"] = torch.empty(tuple(tensor.shape), dtype=tensor.dtype)
        consts[node.name] = tensor
        specs[node.name] = InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(node.name), node.name)
        if anchor is None:
            placeholders.append(node)
        out.append(node)
    return out


def _replace_partition(graph: torch.fx.Graph, nodes: list[torch.fx.Node], lowered: LoweredBackendModule,
                       shareable: set[str], state: Collection[torch.fx.Node] = (),
                       constant_inputs: Sequence[torch.fx.Node] = ()) -> None:
    owned, inputs, outputs = _partition_io(nodes, shareable, state)
    members = [n for n in nodes if n.op != "placeholder"]
    with graph.inserting_after(members[-1]):
        call = graph.call_function(CALL_DELEGATE, (lowered.delegate_key, [*inputs, *constant_inputs]))
    call.meta["val"] = [o.meta.get("val") for o in outputs]
    call.meta["delegate_backend"] = lowered.backend_id
    previous = call
    for i, out in enumerate(outputs):
        with graph.inserting_after(previous):
            item = graph.call_function(operator.getitem, (call, i))
        item.meta["val"] = out.meta.get("val")
        out.replace_all_uses_with(item, delete_user_cb=lambda user, _m=set(members): user not in _m)
        previous = item
    if state:  # the delegate keeps these buffers' new values: the program no longer writes them back
        out_node = graph.output_node()
        values = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else (out_node.args[0],)
        out_node.args = (tuple(v for v in values if v not in set(state)),)
    for n in reversed(members):
        graph.erase_node(n)
    for p in owned:
        if not p.users:
            graph.erase_node(p)


def _drop_unused_placeholders(graph: torch.fx.Graph, signature: ExportGraphSignature) -> None:
    specs = input_spec_by_name(signature)
    for node in list(graph.nodes):
        if node.op == "placeholder" and not node.users:
            spec = specs.get(node.name)
            if spec is not None and spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                graph.erase_node(node)


def program_calling_delegate(lowered: LoweredBackendModule) -> ExportedProgram:
    """An exported program whose graph passes its user inputs to ``lowered`` and returns its outputs."""
    original = lowered.original_module
    graph = torch.fx.Graph()
    user_inputs = [n for n in original.graph.nodes if n.op == "placeholder" and n.name in set(original.graph_signature.user_inputs)]
    constants: dict[str, object] = {}
    constant_specs: dict[str, InputSpec] = {}
    placeholders = []
    for n in user_inputs:
        p = graph.placeholder(n.name)
        p.meta["val"] = n.meta.get("val")
        placeholders.append(p)
    extra = _constant_placeholders(graph, lowered, {p.name for p in placeholders}, constants, constant_specs)
    call = graph.call_function(CALL_DELEGATE, (lowered.delegate_key, [*placeholders, *extra]))
    metas = [a.meta.get("val") for a in original.graph.output_node().args[0]]
    call.meta["val"] = metas
    items = []
    for i, val in enumerate(metas):
        item = graph.call_function(operator.getitem, (call, i))
        item.meta["val"] = val
        items.append(item)
    graph.output(tuple(items))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    gm.lowered_module_0 = lowered
    signature = ExportGraphSignature(
        input_specs=[*constant_specs.values(),
                     *(InputSpec(InputKind.USER_INPUT, TensorArgument(p.name), None) for p in placeholders)],
        output_specs=[OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(i.name), None) for i in items],
    )
    return ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=signature,
        state_dict={},
        range_constraints=copy.copy(original.range_constraints),
        module_call_graph=copy.deepcopy(original.module_call_graph),
        constants=constants,
        verifiers=list(original.verifiers),
    )
