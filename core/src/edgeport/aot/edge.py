"""``to_edge``, ``to_edge_transform_and_lower`` and ``EdgeProgramManager`` (ExecuTorch's names and semantics)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import torch
from torch._ops import OpOverload
from torch.export import ExportedProgram

from edgeport.aot.config import EdgeCompileConfig, ExecutorchBackendConfig
from edgeport.aot.delegate_op import is_call_delegate, lookup_lowered_module
from edgeport.aot.partitioner import Partitioner
from edgeport.aot.passes.edge_passes import normalize_edge_ops
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


def _decomposition_table(keep: Sequence[OpOverload]) -> Any:
    table = torch.export.default_decompositions()
    for op in keep:
        if op in table:
            table.pop(op)
    return table


def _to_edge_program(
    name: str, ep: ExportedProgram, config: EdgeCompileConfig, keep: Sequence[OpOverload]
) -> ExportedProgram:
    try:
        ep = ep.run_decompositions(_decomposition_table(keep))
    except Exception as exc:  # torch raises many types here; name the method and the cause
        raise ExportError(f"method {name!r}: decomposition to core ATen failed: {type(exc).__name__}: {exc}") from exc
    normalize_edge_ops(ep.graph_module)
    _attach_lowered_modules(ep.graph_module)
    if config._check_ir_validity:
        verify_edge_graph(ep.graph_module, method=name, allowed=[*keep, *config._core_aten_ops_exception_list])
    return ep


def to_edge(
    programs: Programs,
    constant_methods: dict[str, Any] | None = None,
    compile_config: EdgeCompileConfig | None = None,
) -> EdgeProgramManager:
    """Convert exported programs to the edge dialect (core ATen, view ops as copies)."""
    if isinstance(constant_methods, EdgeCompileConfig):
        raise TypeError("to_edge: pass the EdgeCompileConfig as compile_config=, not as constant_methods")
    config = compile_config or EdgeCompileConfig()
    keep = list(config.preserve_ops)
    edge = {name: _to_edge_program(name, ep, config, keep) for name, ep in _as_dict(programs).items()}
    return EdgeProgramManager(edge, constant_methods, config)


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
) -> EdgeProgramManager:
    """Decompose (keeping what partitioners ask for), transform, and lower with partitioners in priority order.

    Ops kept whole for a partitioner that end up not delegated are decomposed afterwards, and the result is
    verified as edge IR.
    """
    config = compile_config or EdgeCompileConfig()
    exported = _as_dict(programs)
    by_method = _partitioners_by_method(partitioner, list(exported))
    edge: dict[str, ExportedProgram] = {}
    for name, ep in exported.items():
        keep: list[OpOverload] = list(config.preserve_ops)
        filters = []
        for p in by_method[name]:
            ops, node_filter = p.ops_to_not_decompose(ep)
            keep.extend(op for op in ops if op not in keep)
            if node_filter is not None:
                filters.append(node_filter)
        relaxed = EdgeCompileConfig(**{**config.__dict__, "_check_ir_validity": False})
        program = _to_edge_program(name, ep, relaxed, keep)
        if transform_passes:
            passes = transform_passes.get(name, []) if isinstance(transform_passes, Mapping) else transform_passes
            program = transform_program(program, list(passes))
        for p in by_method[name]:
            program = partition_and_lower(program, p)
        if keep:
            leftover = {n.target for n in program.graph.nodes if n.op == "call_function" and n.target in set(keep)}
            leftover -= set(config.preserve_ops)
            if leftover:
                program = _to_edge_program(name, program, relaxed, [op for op in keep if op not in leftover])
        if config._check_ir_validity:
            verify_edge_graph(program.graph_module, method=name, allowed=[*config.preserve_ops,
                                                                          *config._core_aten_ops_exception_list])
        edge[name] = program
    return EdgeProgramManager(edge, constant_methods, config)


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

        return ExecutorchProgramManager.from_edge_programs(
            self._edge_programs, self._config_methods, config or ExecutorchBackendConfig()
        )
