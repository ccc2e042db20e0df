"""Test-compiling candidate partitions, so a partition a vendor compiler refuses shrinks instead of failing the
lowering (for backend partitioners; the Arm and QNN partitioners use it).

After tagging, a partitioner calls :func:`find_refusals` with a ``try_compile(nodes)`` of its own (lower the nodes
as a sub-program and run the vendor compiler on it, in its isolated worker). For a refused partition, the nodes to
move to the CPU are the ones the compiler's message names (``named(message, members)``); otherwise a bisection
over the partition's compute nodes in graph order finds the first node whose prefix no longer compiles. The
partitioner bans those nodes -- with :meth:`Refusal.reason`, the compiler's words, as their rejection reason --
and partitions again, until every partition compiles.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from edgeport.aot.capability_partitioner import op_name

__all__ = ["Refusal", "TrialFailure", "find_refusals", "named_in_message", "ops_summary"]

#: how much of a compiler's message goes into a node's rejection reason
MESSAGE_CHARS = 600
_QDQ = ("quantized_decomposed.quantize", "quantized_decomposed.dequantize")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: what ``try_compile`` returns for a refused node set: (compiler, its message, the signal if it crashed)
TrialFailure = tuple[str, str, str | None]


@dataclass
class Refusal:
    """One refused candidate partition: who refused it, their words, and the nodes moved to the CPU for it."""

    partition: str
    ops: str
    compiler: str
    message: str
    signal: str | None = None
    culprits: list[str] = field(default_factory=list)
    how: str = ""  # "named by the compiler" or "found by bisection, N test compilations"

    def reason(self, node: str) -> str:
        """The rejection reason of culprit ``node``."""
        crash = f" (crashed: {self.signal})" if self.signal else ""
        words = self.message if len(self.message) <= MESSAGE_CHARS else self.message[:MESSAGE_CHARS] + " ..."
        return (f"{self.compiler} refused partition {self.partition} ({self.ops}){crash}; {node} moved to the CPU "
                f"({self.how}). {self.compiler} said: {words}")


def ops_summary(nodes: Sequence[torch.fx.Node]) -> str:
    """``"N ops: aten.x xK, ..."``: the op counts of a partition, most frequent first."""
    counts: dict[str, int] = {}
    for n in nodes:
        if n.op == "call_function":
            counts[op_name(n.target)] = counts.get(op_name(n.target), 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:8]
    more = ", ..." if len(counts) > 8 else ""
    return f"{sum(counts.values())} ops: " + ", ".join(f"{k} x{v}" if v > 1 else k for k, v in top) + more


def _key(nodes: Sequence[torch.fx.Node]) -> frozenset[str]:
    return frozenset(n.name for n in nodes if n.op == "call_function" and n.target.__name__ != "getitem")


def named_in_message(message: str, members: Sequence[torch.fx.Node]) -> list[torch.fx.Node]:
    """Partition nodes a message names: quoted, or as ``name:`` / ``name (op)`` (how lowerings name a node)."""
    by_name = {n.name: n for n in members}
    found = []
    for m in _WORD.finditer(message):
        node = by_name.get(m.group())
        if node is None or node in found:
            continue
        before, after = message[max(0, m.start() - 1):m.start()], message[m.end():m.end() + 1]
        quoted = before and before in "'\"`" and after == before
        if quoted or after == ":" or message[m.end():m.end() + 2] == " (":
            found.append(node)
    return found


def _bisect(members: list[torch.fx.Node], subset: Callable[[list[torch.fx.Node]], list[torch.fx.Node]],
            compiles: Callable[[list[torch.fx.Node]], bool]) -> tuple[torch.fx.Node | None, int]:
    """The node whose addition makes the prefix stop compiling (assuming a failing prefix's extensions fail)."""
    lo, hi, tries = 0, len(members), 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        tries += 1
        if compiles(subset(members[mid:])):
            lo = mid
        else:
            hi = mid
    return (members[hi - 1] if hi >= 1 else None), tries


def _fused_group(node: torch.fx.Node, compute: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """``node`` and the compute nodes joined to it without a quantize between (a convolution and its fused
    clamp): quantized-island rules delegate them together, so they go to the CPU together."""
    inside = set(compute)
    group, todo = {node}, [node]
    while todo:
        n = todo.pop()
        for m in (*n.all_input_nodes, *n.users):
            if m in inside and m not in group:
                group.add(m)
                todo.append(m)
    return [n for n in compute if n in group]


def find_refusals(partitions: dict[str, list[torch.fx.Node]],
                  try_compile: Callable[[list[torch.fx.Node]], TrialFailure | None],
                  subset: Callable[[list[torch.fx.Node], list[torch.fx.Node]], list[torch.fx.Node]],
                  known_good: set[frozenset[str]], *,
                  named: Callable[[str, Sequence[torch.fx.Node]], list[torch.fx.Node]] = named_in_message,
                  fused_groups: bool = False) -> list[Refusal]:
    """Test-compile each partition; for each refused one, a :class:`Refusal` naming nodes to move to the CPU.

    ``try_compile(nodes)``: ``None`` when the nodes (the partition's, graph order) compile, else a
    :data:`TrialFailure`. ``subset(members, excluded)`` gives the part of partition ``members`` that stays a valid
    partition once ``excluded`` go to the CPU (a backend's quantized-island rules; else ``members`` minus
    ``excluded``); ``known_good`` caches node sets that compiled. ``fused_groups``: in a quantized partition, a
    culprit moves with the compute nodes fused to it.
    """
    refusals = []
    for tag, nodes in partitions.items():
        members = [n for n in nodes if n.op == "call_function" and n.target.__name__ != "getitem"]
        key = _key(members)
        if not members or key in known_good:
            continue
        failure = try_compile(nodes)
        if failure is None:
            known_good.add(key)
            continue
        compiler, message, signal = failure
        refusal = Refusal(tag, ops_summary(members), compiler, message.strip(), signal)
        culprits = named(message, members)
        if culprits:
            refusal.culprits, refusal.how = [n.name for n in culprits], f"named by {compiler}"
        else:
            def compiles(part: list[torch.fx.Node]) -> bool:
                ok = try_compile(part) is None
                if ok:
                    known_good.add(_key(part))
                return ok

            order = [n for n in members if not op_name(n.target).startswith(_QDQ)] or members
            culprit, tries = _bisect(order, lambda excluded, m=members: subset(m, excluded), compiles)
            integer = fused_groups and len(order) < len(members)
            chosen = members if culprit is None else _fused_group(culprit, order) if integer else [culprit]
            refusal.culprits = [n.name for n in chosen]
            refusal.how = f"found by bisection, {tries + 1} test compilations"
        refusals.append(refusal)
    return refusals
