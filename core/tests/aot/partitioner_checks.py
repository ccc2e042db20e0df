"""Helpers of the capability partitioner tests: capability tables, export, graph snapshots and the invariants
every partitioning must keep."""

from __future__ import annotations

import operator
from collections import defaultdict

import torch
from torch.fx import Graph

from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner
from edgeport.aot.partitioner import DELEGATION_TAG
from edgeport.backend import CapabilityTable, OpCapability


def table(*ops: str, dtypes: tuple[str, ...] = ("float32",)) -> CapabilityTable:
    return CapabilityTable(tuple(OpCapability(op, dtypes) for op in ops))


def export(module: torch.nn.Module, *args: torch.Tensor):
    return torch.export.export(module, args).run_decompositions()


def snapshot(graph: Graph) -> list[tuple]:
    """Everything about the graph except meta."""
    out = []
    for n in graph.nodes:
        args = torch.fx.map_arg(n.args, lambda a: ("node", a.name))
        kwargs = torch.fx.map_arg(n.kwargs, lambda a: ("node", a.name))
        out.append((n.name, n.op, n.target, repr(args), repr(kwargs), n.type))
    return out


def assert_partition_invariants(g: Graph, p: CapabilityBasedPartitioner, min_size: int) -> None:
    """Tagged nodes are supported, partitions are connected, big enough, acyclic once contracted and numbered
    in graph order."""
    nodes = [n for n in g.nodes if n.op != "output"]
    tag = {n: n.meta.get(DELEGATION_TAG) for n in nodes}
    # every tagged compute node is supported, every untagged one has a reason
    for n in nodes:
        if n.op != "call_function":
            continue
        if tag[n] is not None:
            assert p.check_node(n) is None or n.target is operator.getitem, n
            assert n.name not in p.rejections
        else:
            assert p.rejections.get(n.name), n
    members = defaultdict(list)
    for n in nodes:
        if tag[n] is not None:
            members[tag[n]].append(n)
    # partitions respect the min size
    for t, ms in members.items():
        assert (
            sum(1 for n in ms if n.op == "call_function" and n.target is not operator.getitem) >= min_size
        ), t
    # every partition is weakly connected
    for t, ms in members.items():
        mset = set(ms)
        seen = {ms[0]}
        stack = [ms[0]]
        while stack:
            n = stack.pop()
            for m in list(n.all_input_nodes) + list(n.users):
                if m in mset and m not in seen:
                    seen.add(m)
                    stack.append(m)
        assert seen == mset, f"{t} is not connected"
    # contract each partition into one node: the quotient graph is acyclic (Kahn)
    key = {n: ("P", tag[n]) if tag[n] is not None else ("N", n.name) for n in nodes}
    succ = defaultdict(set)
    indeg = defaultdict(int)
    vertices = set(key.values())
    for n in nodes:
        for m in n.all_input_nodes:
            a, b = key[m], key[n]
            if a != b and b not in succ[a]:
                succ[a].add(b)
                indeg[b] += 1
    ready = [v for v in vertices if indeg[v] == 0]
    done = 0
    while ready:
        v = ready.pop()
        done += 1
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    assert done == len(vertices), "partitioning created a cycle"
    # tags are numbered in graph order of first node
    position = {n: i for i, n in enumerate(nodes)}
    firsts = sorted(members, key=lambda t: min(position[n] for n in members[t]))
    assert firsts == [f"tag{i}" for i in range(len(members))]
