"""The partition contract: :class:`RecordingPartitioner` wraps a backend's partitioner inside the real pipeline
and checks, the moment it returns, that it only tagged nodes and which nodes it tagged (:class:`PartitionRecord`).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from edgeport.backend import CapabilityTable, CompileSpec, DelegationSpec

_TAG = "delegation_tag"


def _describe(value: Any) -> Any:
    """A comparable summary of a meta value: tensors by (shape, dtype), containers element-wise."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_describe(v) for v in value))
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    return ("object", type(value).__name__, id(value))


def _snapshot(ep: Any) -> dict[str, Any]:
    def fmt(arg: Any) -> str:
        return repr(torch.fx.node.map_arg(arg, lambda n: f"%{n.name}"))

    nodes = []
    for n in ep.graph.nodes:
        meta = {k: v for k, v in n.meta.items() if k != _TAG}
        nodes.append((n.name, n.op, str(n.target), fmt((n.args, n.kwargs)), meta))
    sig = ep.graph_signature
    return {
        "nodes": nodes,
        "inputs": [(s.kind.name, getattr(s.arg, "name", repr(s.arg)), s.target) for s in sig.input_specs],
        "outputs": [(s.kind.name, getattr(s.arg, "name", repr(s.arg)), s.target) for s in sig.output_specs],
        "state": {k: id(v) for k, v in ep.state_dict.items()},
        "constants": {k: id(v) for k, v in ep.constants.items()},
    }


def _meta_equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(_describe(a) == _describe(b)) if not isinstance(a, (dict, set)) else bool(a == b)
    except Exception:  # noqa: BLE001 - uncomparable: different objects count as changed
        return False


def _diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    changes: list[str] = []
    b_nodes = {n[0]: n for n in before["nodes"]}
    a_nodes = {n[0]: n for n in after["nodes"]}
    for name in b_nodes.keys() - a_nodes.keys():
        changes.append(f"node {name!r} was removed")
    for name in a_nodes.keys() - b_nodes.keys():
        changes.append(f"node {name!r} was added")
    if not changes and [n[0] for n in before["nodes"]] != [n[0] for n in after["nodes"]]:
        changes.append("nodes were reordered")
    for name in b_nodes.keys() & a_nodes.keys():
        (_, op0, t0, a0, m0), (_, op1, t1, a1, m1) = b_nodes[name], a_nodes[name]
        if (op0, t0) != (op1, t1):
            changes.append(f"node {name!r}: target changed from {t0} to {t1}")
        if a0 != a1:
            changes.append(f"node {name!r}: arguments changed from {a0} to {a1}")
        for key in sorted(m0.keys() | m1.keys()):
            if key not in m1:
                changes.append(f"node {name!r}: meta[{key!r}] was removed")
            elif key not in m0:
                changes.append(f"node {name!r}: meta[{key!r}] was added (only meta[{_TAG!r}] may be set)")
            elif not _meta_equal(m0[key], m1[key]):
                changes.append(f"node {name!r}: meta[{key!r}] was changed")
    for key in ("inputs", "outputs", "state", "constants"):
        if before[key] != after[key]:
            changes.append(f"the program's {key} changed" if key in ("state", "constants")
                           else f"the graph signature's {key} changed")
    return changes


@dataclass
class NodeRecord:
    """A ``call_function`` node the partitioner saw: its op, its tag, and ``claim`` = ``None`` when the
    capability table claims it (else the reason it does not)."""

    name: str
    op: str
    tag: str | None
    claim: str | None


@dataclass
class PartitionRecord:
    """What one ``partition`` call did, checked the moment it returned."""

    changes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # result type, tags without spec, wrong backend id, ...
    nodes: list[NodeRecord] = field(default_factory=list)
    partition_tags: dict[str, Any] = field(default_factory=dict)
    tagged: dict[str, str] = field(default_factory=dict)  # every tagged node (constants included) -> tag
    ops_seen: list[str] = field(default_factory=list)


class RecordingPartitioner:
    """Wraps a backend's partitioner: the pipeline calls it as usual, and each call leaves a
    :class:`PartitionRecord` in :attr:`records`."""

    def __init__(self, inner: Any, backend_id: str, table: CapabilityTable,
                 compile_options_type: type | None = None) -> None:
        from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner

        self.inner = inner
        self.backend_id = backend_id
        self.compile_options_type = compile_options_type
        self.checker = CapabilityBasedPartitioner(backend_id, table)
        self.records: list[PartitionRecord] = []

    def as_partitioner(self) -> Any:
        from edgeport.aot.partitioner import Partitioner

        recorder = self

        class _Recording(Partitioner):
            def ops_to_not_decompose(self, ep: Any) -> Any:
                return recorder.inner.ops_to_not_decompose(ep)

            def partition(self, ep: Any) -> Any:
                return recorder.partition(ep)

        _Recording.__name__ = f"Recording[{type(self.inner).__name__}]"
        return _Recording()

    def partition(self, ep: Any) -> Any:
        from edgeport.aot.capability_partitioner import op_name
        from edgeport.aot.partitioner import PartitionResult

        before = _snapshot(ep)
        result = self.inner.partition(ep)
        record = PartitionRecord()
        self.records.append(record)
        if not isinstance(result, PartitionResult):
            record.problems.append(f"partition returned {type(result).__name__}, not a PartitionResult")
            return result
        tagged_ep = result.tagged_exported_program
        record.changes = _diff(before, _snapshot(tagged_ep))
        tags = result.partition_tags
        if not isinstance(tags, Mapping):
            record.problems.append(f"partition_tags is a {type(tags).__name__}, not a dict")
            tags = {}
        record.partition_tags = dict(tags)
        for tag, spec in tags.items():
            if not isinstance(spec, DelegationSpec):
                record.problems.append(f"partition_tags[{tag!r}] is a {type(spec).__name__}, not a DelegationSpec")
                continue
            if spec.backend_id != self.backend_id:
                record.problems.append(
                    f"partition_tags[{tag!r}].backend_id is {spec.backend_id!r}, expected {self.backend_id!r}"
                )
            if not all(isinstance(c, CompileSpec) for c in spec.compile_specs):
                record.problems.append(f"partition_tags[{tag!r}].compile_specs must be a list of CompileSpec")
            elif self.compile_options_type is not None:
                try:
                    self.compile_options_type.from_compile_specs(list(spec.compile_specs))
                except Exception as exc:  # noqa: BLE001
                    record.problems.append(
                        f"partition_tags[{tag!r}].compile_specs do not parse as "
                        f"{self.compile_options_type.__name__}: {type(exc).__name__}: {exc}"
                    )
        for node in tagged_ep.graph.nodes:
            tag = node.meta.get(_TAG)
            if tag is not None:
                record.tagged[node.name] = tag
                if tag not in tags:
                    record.problems.append(f"node {node.name!r} is tagged {tag!r}, which has no DelegationSpec")
            if node.op != "call_function" or node.target is operator.getitem:
                continue
            name = op_name(node.target)
            record.ops_seen.append(name)
            record.nodes.append(NodeRecord(node.name, name, tag, self.checker.check_node(node)))
        unused = set(tags) - set(record.tagged.values())
        if unused:
            record.problems.append(f"partition_tags {sorted(unused)} are not used by any node")
        return result


def describe_untagged(record: PartitionRecord) -> list[str]:
    """Claimed nodes the partitioner did not tag."""
    return [f"{n.name} ({n.op})" for n in record.nodes if n.claim is None and n.tag is None]


def describe_unclaimed_tagged(record: PartitionRecord) -> list[str]:
    """Tagged compute nodes the capability table does not claim."""
    return [f"{n.name} ({n.op}: {n.claim})" for n in record.nodes if n.claim is not None and n.tag is not None]
