"""What a lowered graph delegates: ExecuTorch's ``get_delegation_info`` summary and op table, plus partitions.

Works on edgeport's lowered graphs (``edgeport.call_delegate`` nodes) and on ExecuTorch's
(``executorch_call_delegate`` with a ``lowered_module_*`` attribute), so the two frameworks' lowerings of one model
can be compared with one function. Op types are the operator's name (``aten.linear.default``); ``getitem`` nodes
count as non-delegated ``getitem``, as ExecuTorch counts them.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DelegationBreakdown", "DelegationInfo", "PartitionInfo", "format_delegated_graph", "get_delegation_info",
]

OCCURRENCES_IN_DELEGATED_GRAPHS = "occurrences_in_delegated_graphs"
OCCURRENCES_IN_NON_DELEGATED_GRAPHS = "occurrences_in_non_delegated_graphs"


@dataclass
class DelegationBreakdown:
    """How many nodes of one operator type are inside delegates and outside them."""

    op_type: str = ""
    delegated: int = 0
    non_delegated: int = 0


@dataclass
class PartitionInfo:
    """One delegate call: its backend, the operators it took, and the tensors crossing its boundary."""

    index: int
    backend_id: str
    node_count: int
    ops: dict[str, int]
    inputs: list[str]  # "name: dtype[shape]" of each value entering the delegate
    outputs: list[str]


@dataclass
class DelegationInfo:
    """ExecuTorch's ``DelegationInfo`` fields, plus partitions and rejected nodes with their reasons."""

    num_delegated_subgraphs: int
    num_delegated_nodes: int
    num_non_delegated_nodes: int
    delegation_by_operator: dict[str, DelegationBreakdown]
    partitions: list[PartitionInfo] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # node name -> why no partitioner took it

    def get_summary(self) -> str:
        """The three counts, one per line (ExecuTorch's wording)."""
        return (f"Total delegated subgraphs: {self.num_delegated_subgraphs}\n"
                f"Number of delegated nodes: {self.num_delegated_nodes}\n"
                f"Number of non-delegated nodes: {self.num_non_delegated_nodes}\n")

    def get_operator_delegation_table(self) -> list[dict[str, Any]]:
        """Rows of op type x occurrences in delegated / non-delegated graphs, sorted, with a ``Total`` row last."""
        rows = [{"op_type": b.op_type, OCCURRENCES_IN_DELEGATED_GRAPHS: b.delegated,
                 OCCURRENCES_IN_NON_DELEGATED_GRAPHS: b.non_delegated}
                for b in sorted(self.delegation_by_operator.values(), key=lambda b: b.op_type)]
        rows.append({"op_type": "Total", OCCURRENCES_IN_DELEGATED_GRAPHS: self.num_delegated_nodes,
                     OCCURRENCES_IN_NON_DELEGATED_GRAPHS: self.num_non_delegated_nodes})
        return rows

    def get_operator_delegation_dataframe(self) -> Any:
        """The op table as a pandas DataFrame (ExecuTorch's columns); needs ``pandas``."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("get_operator_delegation_dataframe needs pandas (pip install pandas); "
                              "get_operator_delegation_table() gives the same rows without it") from exc
        return pd.DataFrame(self.get_operator_delegation_table())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def op_type(node: Any) -> str:
    """The operator name of a ``call_function`` node (``aten.linear.default``, ``getitem``)."""
    target = node.target
    if target is operator.getitem:
        return "getitem"
    name = getattr(target, "__name__", None)
    text = str(target)
    if text.startswith("<") and name:
        return name
    return text


def _value_desc(node: Any) -> str:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    shape = getattr(val, "shape", None)
    if shape is None:
        return f"{getattr(node, 'name', node)}"
    dtype = str(getattr(val, "dtype", "")).removeprefix("torch.")
    return f"{node.name}: {dtype}{list(shape)}"


def _lowered_of(graph_module: Any, node: Any) -> Any | None:
    """The lowered module a delegate call node runs, or None when ``node`` is not a delegate call."""
    if node.op != "call_function":
        return None
    name = op_type(node)
    if name.startswith("edgeport.call_delegate"):
        from edgeport.aot.delegate_op import lookup_lowered_module

        return lookup_lowered_module(node.args[0])
    if "executorch_call_delegate" in name:
        holder = node.args[0]
        return getattr(graph_module, holder.target, None)
    return None


def _delegate_inputs(node: Any) -> list[Any]:
    if op_type(node).startswith("edgeport.call_delegate"):
        return list(node.args[1])
    return list(node.args[1:])


def get_delegation_info(graph_module: Any, rejections: Mapping[str, str] | Iterable[Any] | None = None
                        ) -> DelegationInfo:
    """Count delegated and non-delegated nodes of a lowered graph module, by operator type.

    ``rejections``: a ``{node name: reason}`` mapping, or partitioner objects whose ``rejections`` attribute holds
    one (edgeport's capability partitioners keep why each node was not taken); the reasons of nodes still
    outside any delegate are reported in :attr:`DelegationInfo.rejected`.
    """
    counts: dict[str, DelegationBreakdown] = {}

    def count(kind: str, delegated: bool) -> None:
        entry = counts.setdefault(kind, DelegationBreakdown(op_type=kind))
        if delegated:
            entry.delegated += 1
        else:
            entry.non_delegated += 1

    partitions: list[PartitionInfo] = []
    outside: set[str] = set()
    for node in graph_module.graph.nodes:
        lowered = _lowered_of(graph_module, node)
        if lowered is None:
            if node.op == "call_function":
                count(op_type(node), False)
                outside.add(node.name)
            continue
        ops: dict[str, int] = {}
        for inner in lowered.original_module.graph.nodes:
            if inner.op == "call_function":
                kind = op_type(inner)
                count(kind, True)
                ops[kind] = ops.get(kind, 0) + 1
        users = [u for u in node.users if u.op == "call_function"]
        partitions.append(PartitionInfo(
            index=len(partitions), backend_id=str(getattr(lowered, "backend_id", "")),
            node_count=sum(ops.values()), ops=dict(sorted(ops.items())),
            inputs=[_value_desc(a) for a in _delegate_inputs(node) if hasattr(a, "op")],
            outputs=[_value_desc(u) for u in users] if users else [_value_desc(node)]))
    reasons = _merge_rejections(rejections)
    return DelegationInfo(
        num_delegated_subgraphs=len(partitions),
        num_delegated_nodes=sum(b.delegated for b in counts.values()),
        num_non_delegated_nodes=sum(b.non_delegated for b in counts.values()),
        delegation_by_operator=counts, partitions=partitions,
        rejected={name: why for name, why in reasons.items() if name in outside})


def _merge_rejections(rejections: Mapping[str, str] | Iterable[Any] | None) -> dict[str, str]:
    if rejections is None:
        return {}
    if isinstance(rejections, Mapping):
        return {str(k): str(v) for k, v in rejections.items()}
    merged: dict[str, str] = {}
    for source in rejections:
        for name, why in (getattr(source, "rejections", None) or {}).items():
            merged.setdefault(str(name), str(why))
    return merged


def format_delegated_graph(graph_module: Any) -> str:
    """The graph, one line per node, with each delegate call followed by the nodes it took (indented)."""
    lines: list[str] = []
    for node in graph_module.graph.nodes:
        lowered = _lowered_of(graph_module, node)
        if lowered is None:
            if node.op in ("placeholder", "output", "call_function"):
                target = op_type(node) if node.op == "call_function" else node.op
                lines.append(f"{node.name} = {target}")
            continue
        lines.append(f"{node.name} = delegate {getattr(lowered, 'backend_id', '?')}:")
        for inner in lowered.original_module.graph.nodes:
            if inner.op == "call_function":
                lines.append(f"    {inner.name} = {op_type(inner)}")
    return "\n".join(lines)
