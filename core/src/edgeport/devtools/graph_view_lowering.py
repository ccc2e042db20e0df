"""What the lowering adds to a ``.pte``'s graph: node names, source lines, partitions' operators, rejected nodes.

The emitter writes one instruction per kernel or delegate-call node of the execution program, in graph order
(``alloc`` and ``getitem`` nodes write none); :func:`annotate_from_lowering` walks both in step and checks every
pair's operator before it names anything, so a mismatch leaves the ``.pte``'s view as it is, with a note.
Works on graph objects through their attributes only (no torch import here).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from edgeport.devtools.delegation_info import _lowered_of, get_delegation_info, op_type
from edgeport.devtools.graph_view_model import ProgramGraph

__all__ = ["annotate_from_lowering", "inner_nodes", "source_of"]

MAX_INNER_NODES = 400  # per partition, in the page


def _is_alloc(node: Any) -> bool:
    target = node.target
    return getattr(target, "__name__", "") == "alloc" and "out_variants" in getattr(target, "__module__", "")


def _emitting_nodes(graph_module: Any) -> list[Any]:
    return [n for n in graph_module.graph.nodes
            if n.op == "call_function" and n.target is not operator.getitem and not _is_alloc(n)]


def _same_operator(label: str, node: Any) -> bool:
    """Whether the kernel ``label`` (``aten::add.out``) is what ``node`` (``aten.add.out``) calls."""
    name = op_type(node)
    base = label.split(".")[0].replace("::", ".")
    return name == label.replace("::", ".") or name.startswith(base + ".") or name == base


def source_of(node: Any) -> str:
    """The last frame of the node's ``stack_trace`` (file, line, and the code line), or ""."""
    trace = (getattr(node, "meta", {}) or {}).get("stack_trace") or ""
    lines = [ln.rstrip() for ln in str(trace).strip().splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].lstrip().startswith("File "):
            return "\n".join(ln.strip() for ln in lines[i:i + 2])
    return lines[-1].strip() if lines else ""


def _module_of(node: Any) -> str:
    stack = (getattr(node, "meta", {}) or {}).get("nn_module_stack") or {}
    if not stack:
        return ""
    path, kind = list(stack.values())[-1][:2]
    kind_name = getattr(kind, "__name__", None) or str(kind).rsplit(".", 1)[-1].rstrip("'>")
    return f"{path} ({kind_name})" if path else kind_name


def annotate_from_lowering(graph: ProgramGraph, edge_program: Any, execution_program: Any,
                           rejection_sources: Sequence[Any]) -> None:
    """Name ``graph``'s instruction nodes after the execution program's nodes and add what the lowering knows."""
    steps = [graph.node(i) for i in graph.steps if graph.node(i).chain == 0]
    emitting = _emitting_nodes(execution_program.graph_module)
    matched = len(steps) == len(emitting)
    if matched:
        for view, node in zip(steps, emitting):
            is_delegate = "call_delegate" in op_type(node)
            if (view.kind == "delegate") != is_delegate or (view.kind == "kernel" and not is_delegate
                                                             and not _same_operator(view.label, node)):
                matched = False
                break
    if not matched:
        graph.notes.append(f"the program's {len(steps)} instructions do not line up with the lowered graph's "
                           f"{len(emitting)} calls: node names and source lines are not shown")
    else:
        for view, node in zip(steps, emitting):
            view.name, view.source, view.module = node.name, source_of(node), _module_of(node)
    edge_gm = edge_program.graph_module
    info = get_delegation_info(edge_gm, list(rejection_sources))
    by_name = {n.name: n for n in edge_gm.graph.nodes}
    graph.rejected = {name: {"op": op_type(by_name[name]) if name in by_name else "", "reason": why,
                             "source": source_of(by_name[name]) if name in by_name else ""}
                      for name, why in info.rejected.items()}
    for view in steps:
        if view.name in info.rejected:
            view.rejected = info.rejected[view.name]
    # partitions: the execution graph's delegate calls in order are the instructions' delegate calls in order
    exec_info = get_delegation_info(execution_program.graph_module)
    delegate_steps = [v for v in steps if v.kind == "delegate"]
    if matched and len(exec_info.partitions) == len(delegate_steps):
        exec_gm = execution_program.graph_module
        calls = [n for n in emitting if "call_delegate" in op_type(n)]
        for part, view, call in zip(exec_info.partitions, delegate_steps, calls):
            target = graph.partitions[view.partition] if view.partition is not None else None
            if target is not None and not target.ops:
                target.ops, target.node_count = dict(part.ops), part.node_count
                lowered = _lowered_of(exec_gm, call)
                if lowered is not None:
                    target.inner = inner_nodes(lowered.original_module)


def inner_nodes(program: Any, limit: int = MAX_INNER_NODES) -> list[dict[str, Any]]:
    """The nodes of a partition's program: its user inputs and calls, each with the names of the calls and
    inputs it reads (through getitem), its operator and source line; at most ``limit``."""
    signature = getattr(program, "graph_signature", None)
    user_inputs = set(getattr(signature, "user_inputs", ()) or ())
    shown: dict[str, dict[str, Any]] = {}
    for node in program.graph.nodes:
        if len(shown) >= limit:
            break
        if node.op == "placeholder" and (node.name in user_inputs or signature is None):
            shown[node.name] = {"name": node.name, "op": "input", "inputs": [], "source": ""}
        elif node.op == "call_function" and node.target is not operator.getitem:
            reads = []
            for inp in node.all_input_nodes:
                while inp.op == "call_function" and inp.target is operator.getitem:
                    inp = inp.args[0]
                if inp.name in shown and inp.name not in reads:
                    reads.append(inp.name)
            shown[node.name] = {"name": node.name, "op": op_type(node), "inputs": reads, "source": source_of(node)}
    return list(shown.values())
