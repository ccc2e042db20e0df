"""``to_edge``, ``to_edge_transform_and_lower`` and ``EdgeProgramManager`` (ExecuTorch's names and semantics)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch
from torch._ops import OpOverload
from torch.export import ExportedProgram
from torch.fx import traceback as fx_traceback

from edgeport.aot.config import EdgeCompileConfig, ExecutorchBackendConfig
from edgeport.aot.debug_handles import assign_debug_handles, handles_by_name, inherit_debug_handles
from edgeport.aot.delegate_op import is_call_delegate, lookup_lowered_module
from edgeport.aot.graph_utils import graph_modules
from edgeport.aot.partitioner import Partitioner
from edgeport.aot.passes.decompositions import edge_decompositions
from edgeport.aot.passes.edge_passes import normalize_edge_ops
from edgeport.aot.passes.graph_asserts import remove_graph_asserts
from edgeport.aot.to_backend import partition_and_lower
from edgeport.aot.transform import transform_program
from edgeport.aot.verifier import verify_edge_graph
from edgeport.errors import ExportError, PartitionError

PassType = Callable[[torch.fx.GraphModule], Any]
Programs = Union[ExportedProgram, Mapping[str, ExportedProgram]]


def _as_dict(programs: Programs) -> dict[str, ExportedProgram]:
    if isinstance(programs, ExportedProgram):
        return {"forward": programs}
    if isinstance(programs, Mapping):
        for name, ep in programs.items():
            if not isinstance(ep, ExportedProgram):
                raise ExportError(
                    f"method {name!r}: expected a torch.export.ExportedProgram, got {type(ep).__name__}; "
                    "export the model first with torch.export.export(model, example_args)"
                )
        return dict(programs)
    raise ExportError(
        f"expected an ExportedProgram or a dict of them, got {type(programs).__name__}; "
        "export the model first with torch.export.export(model, example_args)"
    )


def _attach_lowered_modules(gm: torch.fx.GraphModule) -> None:
    """Expose the lowered modules called by ``call_delegate`` nodes as ``gm.lowered_module_N`` attributes."""
    known = {getattr(m, "delegate_key", None) for _, m in gm.named_children()}
    index = sum(1 for name, _ in gm.named_children() if name.startswith("lowered_module_"))
    for node in gm.graph.nodes:
        if is_call_delegate(node) and node.args[0] not in known:
            setattr(gm, f"lowered_module_{index}", lookup_lowered_module(node.args[0]))
            known.add(node.args[0])
            index += 1


def _decomposition_table(
    keep: Collection[OpOverload], keep_marked: Collection[OpOverload] = (), table: Any = None
) -> Any:
    """torch's core-ATen table (or ``table``) without ``keep``; ops in ``keep_marked`` stay whole on marked nodes."""
    table = edge_decompositions() if table is None else table
    for op in keep:
        if op in table:
            table.pop(op)
    for op in keep_marked:
        if op in table:
            table[op] = _unless_marked(op, table[op])
    return table


_KEEP_WHOLE = "edgeport_keep_whole"
"""``node.meta`` key naming the op a node keeps whole; set only between the two decomposition passes."""


def _unless_marked(op: OpOverload, decomposition: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``op``'s decomposition so that it declines on nodes marked with ``_KEEP_WHOLE``.

    ``run_decompositions`` retraces the graph with node meta preserved, so the meta of the node being retraced
    is ``fx_traceback.get_current_meta()``; returning ``NotImplemented`` from a decomposition tells torch to
    keep the op. An op reached while decomposing some other node sees that node's meta and is decomposed.
    """

    def decompose(*args: Any, **kwargs: Any) -> Any:
        if fx_traceback.get_current_meta().get(_KEEP_WHOLE) is op:
            return NotImplemented
        return decomposition(*args, **kwargs)

    return decompose


def _decompose(name: str, ep: ExportedProgram, table: Any) -> ExportedProgram:
    try:
        program = ep.run_decompositions(table)
    except Exception as exc:  # torch raises many types here; name the method and the cause
        raise ExportError(f"method {name!r}: decomposition to core ATen failed: {type(exc).__name__}: {exc}") from exc
    remove_graph_asserts(program.graph_module, name)  # on the new program: the caller's is untouched
    return program


def _finish_edge_program(
    name: str, ep: ExportedProgram, config: EdgeCompileConfig, allowed: Sequence[OpOverload]
) -> ExportedProgram:
    normalize_edge_ops(ep.graph_module)
    _attach_lowered_modules(ep.graph_module)
    assign_debug_handles(ep.graph_module)
    if config._check_ir_validity:
        verify_edge_graph(ep.graph_module, method=name, allowed=[*allowed, *config._core_aten_ops_exception_list])
    return ep


def _to_edge_program(
    name: str, ep: ExportedProgram, config: EdgeCompileConfig, keep: Sequence[OpOverload]
) -> ExportedProgram:
    return _finish_edge_program(name, _decompose(name, ep, _decomposition_table(keep)), config, keep)


NodeFilter = Callable[[torch.fx.Node], bool]


@dataclass(frozen=True)
class _KeepRequest:
    """One partitioner's ``ops_to_not_decompose`` answer."""

    partitioner: Partitioner
    ops: tuple[OpOverload, ...]
    node_filter: NodeFilter | None

    def keeps(self, node: torch.fx.Node, method: str) -> bool:
        if node.target not in self.ops:
            return False
        if self.node_filter is None:
            return True
        try:
            return bool(self.node_filter(node))
        except Exception as exc:
            raise PartitionError(
                f"method {method!r}: the ops_to_not_decompose filter of {type(self.partitioner).__name__} raised "
                f"{type(exc).__name__} on node {node.name!r} ({node.target}): {exc}"
            ) from exc


def _keep_requests(method: str, ep: ExportedProgram, partitioners: Sequence[Partitioner]) -> list[_KeepRequest]:
    requests = []
    for p in partitioners:
        who = f"method {method!r}: {type(p).__name__}.ops_to_not_decompose"
        try:
            answer = p.ops_to_not_decompose(ep)
        except Exception as exc:
            raise PartitionError(f"{who} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(answer, (tuple, list)) or len(answer) != 2:
            raise PartitionError(f"{who} must return (list of OpOverload, filter or None), got {answer!r}")
        ops, node_filter = answer
        ops = tuple(ops)
        for op in ops:
            if not isinstance(op, OpOverload):
                hint = f"; name an overload, e.g. {op}.default" if isinstance(op, torch._ops.OpOverloadPacket) else ""
                raise PartitionError(f"{who} listed {op!r}, which is not a torch OpOverload{hint}")
        if node_filter is not None and not callable(node_filter):
            raise PartitionError(f"{who} returned a filter that is not callable: {node_filter!r}")
        requests.append(_KeepRequest(p, ops, node_filter))
    return requests


def _decompose_for_partitioners(
    name: str, ep: ExportedProgram, preserved: Sequence[OpOverload], requests: Sequence[_KeepRequest]
) -> tuple[ExportedProgram, list[OpOverload]]:
    """Decompose to core ATen, keeping whole each node some partitioner asks for (and ``preserved`` ops).

    Returns the program and the decomposable ops kept for partitioners. Like ExecuTorch, this takes two passes:
    the first keeps every listed op whole, the second decomposes the nodes of those ops that no partitioner
    keeps. A node is kept when a partitioner lists its op and that partitioner's filter is ``None`` or returns
    a true value for it. Filters see the nodes of the first pass's program (including control-flow branches),
    and are only called on nodes of the ops their partitioner lists.
    """
    table = edge_decompositions()
    listed: list[OpOverload] = []
    for request in requests:
        listed.extend(op for op in request.ops if op not in listed and op not in preserved and op in table)
    program = _decompose(name, ep, _decomposition_table([*preserved, *listed], table=table))
    if not any(r.node_filter is not None for r in requests):
        return program, listed
    kept, rejected = 0, 0
    for gm in graph_modules(program.graph_module):
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in listed:
                if any(r.keeps(node, name) for r in requests):
                    node.meta[_KEEP_WHOLE] = node.target
                    kept += 1
                else:
                    rejected += 1
    if rejected:
        program = _decompose(name, program, _decomposition_table(preserved, keep_marked=listed))
        remaining = sum(1 for gm in graph_modules(program.graph_module) for n in gm.graph.nodes
                        if n.op == "call_function" and n.target in listed)
        if remaining < kept:  # e.g. a torch without node meta in decompositions: say so, don't lose them
            raise ExportError(
                f"method {name!r}: {kept} node(s) of {[str(op) for op in listed]} were to stay whole for the "
                f"partitioners, but only {remaining} did after decomposition"
            )
    for gm in graph_modules(program.graph_module):
        for node in gm.graph.nodes:
            node.meta.pop(_KEEP_WHOLE, None)
    return program, listed


def to_edge(
    programs: Programs,
    constant_methods: dict[str, Any] | None = None,
    compile_config: EdgeCompileConfig | None = None,
    generate_etrecord: bool = False,
) -> EdgeProgramManager:
    """Convert exported programs to the edge dialect (core ATen, view ops as copies).

    ``generate_etrecord=True`` (ExecuTorch's name) records the exported and the edge programs for an ETRecord:
    ``get_etrecord()`` on this manager and on what ``to_executorch`` returns."""
    if isinstance(constant_methods, EdgeCompileConfig):
        raise TypeError("to_edge: pass the EdgeCompileConfig as compile_config=, not as constant_methods")
    config = compile_config or EdgeCompileConfig()
    keep = list(config.preserve_ops)
    exported = _as_dict(programs)
    edge = {name: _to_edge_program(name, ep, config, keep) for name, ep in exported.items()}
    manager = EdgeProgramManager(edge, constant_methods, config)
    if generate_etrecord:
        manager._etrecord = _record(exported, edge)
    return manager


def _record(exported: Mapping[str, ExportedProgram], edge: Mapping[str, ExportedProgram]) -> Any:
    """An ETRecord holding the programs as they are now. Nothing later in the pipeline rewrites a program in
    place (partitioning and ``to_executorch`` work on copies), so it holds them by reference, without a deep
    copy; ``tests`` check that ``to_executorch`` leaves them unchanged."""
    from edgeport.devtools.etrecord import ETRecord

    record = ETRecord()
    record.add_exported_program(dict(exported))
    record.add_edge_dialect_program(dict(edge))
    return record


def _partitioners_by_method(
    partitioner: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]] | Partitioner | None,
    methods: Sequence[str],
) -> dict[str, list[Partitioner]]:
    if partitioner is None:
        return {m: [] for m in methods}
    if isinstance(partitioner, Partitioner):
        return {m: [partitioner] for m in methods}
    if isinstance(partitioner, Mapping):
        unknown = set(partitioner) - set(methods)
        if unknown:
            raise PartitionError(f"partitioners given for unknown methods {sorted(unknown)}; methods: {list(methods)}")
        return {m: list(partitioner.get(m, [])) for m in methods}
    return {m: list(partitioner) for m in methods}


def to_edge_transform_and_lower(
    programs: Programs,
    transform_passes: Sequence[PassType] | Mapping[str, Sequence[PassType]] | None = None,
    partitioner: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]] | None = None,
    constant_methods: dict[str, Any] | None = None,
    compile_config: EdgeCompileConfig | None = None,
    generate_etrecord: bool = False,
) -> EdgeProgramManager:
    """Decompose (keeping what partitioners ask for), transform, and lower with partitioners in priority order.

    ``generate_etrecord=True`` records the exported programs and the edge programs as partitioners saw them
    (debug handles assigned, before lowering) for an ETRecord: ``get_etrecord()`` on the result.

    A node of an op some partitioner returns from ``ops_to_not_decompose`` stays whole when that partitioner's
    filter is ``None`` or accepts the node; other nodes are decomposed as usual (see
    :func:`_decompose_for_partitioners`). Nodes kept whole that no partitioner delegates are decomposed
    afterwards, and the result is verified as edge IR.
    """
    config = compile_config or EdgeCompileConfig()
    exported = _as_dict(programs)
    by_method = _partitioners_by_method(partitioner, list(exported))
    relaxed = EdgeCompileConfig(**{**config.__dict__, "_check_ir_validity": False})
    preserved = list(config.preserve_ops)
    edge: dict[str, ExportedProgram] = {}
    before_lowering: dict[str, ExportedProgram] = {}
    for name, ep in exported.items():
        requests = _keep_requests(name, ep, by_method[name])
        program, listed = _decompose_for_partitioners(name, ep, preserved, requests)
        program = _finish_edge_program(name, program, relaxed, [*preserved, *listed])
        if transform_passes:
            passes = transform_passes.get(name, []) if isinstance(transform_passes, Mapping) else transform_passes
            program = transform_program(program, list(passes))
            assign_debug_handles(program.graph_module)
        before_lowering[name] = program
        for p in by_method[name]:
            program = partition_and_lower(program, p)
        leftover = any(n.op == "call_function" and n.target in listed
                       for gm in graph_modules(program.graph_module) for n in gm.graph.nodes)
        if leftover:  # kept whole for a partitioner, but none took it
            previous = handles_by_name(program.graph_module)
            program = _decompose(name, program, _decomposition_table(preserved))
            inherit_debug_handles(program.graph_module, previous)
            program = _finish_edge_program(name, program, relaxed, preserved)
        if config._check_ir_validity:
            verify_edge_graph(program.graph_module, method=name, allowed=[*config.preserve_ops,
                                                                          *config._core_aten_ops_exception_list])
        edge[name] = program
    manager = EdgeProgramManager(edge, constant_methods, config)
    if generate_etrecord:
        manager._etrecord = _record(exported, before_lowering)
    return manager


class EdgeProgramManager:
    """Holds one edge program per method, plus constant methods; each step returns a new manager."""

    def __init__(
        self,
        edge_programs: Mapping[str, ExportedProgram],
        constant_methods: dict[str, Any] | None = None,
        compile_config: EdgeCompileConfig | None = None,
    ) -> None:
        self._edge_programs = dict(edge_programs)
        self._config_methods = dict(constant_methods or {})
        self.compile_config = compile_config or EdgeCompileConfig()
        self._etrecord: Any = None
        clash = set(self._edge_programs) & set(self._config_methods)
        if clash:
            raise ExportError(f"names used both as methods and constant methods: {sorted(clash)}")

    @property
    def methods(self) -> set[str]:
        return set(self._edge_programs)

    @property
    def config_methods(self) -> set[str]:
        return set(self._config_methods)

    def exported_program(self, method_name: str = "forward") -> ExportedProgram:
        try:
            return self._edge_programs[method_name]
        except KeyError:
            raise KeyError(f"no method {method_name!r}; methods: {sorted(self._edge_programs)}") from None

    def transform(
        self, passes: Sequence[PassType] | Mapping[str, Sequence[PassType]], check_ir_validity: bool = True
    ) -> EdgeProgramManager:
        """Run passes (on every method, or per method with a dict) and return a new manager."""
        result = {}
        for name, ep in self._edge_programs.items():
            selected = passes.get(name) if isinstance(passes, Mapping) else passes
            copied = copy.deepcopy(ep)
            program = transform_program(copied, list(selected)) if selected else copied
            if check_ir_validity:
                verify_edge_graph(program.graph_module, method=name,
                                  allowed=self.compile_config._core_aten_ops_exception_list)
            result[name] = program
        config = EdgeCompileConfig(**{**self.compile_config.__dict__, "_check_ir_validity": check_ir_validity})
        return EdgeProgramManager(result, copy.deepcopy(self._config_methods), config)

    def to_backend(self, partitioner: Partitioner | Mapping[str, Partitioner]) -> EdgeProgramManager:
        """Lower with one partitioner (every method) or a per-method dict; returns a new manager."""
        result = {}
        for name, ep in self._edge_programs.items():
            chosen = partitioner.get(name) if isinstance(partitioner, Mapping) else partitioner
            result[name] = partition_and_lower(ep, chosen) if chosen is not None else copy.deepcopy(ep)
        return EdgeProgramManager(result, copy.deepcopy(self._config_methods), self.compile_config)

    def to_executorch(self, config: ExecutorchBackendConfig | None = None) -> Any:
        """Convert to out-variants, plan memory, emit and serialize: returns an ``ExecutorchProgramManager``."""
        from edgeport.aot.executorch_manager import ExecutorchProgramManager

        manager = ExecutorchProgramManager.from_edge_programs(
            self._edge_programs, self._config_methods, config or ExecutorchBackendConfig()
        )
        if self._etrecord is not None:
            record = self._etrecord.copy()
            record.add_executorch_program(manager)
            manager._etrecord = record
        return manager

    def get_etrecord(self) -> Any:
        """The ETRecord recorded with ``generate_etrecord=True`` (ExecuTorch's name): the exported and edge
        programs; the debug maps are added by ``to_executorch`` (call ``get_etrecord()`` on its result to save
        one the Inspector can use)."""
        if self._etrecord is None:
            raise RuntimeError("no ETRecord was recorded: pass generate_etrecord=True to to_edge or "
                               "to_edge_transform_and_lower")
        return self._etrecord
