"""Test-compiling candidate partitions, so a partition the compiler refuses shrinks instead of failing the lowering.

The Arm partitioners call :func:`find_refusals` after tagging: each partition is lowered to TOSA and, for
``EthosUBackend``, compiled by Vela in the isolated worker (:func:`~edgeport_arm.vela.compile_tosa_isolated`,
whose cache makes the real ``preprocess`` of an accepted partition free). For a refused partition the nodes to
move to the CPU are the ones the compiler's message names (our TOSA lowering names the node it cannot lower);
otherwise a bisection over the partition's compute nodes in graph order finds the first node whose prefix no
longer compiles (quantize / dequantize nodes follow their compute nodes by the quantized-island rules). The partitioner bans those nodes (with the compiler's words as the reason) and partitions again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram

from edgeport.aot.capability_partitioner import op_name
from edgeport.aot.to_backend import extract_subprogram
from edgeport_arm.options import EthosUCompileSpec, TosaCompileSpec

__all__ = ["Refusal", "find_refusals", "try_compile"]

#: how much of a compiler's message goes into a node's rejection reason
MESSAGE_CHARS = 600
_QDQ = ("quantized_decomposed.quantize", "quantized_decomposed.dequantize")  # placed by the island rules
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Refusal:
    """One refused candidate partition: who refused it, their words, and the nodes moved to the CPU for it."""

    partition: str
    ops: str
    compiler: str
    message: str
    signal: str | None = None
    culprits: list[str] = field(default_factory=list)
    how: str = ""  # "named by the compiler" or "bisection (N test compilations)"

    def reason(self, node: str) -> str:
        """The rejection reason of culprit ``node``."""
        crash = f" (crashed: {self.signal})" if self.signal else ""
        words = self.message if len(self.message) <= MESSAGE_CHARS else self.message[:MESSAGE_CHARS] + " ..."
        return (f"{self.compiler} refused partition {self.partition} ({self.ops}){crash}; {node} moved to the CPU "
                f"({self.how}). {self.compiler} said: {words}")


def _ops(nodes: Sequence[torch.fx.Node]) -> str:
    counts: dict[str, int] = {}
    for n in nodes:
        if n.op == "call_function":
            counts[op_name(n.target)] = counts.get(op_name(n.target), 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:8]
    more = ", ..." if len(counts) > 8 else ""
    return f"{sum(counts.values())} ops: " + ", ".join(f"{k} x{v}" if v > 1 else k for k, v in top) + more


def try_compile(ep: ExportedProgram, nodes: Sequence[torch.fx.Node],
                spec: TosaCompileSpec | EthosUCompileSpec) -> tuple[str, str, str | None] | None:
    """``None`` if ``nodes`` (call_function nodes of ``ep``) lower (and, for Ethos-U, compile with Vela); else
    ``(compiler, message, signal)``. ``ValueError`` for options Vela does not accept propagates."""
    from edgeport_arm.preprocess import lower_to_tosa

    members = [n for n in nodes if n.op == "call_function"]
    if not members:
        return None
    try:
        sub = extract_subprogram(ep, members)
        tosa, summary = lower_to_tosa(sub, spec.specification)
    except Exception as exc:  # noqa: BLE001 - any failure of our own lowering refuses the candidate, visibly
        return "the TOSA lowering", f"{type(exc).__name__}: {exc}", None
    if not isinstance(spec, EthosUCompileSpec):
        return None
    from edgeport_arm.ethos_u import vela_compile
    from edgeport_arm.vela import VelaCrashed, VelaError

    try:
        vela_compile(tosa, summary, sub, spec)
    except VelaCrashed as exc:
        return "Vela", str(exc), exc.signal
    except VelaError as exc:
        return "Vela", str(exc), None
    return None


def _key(nodes: Sequence[torch.fx.Node]) -> frozenset[str]:
    return frozenset(n.name for n in nodes if n.op == "call_function" and n.target.__name__ != "getitem")


def _named(message: str, members: Sequence[torch.fx.Node]) -> list[torch.fx.Node]:
    """Partition nodes the message names: quoted, or as ``name:`` / ``name (op)`` (how the TOSA lowering names
    the node it cannot lower)."""
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
    clamp): the island rules delegate them together, so they go to the CPU together."""
    inside = set(compute)
    group, todo = {node}, [node]
    while todo:
        n = todo.pop()
        for m in (*n.all_input_nodes, *n.users):
            if m in inside and m not in group:
                group.add(m)
                todo.append(m)
    return [n for n in compute if n in group]


def find_refusals(ep: ExportedProgram, partitions: dict[str, list[torch.fx.Node]],
                  spec: TosaCompileSpec | EthosUCompileSpec,
                  subset: Callable[[list[torch.fx.Node], list[torch.fx.Node]], list[torch.fx.Node]],
                  known_good: set[frozenset[str]]) -> list[Refusal]:
    """Test-compile each partition; for each refused one, a :class:`Refusal` naming nodes to move to the CPU.

    ``subset(members, excluded)`` gives the part of partition ``members`` that stays a valid partition once
    ``excluded`` go to the CPU (the quantized-island rules); ``known_good`` caches node sets that compiled.
    """
    refusals = []
    for tag, nodes in partitions.items():
        members = [n for n in nodes if n.op == "call_function" and n.target.__name__ != "getitem"]
        key = _key(members)
        if not members or key in known_good:
            continue
        failure = try_compile(ep, nodes, spec)
        if failure is None:
            known_good.add(key)
            continue
        compiler, message, signal = failure
        refusal = Refusal(tag, _ops(members), compiler, message.strip(), signal)
        named = _named(message, members)
        if named:
            refusal.culprits, refusal.how = [n.name for n in named], f"named by {compiler}"
        else:
            def compiles(part: list[torch.fx.Node]) -> bool:
                ok = try_compile(ep, part, spec) is None
                if ok:
                    known_good.add(_key(part))
                return ok

            order = [n for n in members if not op_name(n.target).startswith(_QDQ)] or members
            culprit, tries = _bisect(order, lambda excluded, m=members: subset(m, excluded), compiles)
            integer = len(order) < len(members)  # a quantized partition: fused compute groups move as one
            chosen = members if culprit is None else _fused_group(culprit, order) if integer else [culprit]
            refusal.culprits = [n.name for n in chosen]
            refusal.how = f"found by bisection, {tries + 1} test compilations"
        refusals.append(refusal)
    return refusals
