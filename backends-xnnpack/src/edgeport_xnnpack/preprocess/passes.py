"""Graph-level passes over a finished blob graph (after lowering, before serialization).

* :func:`prune` drops nodes no output depends on (left behind by the view rewrites of
  :mod:`~edgeport_xnnpack.preprocess.views`, e.g. an attention in-projection split into q / k / v), then values
  nothing references and the constant data only they held; value ids are renumbered densely.
* :func:`schedule` reorders nodes (a topological order, greedy) so that nodes libXNNPACK 2022 defines natively
  sit next to each other, and so do the ones edgeport's executor runs on the host (transpose, slice, batch
  matrix multiply, ...): the executor makes one native runtime per maximal run of native nodes, and each
  runtime costs a call, a setup and a thread-pool wake-up. ExecuTorch's runtime makes one runtime per blob, so
  the order changes nothing there.
"""

from __future__ import annotations

from typing import Any

from edgeport_xnnpack._define import NATIVE_KINDS
from edgeport_xnnpack.schema.graph import (
    INPUT_FIELDS,
    INVALID_ID,
    OUTPUT_FIELDS,
    ConstantDataOffset,
    Graph,
    XNode,
)

_ALIGNMENT = 16


def prune(graph: Graph, data: bytearray) -> bytearray:
    """Remove dead nodes, unreferenced values and their constant data; returns the new constant data."""
    live = set(graph.output_ids)
    keep: list[XNode] = []
    for node in reversed(graph.nodes):
        if any(o in live for o in node.outputs()):
            keep.append(node)
            live.update(node.inputs())
    keep.reverse()
    if len(keep) == len(graph.nodes):
        return data
    graph.nodes = keep
    used = set(graph.input_ids) | set(graph.output_ids)
    for node in keep:
        used.update(node.inputs())
        used.update(node.outputs())
    if any(v.quant is not None for v in graph.values):
        return data  # quantized values may hold scale buffers; keep values and data as they are
    remap: dict[int, int] = {}
    values = []
    new_data = bytearray()
    buffers = [ConstantDataOffset()]
    for v in graph.values:
        if v.id_out not in used:
            continue
        remap[v.id_out] = len(values)
        v.id_out = len(values)
        if v.constant_buffer_idx:
            old = graph.constant_data[v.constant_buffer_idx]
            new_data.extend(bytes(-len(new_data) % _ALIGNMENT))
            buffers.append(ConstantDataOffset(len(new_data), old.size, old.named_key))
            new_data.extend(data[old.offset:old.offset + old.size])
            v.constant_buffer_idx = len(buffers) - 1
        values.append(v)
    graph.values = values
    graph.constant_data = buffers
    graph.input_ids = [remap[i] for i in graph.input_ids]
    graph.output_ids = [remap[i] for i in graph.output_ids]
    for node in keep:
        for name, value in list(node.fields.items()):
            if name in INPUT_FIELDS + OUTPUT_FIELDS and value != INVALID_ID:
                node.fields[name] = remap[value]
    return new_data


def runs_on_host(node: XNode, constants: set[int]) -> bool:
    """Whether edgeport's executor runs ``node`` as a numpy host step (libXNNPACK 2022 lacks it)."""
    if node.kind not in NATIVE_KINDS:
        return True
    if node.kind == "XNNFullyConnected":
        bias = node.get("bias_id")
        return node.get("filter_id") not in constants or (bias != INVALID_ID and bias not in constants)
    return False


def schedule(graph: Graph) -> None:
    """Reorder ``graph.nodes`` to group native and host nodes (keeps every producer before its readers)."""
    nodes = graph.nodes
    constants = {v.id_out for v in graph.values if v.constant_buffer_idx}
    producer: dict[int, int] = {}
    for i, n in enumerate(nodes):
        for o in n.outputs():
            producer[o] = i
    deps: list[set[int]] = [{producer[v] for v in n.inputs() if v in producer} for n in nodes]
    readers: list[list[int]] = [[] for _ in nodes]
    for i, d in enumerate(deps):
        for j in d:
            readers[j].append(i)
    host = [runs_on_host(n, constants) for n in nodes]
    waiting = [len(d) for d in deps]
    ready = sorted(i for i, w in enumerate(waiting) if w == 0)
    order: list[int] = []
    current: Any = None
    while ready:
        same = [i for i in ready if host[i] == current]
        pick = same[0] if same else ready[0]
        current = host[pick]
        ready.remove(pick)
        order.append(pick)
        for r in readers[pick]:
            waiting[r] -= 1
            if waiting[r] == 0:
                ready.append(r)
        ready.sort()
    graph.nodes = [nodes[i] for i in order]
