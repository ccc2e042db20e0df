"""``JointPartitioner``: several backends partitioned together, with a global view of what each can take.

Running partitioners one after another (``partitioner=[A(), B()]``) lets ``A`` take whatever it can, in whatever
shape it likes, and ``B`` the rest; the result depends on the order in ways that are hard to see (tiny islands,
``ops_to_not_decompose`` requests that break the other backend). ``JointPartitioner`` instead:

1. asks every backend which nodes it can take, by running its partitioner on a copy of the program and reading
   the tags (so every backend-specific rule its partitioner applies is respected);
2. gives each node to the highest-priority backend that claimed it (list order = priority);
3. groups the owned nodes into cycle-free partitions over *all* backends at once, then applies the same rules to
   every backend, repeating until nothing changes:

   * ``boundary_cost``: a partition of at most ``boundary_cost`` compute ops whose neighbouring compute nodes
     are all owned by one other backend that also claimed all its nodes goes to that backend (an island is
     not split off: every delegate boundary costs a copy/requantization and a call);
   * ``min_partition_ops``: a smaller partition is given up; its nodes go to the next backend that claimed
     them (or stay on the CPU);
   * ``max_partitions``: per backend, only the largest ``max_partitions`` partitions are kept;
   * a partition made only of quantize/dequantize ops is given up (boundary glue, not work), and so is a
     quantize/dequantize whose partner its backend claimed with it now belongs to another backend (backends
     differ in what crosses their boundary: XNNPACK takes float, Ethos-U int8; the CPU converts between them);

4. resolves ``ops_to_not_decompose`` per node by its owner: a node of an op some backend wants kept whole is
   kept whole only when that backend comes before every backend that can take the node's decomposed form
   (ExecuTorch issue #14458: one backend's ``max_pool2d`` request broke the other's lowering).

:attr:`JointPartitioner.ownership` says, per compute node, who owns it and why each other backend did not get
it; :attr:`JointPartitioner.decompositions` says why each listed node was kept whole or decomposed.
"""

from __future__ import annotations

import copy
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from edgeport.aot.capability_partitioner import _QuotientGraph, constant_placeholder_names, op_name
from edgeport.aot.partitioner import DELEGATION_TAG, Partitioner, PartitionResult
from edgeport.backend import DelegationSpec
from edgeport.errors import PartitionError

__all__ = ["JointPartitioner", "NodeOwnership", "origin_name"]

log = logging.getLogger(__name__)


@dataclass
class NodeOwnership:
    """Who owns one compute node and why the other backends did not get it."""

    node: str
    op: str
    owner: str | None  # backend id, or None: runs on the CPU (portable kernels)
    tag: str | None = None
    not_taken: dict[str, str] = field(default_factory=dict)  # backend id -> reason


def origin_name(node: Node) -> str:
    """The name of the exported-program node ``node`` comes from (decomposition keeps ``from_node``)."""
    sources = node.meta.get("from_node")
    if sources:
        return str(sources[-1].name)
    return node.name


def _is_compute(node: Node) -> bool:
    return node.op == "call_function" and node.target is not operator.getitem


def _op_name(node: Node) -> str:
    return op_name(node.target)


def _is_qdq(node: Node) -> bool:
    name = _op_name(node)
    return name.startswith("quantized_decomposed.") and "quantize_per_" in name


def _spec_key(spec: DelegationSpec) -> tuple[str, tuple[tuple[str, bytes], ...]]:
    return spec.backend_id, tuple((c.key, bytes(c.value)) for c in spec.compile_specs)


class JointPartitioner(Partitioner):
    """Partition for several backends at once; ``partitioners`` in priority order (first = preferred).

    Args:
        partitioners: one partitioner per backend, highest priority first.
        min_partition_ops: partitions with fewer compute ops are not delegated (every backend).
        max_partitions: at most this many partitions per backend (the largest are kept); ``None``: no limit.
        boundary_cost: the largest island (in compute ops) given to the surrounding backend rather than
            split off; ``0`` disables the rule.
    """

    def __init__(self, partitioners: Sequence[Partitioner], *, min_partition_ops: int = 1,
                 max_partitions: int | None = None, boundary_cost: int = 1) -> None:
        super().__init__()
        parts = list(partitioners)
        if not parts:
            raise PartitionError("JointPartitioner needs at least one partitioner")
        for p in parts:
            if not isinstance(p, Partitioner):
                raise PartitionError(f"JointPartitioner: {p!r} is not a Partitioner")
        if min_partition_ops < 1:
            raise PartitionError(f"min_partition_ops must be >= 1, got {min_partition_ops}")
        if max_partitions is not None and max_partitions < 1:
            raise PartitionError(f"max_partitions must be >= 1 or None, got {max_partitions}")
        if boundary_cost < 0:
            raise PartitionError(f"boundary_cost must be >= 0, got {boundary_cost}")
        self.partitioners = parts
        self.min_partition_ops = min_partition_ops
        self.max_partitions = max_partitions
        self.boundary_cost = boundary_cost
        self.ownership: dict[str, NodeOwnership] = {}
        self.decompositions: dict[str, str] = {}
        self.backend_ids: list[str] = []
        self._claim_tags: list[dict[str, str]] = []
        #: called with the result after each :meth:`partition` (e.g. a progress display: lowering starts next)
        self.on_partitioned: Callable[[PartitionResult], None] | None = None

    # -- claims ---------------------------------------------------------------------------------------------
    def _claims(self, ep: ExportedProgram) -> tuple[list[dict[str, DelegationSpec]], list[dict[str, str]]]:
        """Per partitioner: node name -> the spec of the partition it tagged it into; and its rejections."""
        claims: list[dict[str, DelegationSpec]] = []
        rejections: list[dict[str, str]] = []
        ids: list[str] = []
        claim_tags: list[dict[str, str]] = []
        for p in self.partitioners:
            trial = copy.deepcopy(ep)
            try:
                result = p.partition(trial)
            except PartitionError:
                raise
            except Exception as exc:
                raise PartitionError(f"{type(p).__name__}.partition raised {type(exc).__name__}: {exc}") from exc
            claimed: dict[str, DelegationSpec] = {}
            tags: dict[str, str] = {}
            claim_tags.append(tags)
            for node in result.tagged_exported_program.graph.nodes:
                tag = node.meta.get(DELEGATION_TAG)
                if tag is not None and node.op == "call_function":
                    if tag not in result.partition_tags:
                        raise PartitionError(f"{type(p).__name__} tagged {node.name!r} with unknown tag {tag!r}")
                    claimed[node.name] = result.partition_tags[tag]
                    tags[node.name] = tag
            specs = {s.backend_id for s in result.partition_tags.values()}
            backend = next(iter(specs)) if len(specs) == 1 else getattr(p, "backend_id", type(p).__name__)
            ids.append(str(backend))
            claims.append(claimed)
            rejections.append(dict(getattr(p, "rejections", {}) or {}))
        self._check_conflicts(ids, claims)
        self.backend_ids = ids
        self._claim_tags = claim_tags
        return claims, rejections

    def _check_conflicts(self, ids: list[str], claims: list[dict[str, DelegationSpec]]) -> None:
        """Two partitioners of the same backend claiming a node with different compile specs is ambiguous."""
        for i in range(len(ids)):
            for j in range(i + 1, len(ids)):
                if ids[i] != ids[j]:
                    continue
                for name, spec in claims[i].items():
                    other = claims[j].get(name)
                    if other is not None and _spec_key(other) != _spec_key(spec):
                        raise PartitionError(
                            f"JointPartitioner: partitioners {i} and {j} both target {ids[i]!r} and claim node "
                            f"{name!r} with conflicting compile specs ({[c.key for c in spec.compile_specs]} vs "
                            f"{[c.key for c in other.compile_specs]}); give each backend once, with one set of "
                            "compile options")

    # -- grouping -------------------------------------------------------------------------------------------
    @staticmethod
    def _group(nodes: list[Node], owner: dict[Node, tuple[int, object]]) -> list[tuple[tuple[int, object], list[Node]]]:
        """Cycle-free connected partitions of the owned nodes, all backends in one quotient graph."""
        q = _QuotientGraph()
        key_of: dict[int, tuple[int, object]] = {}
        for node in nodes:
            if node.op != "call_function":
                continue
            inputs = node.all_input_nodes
            if node.target is operator.getitem and inputs:
                producer = q.cluster_of(inputs[0])
                if producer is not None and q.clusters[producer].supported:
                    q.attach(node, producer)
                else:
                    q.add(node, False, inputs)
                continue
            key = owner.get(node)
            if key is None:
                q.add(node, False, inputs)
                continue
            cid = q.add(node, True, inputs)
            key_of[cid] = key
            seen: set[int] = set()
            for inp in inputs:
                pid = q.cluster_of(inp)
                if pid is None or pid in seen or pid == cid or not q.clusters[pid].supported:
                    continue
                seen.add(pid)
                if key_of.get(pid) != key:
                    continue
                merged = q.try_merge(pid, cid)
                if merged is not None:
                    cid = merged
                    key_of[cid] = key
        index = {n: i for i, n in enumerate(nodes)}
        groups = [(key_of[cid], sorted(c.members, key=index.__getitem__))
                  for cid, c in q.clusters.items() if c.supported]
        groups.sort(key=lambda g: index[g[1][0]])
        return groups

    # -- partition ------------------------------------------------------------------------------------------
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        claims, rejections = self._claims(exported_program)
        graph = exported_program.graph
        nodes = list(graph.nodes)
        for n in nodes:
            n.meta.pop(DELEGATION_TAG, None)
        compute = [n for n in nodes if _is_compute(n)]
        excluded: dict[Node, dict[int, str]] = {n: {} for n in compute}

        def owner_of(n: Node) -> int | None:
            for i, claimed in enumerate(claims):
                if n.name in claimed and i not in excluded[n]:
                    return i
            return None

        for _ in range(len(compute) * len(claims) + 1):
            owner: dict[Node, tuple[int, object]] = {}
            for n in compute:
                i = owner_of(n)
                if i is not None:
                    owner[n] = (i, _spec_key(claims[i][n.name]))
            groups = self._group(nodes, owner)
            if not self._apply_rules(groups, owner, claims, excluded):
                break
        return self._finish(exported_program, nodes, groups, claims, rejections, excluded)

    def _apply_rules(self, groups: list[tuple[tuple[int, object], list[Node]]], owner: dict[Node, tuple[int, object]],
                     claims: list[dict[str, DelegationSpec]], excluded: dict[Node, dict[int, str]]) -> bool:
        """Apply the island, size and count rules once; ``True`` if some node lost its owner."""
        changed = False
        ids = self.backend_ids
        for n, (i, _) in owner.items():
            if _is_qdq(n):
                for partner in self._split_partners(n, i, owner):
                    excluded[n][i] = (f"its quantize/dequantize partner {partner.name} went to "
                                      f"{ids[owner[partner][0]] if partner in owner else 'the CPU'}; {ids[i]} "
                                      "claimed them as a pair")
                    changed = True
        if changed:
            return True
        for (i, _), members in groups:
            ops = [n for n in members if _is_compute(n)]
            if not 0 < len(ops) <= self.boundary_cost:
                continue
            inside = set(members)
            neighbours = {m for n in members for m in (*n.all_input_nodes, *n.users)
                          if m not in inside and _is_compute(m)}
            owners = {owner[m][0] if m in owner else None for m in neighbours}
            if len(owners) != 1 or None in owners:
                continue
            j = next(iter(owners))
            if j != i and all(n.name in claims[j] for n in ops):
                for n in ops:
                    excluded[n][i] = (f"a {len(ops)}-op island between {ids[j]} partitions is not split off "
                                      f"(boundary_cost={self.boundary_cost}); {ids[j]} takes it")
                    for k in range(len(claims)):  # only j (and lower) may take it now
                        if k != j and k < j and k not in excluded[n]:
                            excluded[n][k] = excluded[n][i]
                changed = True
        if changed:
            return True
        for (i, _), members in groups:
            ops = [n for n in members if _is_compute(n)]
            if ops and all(_is_qdq(n) for n in ops):
                for n in ops:
                    excluded[n][i] = "a partition of only quantize/dequantize ops is not worth a delegate"
                changed = True
            elif len(ops) < self.min_partition_ops:
                for n in ops:
                    excluded[n][i] = (f"partition of {len(ops)} op(s) is smaller than "
                                      f"min_partition_ops={self.min_partition_ops}")
                changed = True
        if changed or self.max_partitions is None:
            return changed
        by_backend: dict[int, list[list[Node]]] = {}
        for (i, _), members in groups:
            by_backend.setdefault(i, []).append([n for n in members if _is_compute(n)])
        for i, parts in by_backend.items():
            if len(parts) <= self.max_partitions:
                continue
            parts.sort(key=len, reverse=True)
            for ops in parts[self.max_partitions:]:
                for n in ops:
                    excluded[n][i] = (f"{ids[i]} keeps only its {self.max_partitions} largest partition(s) "
                                      f"(max_partitions={self.max_partitions})")
                changed = True
        return changed

    def _split_partners(self, n: Node, i: int, owner: dict[Node, tuple[int, object]]) -> list[Node]:
        """The q/dq partners of ``n`` that backend ``i`` claimed in the same partition as ``n`` but does not own."""
        tags = self._claim_tags[i]
        partners = [u for u in n.users if _is_qdq(u)]
        partners += [a for a in n.all_input_nodes if _is_qdq(a)]
        return [m for m in partners
                if tags.get(m.name) == tags.get(n.name) and (m not in owner or owner[m][0] != i)]

    def _finish(self, ep: ExportedProgram, nodes: list[Node], groups: list[tuple[tuple[int, object], list[Node]]],
                claims: list[dict[str, DelegationSpec]], rejections: list[dict[str, str]],
                excluded: dict[Node, dict[int, str]]) -> PartitionResult:
        ids = self.backend_ids
        tags: dict[str, DelegationSpec] = {}
        node_tag: dict[Node, str] = {}
        owner_id: dict[Node, int] = {}
        for k, ((i, _), members) in enumerate(groups):
            tag = f"tag{k}"
            first = next(n for n in members if _is_compute(n))
            spec = claims[i][first.name]
            tags[tag] = DelegationSpec(spec.backend_id, list(spec.compile_specs))
            for n in members:
                n.meta[DELEGATION_TAG] = tag
                node_tag[n] = tag
                owner_id[n] = i
        constants = constant_placeholder_names(ep)
        for node in nodes:
            if (node.op == "placeholder" and node.name in constants) or node.op == "get_attr":
                user_tags = {node_tag.get(u) for u in node.users}
                if len(user_tags) == 1 and None not in user_tags:
                    node.meta[DELEGATION_TAG] = next(iter(user_tags))
        self.ownership = {}
        for n in nodes:
            if not _is_compute(n):
                continue
            i = owner_id.get(n)
            report = NodeOwnership(n.name, _op_name(n), ids[i] if i is not None else None, node_tag.get(n))
            for k, claimed in enumerate(claims):
                if k == i:
                    continue
                if n.name not in claimed:
                    why = rejections[k].get(n.name, f"not claimed by {type(self.partitioners[k]).__name__}")
                elif k in excluded[n]:
                    why = excluded[n][k]
                else:
                    why = f"owned by higher-priority {ids[i]}" if i is not None and i < k else "not chosen"
                report.not_taken.setdefault(ids[k], why)
            self.ownership[n.name] = report
        counts = {b: sum(1 for s in tags.values() if s.backend_id == b) for b in dict.fromkeys(ids)}
        log.info("joint partitioning: %s", ", ".join(f"{b}: {c} partition(s)" for b, c in counts.items()))
        result = PartitionResult(tagged_exported_program=ep, partition_tags=tags)
        if self.on_partitioned is not None:
            self.on_partitioned(result)
        return result

    # -- decomposition --------------------------------------------------------------------------------------
    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[Node], bool] | None]:
        """The union of the backends' requests, with a filter keeping a node whole only for its owner."""
        requests = []
        for p in self.partitioners:
            ops, node_filter = p.ops_to_not_decompose(ep)
            requests.append((list(ops), node_filter))
        listed = list(dict.fromkeys(op for ops, _ in requests for op in ops))
        self.decompositions = {}
        if not listed:
            return [], None
        decomposed_takers = self._decomposed_claims(ep)

        def keep(node: Node) -> bool:
            origin = origin_name(node)
            for i, (ops, node_filter) in enumerate(requests):
                name = type(self.partitioners[i]).__name__
                if node.target in ops and (node_filter is None or node_filter(node)):
                    self.decompositions[origin] = f"kept whole: {name} asks for it and comes first"
                    return True
                if origin in decomposed_takers[i]:
                    self.decompositions[origin] = f"decomposed: {name} comes first and takes the decomposed form"
                    return False
            self.decompositions[origin] = "decomposed: no backend asked to keep it"
            return False

        return listed, keep

    def _decomposed_claims(self, ep: ExportedProgram) -> list[set[str]]:
        """Per partitioner, the exported nodes all of whose decomposed pieces it would take."""
        from edgeport.aot.edge import _decompose, _decomposition_table
        from edgeport.aot.passes.edge_passes import normalize_edge_ops

        decomposed = _decompose("<trial>", ep, _decomposition_table([]))
        normalize_edge_ops(decomposed.graph_module)
        pieces: dict[str, list[str]] = {}
        for n in decomposed.graph.nodes:
            if _is_compute(n):
                pieces.setdefault(origin_name(n), []).append(n.name)
        claims, _ = self._claims(decomposed)
        return [{o for o, names in pieces.items() if all(x in claimed for x in names)} for claimed in claims]
