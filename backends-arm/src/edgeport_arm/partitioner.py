"""``TOSAPartitioner`` / ``EthosUPartitioner``: the core capability partitioner driven by the Arm table.

Integer profiles take *quantized islands* only: a compute node is delegated when each tensor it reads comes from
a delegated dequantize (or a constant, or another delegated compute node) and each of its users is delegated
too; a dequantize is delegated when all its users are, a quantize when what it quantizes is. So every delegate
takes and returns int8 (int16 for a16w8 activations, on ops with an int16 lowering) -- the quantize of a model
input and the dequantize of an output stay on the CPU, as in ExecuTorch's Arm flow -- and no float tensor
crosses into an integer graph. ``EthosUPartitioner`` also applies
what Vela places on the NPU (:func:`~edgeport_arm.capabilities.ethos_u_problem`) and, by default, refuses a model
that would leave float compute on the CPU (``cpu_fallback=True`` allows it). Every rejected node's reason is in
:attr:`rejections` after :meth:`partition`.

With ``trial_compile=True`` (the default) each partition is test-compiled before it is returned -- lowered to
TOSA and, for Ethos-U, compiled by Vela in an isolated worker process (:mod:`edgeport_arm.trial`). A partition
the compiler refuses (or crashes on) shrinks: the node the compiler names, or the one bisection finds, goes to
the CPU with the compiler's words as its rejection reason (so the lowering report shows them and
``require_full_delegation=True`` raises naming them), and the graph is partitioned again. :attr:`refusals`
lists what was refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.export import ExportedProgram

from edgeport.aot.capability_partitioner import (
    CapabilityBasedPartitioner,
    NodeFilter,
    constant_placeholder_names,
    op_name,
)
from edgeport.aot.partitioner import PartitionResult
from edgeport.errors import LoweringError
from edgeport_arm.capabilities import (
    ALL_CAPABILITIES,
    DEQUANTIZE,
    DEQUANTIZE_PER_CHANNEL,
    INT8_CONSTRAINTS,
    INT8_TABLES,
    INT8_UNSUPPORTED,
    INT16_SUPPORTED,
    QUANTIZE,
    ethos_u_problem,
    reads_or_writes_int16,
)
from edgeport_arm.options import ETHOSU_BACKEND_ID, TOSA_BACKEND_ID, EthosUCompileSpec, TosaCompileSpec
from edgeport_arm.preprocess.constants import constant_nodes
from edgeport_arm.trial import Refusal, find_refusals

_DQS = (DEQUANTIZE, DEQUANTIZE_PER_CHANNEL)
_MAX_TRIAL_ROUNDS = 64
_CONSTANT_ARGS = {"aten.convolution.default": (1, 2), "aten.linear.default": (1, 2),
                  "aten.native_layer_norm.default": (2, 3),
                  "aten._native_batch_norm_legit_no_training.default": (1, 2, 3, 4)}


def arg_or_none(node: torch.fx.Node, index: int) -> object:
    return node.args[index] if len(node.args) > index else None


class _ArmPartitioner(CapabilityBasedPartitioner):
    def __init__(self, backend_id: str, compile_spec: TosaCompileSpec | EthosUCompileSpec, *, ethos_u: bool,
                 cpu_fallback: bool, min_partition_size: int, node_filter: NodeFilter | None,
                 trial_compile: bool = True) -> None:
        super().__init__(backend_id, ALL_CAPABILITIES, compile_spec.to_compile_specs(),
                         min_partition_size=min_partition_size, node_filter=node_filter)
        self.compile_spec = compile_spec
        self.integer = compile_spec.specification.is_int and not compile_spec.specification.is_fp
        self.ethos_u = ethos_u
        self.cpu_fallback = cpu_fallback
        self.trial_compile = trial_compile
        #: after :meth:`partition`: each candidate partition the compiler refused, and the nodes moved for it
        self.refusals: list[Refusal] = []
        self._user_filter = node_filter
        self._constants: set[str] = set()
        self._verdicts: dict[torch.fx.Node, str | None] = {}
        self._folded: set[torch.fx.Node] = set()

    # -- per-node rules -----------------------------------------------------------------------------------------
    def _is_constant(self, a: Any) -> bool:
        return isinstance(a, torch.fx.Node) and (a.op == "get_attr" or (
            a.op == "placeholder" and a.name in self._constants))

    def _own_checks(self, node: torch.fx.Node) -> str | None:
        name = op_name(node.target)
        quant = name in (QUANTIZE, *_DQS)
        if not self.integer and quant:
            return f"{name}: a quantized graph needs an integer profile (TosaCompileSpec('TOSA-1.0+INT'))"
        if self.integer and name in INT8_UNSUPPORTED:
            return f"{name}: {INT8_UNSUPPORTED[name]}"
        if self.integer and name in INT8_CONSTRAINTS and (why := INT8_CONSTRAINTS[name](node)):
            return f"{name}: {why}"
        if self.integer and name in INT8_TABLES and not (
                len(node.users) == 1 and op_name(next(iter(node.users)).target) == QUANTIZE):
            return (f"{name}: an int8 lookup table needs a quantize as its only user (its output parameters); "
                    "this one's result stays in float")
        if self.integer and reads_or_writes_int16(node):
            if "int16" not in self.compile_spec.specification.extensions:
                return f"{name}: int16 activations need the int16 extension ('TOSA-1.0+INT+int16')"
            if not quant and name not in INT16_SUPPORTED:
                return f"{name}: no int16 (a16w8) lowering yet"
        for i in _CONSTANT_ARGS.get(name, ()):
            a = node.args[i] if i < len(node.args) else None
            if a is not None and not self._is_constant(a) and not (
                    isinstance(a, torch.fx.Node) and op_name(a.target) in _DQS
                    and all(self._is_constant(x) for x in a.all_input_nodes)):
                return f"{name}: argument {i} ({getattr(a, 'name', a)}) is not a constant (weights must be static)"
        if self.ethos_u:
            why = ethos_u_problem(node, name, getattr(self.compile_spec, "target", "ethos-u55-128"))
            if why:
                return f"{name}: {why}"
        if self._user_filter is not None:
            verdict = self._user_filter(node)
            if verdict is False or isinstance(verdict, str):
                return verdict or "rejected by node_filter"
        return None

    def check_node(self, node: torch.fx.Node) -> str | None:
        if node in self._folded:  # computed from constants only: folded by the lowering, whatever its op
            verdict = self.node_filter(node) if self.node_filter is not None else None
            return verdict if isinstance(verdict, str) else ("rejected by node_filter" if verdict is False else None)
        return super().check_node(node)

    def _foldable(self, graph: torch.fx.Graph) -> set[torch.fx.Node]:
        """Float graphs: the nodes computed from constants only whose users are all delegable (see
        :mod:`edgeport_arm.preprocess.constants`)."""
        derived = constant_nodes(graph, self._is_constant)
        members = set(derived)
        self.node_filter, self._folded = self._own_checks, set()
        accepted: set[torch.fx.Node] = set()
        cache: dict[torch.fx.Node, bool] = {}

        def user_ok(u: torch.fx.Node) -> bool:
            if u.op != "call_function":
                return False  # a graph output: a delegate would return a constant
            if u in members:
                return u in accepted
            if u.target.__name__ == "getitem":
                return all(user_ok(x) for x in u.users)
            if u not in cache:
                cache[u] = super(_ArmPartitioner, self).check_node(u) is None
            return cache[u]

        try:
            for node in reversed(derived):
                if node.users and all(user_ok(u) for u in node.users):
                    accepted.add(node)
        finally:
            self.node_filter = self._user_filter
        return accepted

    def _islands(self, graph: torch.fx.Graph, banned: dict[torch.fx.Node, str]) -> dict[torch.fx.Node, str | None]:
        """Fixpoint of the quantized-island rules over the nodes the table accepts (minus ``banned``)."""
        self.node_filter = self._own_checks
        verdict: dict[torch.fx.Node, str | None] = {}
        for node in graph.nodes:
            if node.op == "call_function" and node.target.__name__ != "getitem":
                verdict[node] = banned.get(node) or self.check_node(node)
        self.node_filter = self._user_filter
        taken = {n for n, why in verdict.items() if why is None}

        def ok_input(node: torch.fx.Node, a: torch.fx.Node) -> bool:
            if self._is_constant(a):  # a float constant: only a bias (quantized to int32 by the lowering)
                return op_name(node.target) in _CONSTANT_ARGS and a is arg_or_none(node, 2)
            return a in taken or (a.op == "call_function" and a.target.__name__ ==
                                                          "getitem" and a.args[0] in taken)

        changed = True
        while changed:
            changed = False
            for node in list(taken):
                name = op_name(node.target)
                why = None
                if name == QUANTIZE:
                    src = node.args[0]
                    if not ok_input(node, src):
                        why = f"quantizes {src.name}, which is not delegated (a float input: stays on the CPU)"
                elif name in _DQS:
                    outside = [u.name for u in node.users if u not in taken]
                    if outside:
                        why = f"its float result is used outside the delegate by {outside}"
                else:
                    bad_in = [a.name for a in node.all_input_nodes if not ok_input(node, a)]
                    bad_out = [u.name for u in node.users if u not in taken and not (
                        u.op == "call_function" and u.target.__name__ == "getitem"
                        and all(uu in taken for uu in u.users))]
                    if bad_in:
                        why = f"reads float tensors {bad_in} that are not dequantized inside the delegate"
                    elif bad_out:
                        why = f"its float result goes to {bad_out} outside the delegate (not quantized after it)"
                if why is not None:
                    taken.discard(node)
                    verdict[node] = f"{name}: {why}"
                    changed = True
        return verdict

    # -- partitioning ----------------------------------------------------------------------------------------
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        self._constants = constant_placeholder_names(exported_program)
        self.refusals = []
        self._folded = set() if self.integer else self._foldable(exported_program.graph)
        banned: dict[torch.fx.Node, str] = {}
        known_good: set[frozenset[str]] = set()
        by_name = {n.name: n for n in exported_program.graph.nodes}
        for rnd in range(_MAX_TRIAL_ROUNDS + 1):
            result = self._partition_banning(exported_program, banned)
            if not self.trial_compile or rnd == _MAX_TRIAL_ROUNDS:
                break
            groups: dict[str, list[torch.fx.Node]] = {}
            for node in exported_program.graph.nodes:
                if node.meta.get("delegation_tag") is not None:
                    groups.setdefault(node.meta["delegation_tag"], []).append(node)
            refusals = find_refusals(exported_program, groups, self.compile_spec,
                                     lambda members, excluded, b=banned: self._subset(
                                         exported_program, members, excluded, b), known_good)
            if not refusals:
                break
            for refusal in refusals:
                if rnd == _MAX_TRIAL_ROUNDS - 1:  # still refusing: give up on the whole partition
                    refusal.culprits = [n.name for n in groups[refusal.partition]
                                        if n.op == "call_function" and n.target.__name__ != "getitem"]
                    refusal.how = f"the whole partition: still refused after {_MAX_TRIAL_ROUNDS} rounds"
                self.refusals.append(refusal)
                for name in refusal.culprits:
                    node = by_name[name]
                    banned[node] = f"{op_name(node.target)}: {refusal.reason(name)}"
        if self.integer and not self.cpu_fallback:
            self._refuse_float_leftovers(exported_program)
        return result

    def _partition_banning(self, exported_program: ExportedProgram, banned: dict[torch.fx.Node, str]
                           ) -> PartitionResult:
        """Tag the graph with ``banned`` nodes kept on the CPU (and the island rules applied around them)."""
        banned = dict(banned)
        try:
            while True:
                if self.integer:
                    verdict = self._islands(exported_program.graph, banned)
                    self.node_filter = lambda n, v=verdict: v.get(n) or True
                else:
                    self.node_filter = lambda n, b=banned: b.get(n) or self._own_checks(n)
                result = super().partition(exported_program)
                split = self._split_dequantizes(exported_program.graph) if self.integer else {}
                if not split:
                    break
                banned.update(split)  # a float tensor would cross between two partitions: keep it on the CPU
        finally:
            self.node_filter = self._user_filter
        return result

    def _subset(self, ep: ExportedProgram, members: list[torch.fx.Node], excluded: list[torch.fx.Node],
                banned: dict[torch.fx.Node, str]) -> list[torch.fx.Node]:
        """The nodes of partition ``members`` still delegable (island rules) once ``excluded`` stay on the CPU."""
        out = set(excluded)
        if not self.integer:
            return [n for n in members if n not in out]
        verdict = self._islands(ep.graph, {**banned, **dict.fromkeys(out, "excluded")})
        keep = [n for n in members if n not in out and verdict.get(n, "") is None]
        kept = set(keep)
        return [n for n in members if n in kept or (n.target.__name__ == "getitem" and n.args[0] in kept)]

    @staticmethod
    def _split_dequantizes(graph: torch.fx.Graph) -> dict[torch.fx.Node, str]:
        """Delegated dequantizes whose users ended up in another partition (so their float result would cross)."""
        out = {}
        for node in graph.nodes:
            tag = node.meta.get("delegation_tag")
            if tag is None or node.op != "call_function" or op_name(node.target) not in _DQS:
                continue
            others = [u.name for u in node.users if u.meta.get("delegation_tag") != tag]
            if others:
                out[node] = (f"{op_name(node.target)}: its users {others} fall in another partition (a cycle through "
                             "CPU nodes keeps them apart), so its float result would cross partitions")
        return out

    def _refuse_float_leftovers(self, ep: ExportedProgram) -> None:
        left = []
        for node in ep.graph.nodes:
            if node.op != "call_function" or "delegation_tag" in node.meta or node.target.__name__ == "getitem":
                continue
            name = op_name(node.target)
            if name in (QUANTIZE, *_DQS):
                continue
            left.append(f"{node.name} ({name}): {self.rejections.get(node.name, 'not delegated')}")
        if left:
            raise LoweringError(
                f"{self.backend_id}: {len(left)} node(s) would run in float on the CPU, which an integer-only NPU "
                "target does not have:\n  " + "\n  ".join(left[:20]) +
                "\nQuantize the whole model (EthosUQuantizer), or pass cpu_fallback=True to run them on the CPU.")

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        """Keep ``linear``, ``hardswish``, ``gelu``, ``silu`` and ``max_pool2d`` whole: each is one TOSA pattern (or one int8
        TABLE); a ``max_pool2d`` kept whole has no int64 indices output."""
        aten = torch.ops.aten
        return [aten.linear.default, aten.hardswish.default, aten.gelu.default, aten.silu.default,
                aten.max_pool2d.default], None


class TOSAPartitioner(_ArmPartitioner):
    """Delegates what the Arm table supports to ``TOSABackend`` (ExecuTorch's name and arguments).

    ``compile_spec``: a :class:`TosaCompileSpec` (``"TOSA-1.0+INT"`` by default; ``"TOSA-1.0+FP"`` for float).
    ``trial_compile``: lower each partition to TOSA while partitioning and move what fails to the CPU.
    """

    def __init__(self, compile_spec: TosaCompileSpec | None = None, *, min_partition_size: int = 1,
                 node_filter: NodeFilter | None = None, cpu_fallback: bool = True, trial_compile: bool = True) -> None:
        spec = compile_spec if compile_spec is not None else TosaCompileSpec()
        if not isinstance(spec, TosaCompileSpec):
            raise TypeError(f"TOSAPartitioner takes a TosaCompileSpec, got {type(spec).__name__}")
        super().__init__(TOSA_BACKEND_ID, spec, ethos_u=False, cpu_fallback=cpu_fallback,
                         min_partition_size=min_partition_size, node_filter=node_filter, trial_compile=trial_compile)


class EthosUPartitioner(_ArmPartitioner):
    """Delegates what Vela puts on the Ethos-U NPU to ``EthosUBackend``.

    ``cpu_fallback=False`` (default) refuses a model that would leave float compute outside the delegate.
    ``trial_compile``: compile each partition with Vela (isolated) while partitioning; shrink refused ones.
    """

    def __init__(self, compile_spec: EthosUCompileSpec | None = None, *, min_partition_size: int = 1,
                 node_filter: NodeFilter | None = None, cpu_fallback: bool = False, trial_compile: bool = True) -> None:
        spec = compile_spec if compile_spec is not None else EthosUCompileSpec()
        if not isinstance(spec, EthosUCompileSpec):
            raise TypeError(f"EthosUPartitioner takes an EthosUCompileSpec, got {type(spec).__name__}")
        super().__init__(ETHOSU_BACKEND_ID, spec, ethos_u=True, cpu_fallback=cpu_fallback,
                         min_partition_size=min_partition_size, node_filter=node_filter, trial_compile=trial_compile)
