"""The data behind ``edgeport view``: one method's instruction graph, partitions and memory plan, from a ``.pte``.

Torch-free. :func:`graph_from_plan` reads a method of a loaded program: a node per kernel or delegate call (plus
the method's inputs and outputs), an edge per tensor passed from one call to another, and every memory-planned
tensor's place in its arena and lifetime over the instruction sequence, from which the live bytes at each
instruction follow. :mod:`edgeport.devtools.graph_view` adds what only the lowering knows (node names, source
lines, rejected nodes) and renders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgeport.program import schema as S
from edgeport.program.loaded import tensor_nbytes

__all__ = ["MemoryTensor", "PartitionView", "ProgramGraph", "ViewNode", "graph_from_plan"]

PORTABLE = "portable"  # the "backend" of kernel calls the runtime's kernel libraries run


@dataclass
class ViewNode:
    """One node of the drawn graph: a method input, a kernel call, a delegate call, or the method's outputs."""

    id: str
    kind: str  # "input" | "kernel" | "delegate" | "move" | "output"
    label: str  # operator (``aten::add.out``), backend id, ``input 0``, ``outputs``
    backend: str = ""  # the delegate's backend id; "portable" for kernel calls
    chain: int = 0
    instruction: int = -1  # index in its chain; -1 for inputs and outputs
    step: int = -1  # position in the method's instruction sequence (all chains, in order)
    partition: int | None = None  # delegate index
    inputs: list[int] = field(default_factory=list)  # value indices read
    outputs: list[int] = field(default_factory=list)  # value indices written
    name: str = ""  # the lowered graph's node name, when known
    source: str = ""  # the node's source line(s), when known
    module: str = ""  # the nn.Module it came from, when known
    rejected: str = ""  # why no partitioner took the node, when known
    time_us: float | None = None  # mean wall time per run, when profiled
    layer: int = 0
    order: int = 0


@dataclass
class MemoryTensor:
    """A memory-planned tensor: where it lives and between which instruction steps (inclusive)."""

    value: int
    name: str
    memory_id: int
    offset: int
    nbytes: int
    start: int
    end: int
    producer: str = ""  # id of the node that writes it ("" for a method input)


@dataclass
class PartitionView:
    """One delegate of the method: its backend, blob and the calls that run it, plus anything known about it."""

    index: int
    backend: str
    blob_bytes: int
    compile_specs: list[str]
    nodes: list[str] = field(default_factory=list)  # ids of the delegate-call nodes
    ops: dict[str, int] = field(default_factory=dict)  # operators it took (from the lowering)
    node_count: int | None = None
    time_us: float | None = None
    calls: int | None = None
    validation: dict[str, Any] = field(default_factory=dict)
    description: dict[str, Any] = field(default_factory=dict)  # the backend's describe_blob, when installed
    inner: list[dict[str, Any]] = field(default_factory=list)  # the nodes it took: name, op, inputs, source


@dataclass
class ProgramGraph:
    """Everything the report shows about one method (JSON-able through :func:`dataclasses.asdict`)."""

    method: str
    nodes: list[ViewNode]
    edges: list[tuple[str, str, int]]  # (source node id, target node id, value index)
    values: dict[int, dict[str, Any]]  # value index -> {"dtype", "shape", "bytes", "kind", ...}
    partitions: list[PartitionView]
    memory: list[MemoryTensor]
    arena_bytes: list[int]  # non_const_buffer_sizes (entry 0 unused)
    live_bytes: list[int]  # per instruction step: bytes of the arenas in use by live planned tensors
    steps: list[str]  # node id of each instruction step
    rejected: dict[str, dict[str, str]] = field(default_factory=dict)  # node name -> {"op", "reason"}
    op_times: dict[str, dict[str, float]] = field(default_factory=dict)  # op -> {"seconds", "calls"}
    notes: list[str] = field(default_factory=list)

    @property
    def peak_live_bytes(self) -> int:
        return max(self.live_bytes, default=0)

    def node(self, node_id: str) -> ViewNode:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(f"no node {node_id!r} in method {self.method!r}")


def _tensor_items(plan: S.ExecutionPlan, index: int) -> list[int]:
    """The tensor value indices that value ``index`` stands for (itself, or a tensor list's items)."""
    if not 0 <= index < len(plan.values):
        return []
    val = plan.values[index].val
    if isinstance(val, S.Tensor):
        return [index]
    if isinstance(val, (S.TensorList, S.OptionalTensorList)):
        return [i for i in val.items if 0 <= i < len(plan.values) and isinstance(plan.values[i].val, S.Tensor)]
    return []


def _dtype_name(t: S.Tensor) -> str:
    try:
        return S.ScalarType(int(t.scalar_type)).name.lower()
    except ValueError:
        return f"scalar type {int(t.scalar_type)}"


def _value_info(plan: S.ExecutionPlan, index: int) -> dict[str, Any]:
    t = plan.values[index].val
    assert isinstance(t, S.Tensor)
    info: dict[str, Any] = {"dtype": _dtype_name(t), "shape": list(t.sizes),
                            "bytes": tensor_nbytes(t, f"values[{index}]")}
    if t.data_buffer_idx > 0 or (t.extra_tensor_info is not None and t.allocation_info is None):
        info["kind"] = "constant"
    elif t.allocation_info is not None:
        info["kind"] = "planned"
        info["memory_id"] = int(t.allocation_info.memory_id)
        info["offset"] = int(t.allocation_info.memory_offset)
    else:
        info["kind"] = "unplanned"
    return info


def _instruction_node(plan: S.ExecutionPlan, ci: int, ii: int, ins: S.Instruction, step: int,
                      defined: set[int]) -> ViewNode | None:
    args = ins.instr_args
    node_id = f"c{ci}i{ii}" if ci else f"i{ii}"
    if isinstance(args, S.KernelCall):
        op = plan.operators[args.op_index] if 0 <= args.op_index < len(plan.operators) else None
        label = (f"{op.name}.{op.overload}" if op.overload else op.name) if op else f"operator {args.op_index}"
        node = ViewNode(node_id, "kernel", label, backend=PORTABLE)
        arg_list = list(args.args)
        # the out-variant convention: the last argument is what the call returns (a tensor or a tensor list)
        returned = set(_tensor_items(plan, arg_list[-1])) if arg_list else set()
    elif isinstance(args, S.DelegateCall):
        di = args.delegate_index
        backend = plan.delegates[di].id if 0 <= di < len(plan.delegates) else f"delegate {di}"
        node = ViewNode(node_id, "delegate", backend, backend=backend, partition=di)
        arg_list, returned = list(args.args), set()
    elif isinstance(args, S.MoveCall):
        node = ViewNode(node_id, "move", "move", backend=PORTABLE)
        arg_list, returned = [args.move_from, args.move_to], set(_tensor_items(plan, args.move_to))
    else:  # FreeCall, JumpFalseCall: no data flow to draw
        return None
    node.chain, node.instruction, node.step = ci, ii, step
    for a in arg_list:
        for t in _tensor_items(plan, a):
            # a tensor is written by the call that returns it, or by the first call that mentions it
            writes = t in returned or t not in defined
            (node.outputs if writes else node.inputs).append(t)
    node.inputs = list(dict.fromkeys(t for t in node.inputs if t not in node.outputs))
    node.outputs = list(dict.fromkeys(node.outputs))
    defined.update(node.outputs)
    return node


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _live_bytes(tensors: list[MemoryTensor], steps: int) -> list[int]:
    """Bytes of arena memory covered by the tensors live at each step (overlapping views counted once)."""
    live = [0] * steps
    by_step: list[list[MemoryTensor]] = [[] for _ in range(steps)]
    for t in tensors:
        for s in range(max(t.start, 0), min(t.end, steps - 1) + 1):
            by_step[s].append(t)
    for s, group in enumerate(by_step):
        spans = sorted((t.memory_id, t.offset, t.offset + t.nbytes) for t in group if t.nbytes)
        total, cur = 0, None
        for mid, lo, hi in spans:
            if cur is not None and mid == cur[0] and lo <= cur[2]:
                cur = (mid, cur[1], max(cur[2], hi))
                continue
            if cur is not None:
                total += cur[2] - cur[1]
            cur = (mid, lo, hi)
        if cur is not None:
            total += cur[2] - cur[1]
        live[s] = total
    return live


def graph_from_plan(lp: Any, plan_index: int) -> ProgramGraph:
    """The instruction graph, partitions and memory timeline of method ``plan_index`` of loaded program ``lp``."""
    plan: S.ExecutionPlan = lp.program.execution_plan[plan_index]
    nodes: list[ViewNode] = []
    producer: dict[int, str] = {}
    defined: set[int] = set()
    for k, vi in enumerate(plan.inputs):
        items = _tensor_items(plan, vi)
        nodes.append(ViewNode(f"in{k}", "input", f"input {k}", outputs=items))
        for t in items:
            producer[t] = f"in{k}"
        defined.update(items)
    for vi, value in enumerate(plan.values):  # constants are defined before any call
        if isinstance(value.val, S.Tensor) and _value_info(plan, vi)["kind"] == "constant":
            defined.add(vi)
    step_nodes: list[ViewNode] = []
    for ci, chain in enumerate(plan.chains):
        for ii, ins in enumerate(chain.instructions):
            node = _instruction_node(plan, ci, ii, ins, len(step_nodes), defined)
            if node is None:
                continue
            step_nodes.append(node)
            for t in node.outputs:
                producer.setdefault(t, node.id)
    nodes += step_nodes
    out_items = [t for vi in plan.outputs for t in _tensor_items(plan, vi)]
    nodes.append(ViewNode("out", "output", "outputs", inputs=out_items))
    edges: list[tuple[str, str, int]] = []
    values: dict[int, dict[str, Any]] = {}
    for node in nodes:
        for t in node.inputs + node.outputs:
            values.setdefault(t, _value_info(plan, t))
        for t in node.inputs:
            src = producer.get(t)
            if src is not None and src != node.id:
                edges.append((src, node.id, t))
    last_use: dict[int, int] = {}
    for node in step_nodes:
        for t in node.inputs + node.outputs:
            last_use[t] = node.step
    end = len(step_nodes) - 1
    memory: list[MemoryTensor] = []
    step_of = {n.id: n.step for n in step_nodes}
    for t, info in sorted(values.items()):
        if info["kind"] != "planned":
            continue
        src = producer.get(t, "")
        start = step_of.get(src, 0)
        stop = end if t in out_items else last_use.get(t, start)
        memory.append(MemoryTensor(t, f"v{t}", info["memory_id"], info["offset"], info["bytes"], start,
                                   max(stop, start), src))
    from edgeport.inspection import describe_delegate

    partitions = []
    for di, d in enumerate(plan.delegates):
        blob = lp.delegate_data(plan_index, di)
        partitions.append(PartitionView(di, d.id, len(blob), sorted(cs.key for cs in d.compile_specs),
                                        nodes=[n.id for n in step_nodes if n.partition == di],
                                        description=_jsonable(describe_delegate(d.id, blob,
                                                                                getattr(lp, "named_data", None)))))
    return ProgramGraph(
        method=plan.name, nodes=nodes, edges=edges, values=values, partitions=partitions, memory=memory,
        arena_bytes=list(plan.non_const_buffer_sizes), live_bytes=_live_bytes(memory, len(step_nodes)),
        steps=[n.id for n in step_nodes])


def layout(graph: ProgramGraph) -> None:
    """Layered layout: each node one layer below its deepest producer (a node reading only constants sits just
    above its first consumer); in a layer, nodes are ordered by the mean centred position of their producers."""
    preds: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
    succs: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
    for src, dst, _ in graph.edges:
        if src in preds and dst in preds:
            preds[dst].append(src)
            succs[src].append(dst)
    by_id = {n.id: n for n in graph.nodes}
    for n in graph.nodes:  # nodes are in execution order: producers come first
        n.layer = 1 + max((by_id[p].layer for p in preds[n.id]), default=-1) if n.kind != "input" else 0
    for n in reversed(graph.nodes):  # sources: as late as their consumers allow
        if n.kind != "input" and not preds[n.id] and succs[n.id]:
            n.layer = max(n.layer, min(by_id[c].layer for c in succs[n.id]) - 1)
    out = by_id.get("out")
    if out is not None:
        out.layer = 1 + max((n.layer for n in graph.nodes if n.kind != "output"), default=0)
    layers: dict[int, list[ViewNode]] = {}
    for n in graph.nodes:
        layers.setdefault(n.layer, []).append(n)
    centred: dict[str, float] = {}
    for depth in sorted(layers):
        row = layers[depth]

        def key(n: ViewNode) -> tuple[float, int]:
            ps = [centred[p] for p in preds[n.id] if p in centred]
            return (sum(ps) / len(ps) if ps else 0.0, n.step)

        row.sort(key=key)
        for i, n in enumerate(row):
            n.order = i
            centred[n.id] = i - (len(row) - 1) / 2
