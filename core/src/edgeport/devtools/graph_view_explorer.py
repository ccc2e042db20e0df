"""A :class:`~edgeport.devtools.graph_view_model.ProgramGraph` in Google Model Explorer's JSON graph format.

The JSON is what Model Explorer's ``graph_builder`` dataclasses (``GraphCollection``, ``Graph``, ``GraphNode``,
``IncomingEdge``, ``KeyValue``, ``MetadataItem``, ``GraphNodeStyle``, ``GroupNodeConfig``) serialize to, written
here as plain dicts so edgeport does not depend on ``ai-edge-model-explorer``: open the file in Model Explorer
(``model-explorer graph.json``, or "Select from your computer"); its built-in JSON loader reads it. Delegate
calls are filled with their backend's colour; from a lowering, each opens the graph of the nodes its partition
took (``subgraphIds``).
"""

from __future__ import annotations

from typing import Any

from edgeport.devtools.graph_view_model import PORTABLE, ProgramGraph

__all__ = ["backend_colour", "to_model_explorer"]

_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f"]


def backend_colour(backend: str, backends: list[str]) -> str:
    """The colour of ``backend`` (the page and the Model Explorer export agree)."""
    if backend in ("", PORTABLE):
        return "#d9d9d9"
    order = sorted(b for b in backends if b not in ("", PORTABLE))
    return _PALETTE[order.index(backend) % len(_PALETTE)] if backend in order else "#bab0ac"


def _kv(key: str, value: Any) -> dict[str, Any]:
    return {"key": key, "value": str(value)}


def _tensor_text(info: dict[str, Any]) -> str:
    return f"{info['dtype']}{info['shape']}"


def to_model_explorer(graph: ProgramGraph, title: str = "") -> dict[str, Any]:
    """A graph collection ``{"label", "graphs": [graph], "graphSorting"}``: the JSON Model Explorer's built-in
    JSON loader opens (it takes a collection or a list of graphs, not ``{"graphs": ...}``)."""
    backends = sorted({p.backend for p in graph.partitions})
    out_index: dict[tuple[str, int], int] = {}
    for n in graph.nodes:
        for k, t in enumerate(n.outputs):
            out_index[(n.id, t)] = k
    incoming: dict[str, list[dict[str, str]]] = {}
    for src, dst, value in graph.edges:
        slot = len(incoming.setdefault(dst, []))
        incoming[dst].append({"sourceNodeId": src, "sourceNodeOutputId": str(out_index.get((src, value), 0)),
                              "targetNodeInputId": str(slot)})
    nodes = []
    subgraphs = []
    for p in graph.partitions:
        if p.inner:
            subgraphs.append(_partition_graph(graph.method, p.index, p.backend, p.inner,
                                              backend_colour(p.backend, backends)))
    with_inner = {p.index for p in graph.partitions if p.inner}
    for n in graph.nodes:
        attrs = [_kv("kind", n.kind)]
        if n.instruction >= 0:
            attrs.append(_kv("instruction", f"chain {n.chain}, instruction {n.instruction}"))
        for key, value in (("node", n.name), ("source", n.source), ("module", n.module),
                           ("rejected because", n.rejected)):
            if value:
                attrs.append(_kv(key, value))
        if n.time_us is not None:
            attrs.append(_kv("time (us, mean per run)", f"{n.time_us:.2f}"))
        if n.partition is not None:
            part = graph.partitions[n.partition]
            attrs.append(_kv("delegate blob bytes", part.blob_bytes))
            if part.ops:
                attrs.append(_kv("operators", ", ".join(f"{k} x{v}" for k, v in part.ops.items())))
            for key, value in part.validation.items():
                attrs.append(_kv(f"validation {key}", value))
        outputs = [{"id": str(k), "attrs": [_kv("tensor_shape", _tensor_text(graph.values[t])),
                                            _kv("value", t), _kv("memory", graph.values[t]["kind"])]}
                   for k, t in enumerate(n.outputs)]
        colour = backend_colour(n.backend, backends)
        label = f"{n.label} #{n.partition}" if n.kind == "delegate" else n.label
        inner = [_partition_graph_id(graph.method, n.partition, n.backend)] if n.partition in with_inner else []
        nodes.append({
            "id": n.id, "label": label, "namespace": "", "subgraphIds": inner, "attrs": attrs,
            "incomingEdges": incoming.get(n.id, []), "outputsMetadata": outputs, "inputsMetadata": [],
            "style": {"backgroundColor": colour if n.kind == "delegate" else "",
                      "borderColor": "#d62728" if n.rejected else colour, "hoveredBorderColor": "#000000"},
            "config": None})
    summary = {"method": graph.method, "instructions": str(len(graph.steps)),
               "delegates": str(len(graph.partitions)), "peak live bytes": str(graph.peak_live_bytes),
               "rejected nodes": str(len(graph.rejected))}
    return {"label": title or graph.method, "graphs": [{
        "id": graph.method, "nodes": nodes,
        "groupNodeAttributes": {"": summary}, "groupNodeConfigs": None,
        "nodeLabelsToHide": None, "tasksData": None, "layoutConfigs": None}, *subgraphs],
        "graphSorting": "node_count_desc"}


def _partition_graph_id(method: str, index: int | None, backend: str) -> str:
    return f"{method} / partition {index} ({backend})"


def _partition_graph(method: str, index: int, backend: str, inner: list[dict[str, Any]],
                     colour: str) -> dict[str, Any]:
    """The nodes a partition took, as the graph its delegate-call node opens (``subgraphIds``)."""
    nodes = []
    position = {n["name"]: k for k, n in enumerate(inner)}
    for k, n in enumerate(inner):
        attrs = [_kv("node", n["name"]), _kv("op", n["op"])] + ([_kv("source", n["source"])] if n["source"] else [])
        nodes.append({
            "id": f"p{index}n{k}", "label": "input" if n["op"] == "input" else n["op"], "namespace": "",
            "subgraphIds": [], "attrs": attrs,
            "incomingEdges": [{"sourceNodeId": f"p{index}n{position[src]}",
                               "sourceNodeOutputId": "0", "targetNodeInputId": str(slot)}
                              for slot, src in enumerate(n["inputs"])],
            "outputsMetadata": [], "inputsMetadata": [],
            "style": None if n["op"] == "input" else {"backgroundColor": colour, "borderColor": colour,
                                                      "hoveredBorderColor": "#000000"},
            "config": None})
    return {"id": _partition_graph_id(method, index, backend), "nodes": nodes, "groupNodeAttributes": None,
            "groupNodeConfigs": None, "nodeLabelsToHide": None, "tasksData": None, "layoutConfigs": None}

