"""Debug handles: the ids that link runtime events back to edge-graph nodes (ExecuTorch's scheme).

Every ``call_function`` node of an edge program gets an integer ``node.meta["debug_handle"]`` (1, 2, ... in graph
order) when the program enters the edge dialect. Partitioning keeps them on the nodes it moves into a partition;
the emitter then records, per method, which handles each instruction carries out (``debug_handle_map``: an int for
a kernel, the list of the partition's handles for a delegate call), each delegate call's backend and the
backend's own map from its internal step ids to handles (``delegate_map``), and the number of outputs of each
delegate call (``instruction_id_to_num_outs_map``) — the three maps an ETRecord stores.
"""

from __future__ import annotations

from typing import Any

import torch

from edgeport.aot.graph_utils import graph_modules

DEBUG_HANDLE = "debug_handle"


def assign_debug_handles(gm: torch.fx.GraphModule) -> None:
    """Give every ``call_function`` node (control-flow branches included) without a handle the next free one.

    Nodes that already carry a handle keep it, so calling this again after a pass only numbers the new nodes."""
    graphs = list(graph_modules(gm))
    used = [h for g in graphs for n in g.graph.nodes if isinstance(h := n.meta.get(DEBUG_HANDLE), int)]
    next_handle = max(used, default=0) + 1
    for g in graphs:
        for node in g.graph.nodes:
            if node.op == "call_function" and not isinstance(node.meta.get(DEBUG_HANDLE), int):
                node.meta[DEBUG_HANDLE] = next_handle
                next_handle += 1


def node_handles(program: Any) -> list[int]:
    """The debug handles of ``program``'s ``call_function`` nodes (an ``ExportedProgram`` or graph module)."""
    gm = program.graph_module if hasattr(program, "graph_module") else program
    return [h for g in graph_modules(gm) for n in g.graph.nodes
            if n.op == "call_function" and isinstance(h := n.meta.get(DEBUG_HANDLE), int)]


def handles_by_name(gm: torch.fx.GraphModule) -> dict[str, int]:
    """``node.name -> debug handle`` of the nodes of ``gm`` that have one (before a pass that replaces nodes)."""
    return {n.name: h for g in graph_modules(gm) for n in g.graph.nodes
            if isinstance(h := n.meta.get(DEBUG_HANDLE), int)}


def inherit_debug_handles(gm: torch.fx.GraphModule, previous: dict[str, int]) -> None:
    """Give nodes that a decomposition made the handle of the node they came from (``node.meta["from_node"]``,
    torch's provenance), so that their events still point at a node of the recorded edge program."""
    for g in graph_modules(gm):
        for node in g.graph.nodes:
            if node.op != "call_function" or isinstance(node.meta.get(DEBUG_HANDLE), int):
                continue
            for source in reversed(node.meta.get("from_node") or []):
                handle = previous.get(getattr(source, "name", None))
                if handle is not None:
                    node.meta[DEBUG_HANDLE] = handle
                    break
