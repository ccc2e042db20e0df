"""``ExecutorchProgramManager``: the edge → execution stage (out variants, memory planning, emission, serialization)."""

from __future__ import annotations

import io
import operator
import os
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import sympy
import torch
from torch.export import ExportedProgram
from torch.utils._sympy.numbers import int_oo

from edgeport.aot.config import ExecutorchBackendConfig
from edgeport.aot.delegate_op import is_call_delegate, lookup_lowered_module
from edgeport.aot.emitter import MethodEmitter, PlannedTensor, ProgramTables, emit_constant_method
from edgeport.aot.graph_utils import copy_program
from edgeport.aot.memory_planning import MemoryPlan, TensorLifetime, plan_memory
from edgeport.aot.passes.out_variants import storage_root, to_out_variants
from edgeport.aot.passes.state import write_back_mutated_buffers
from edgeport.aot.transform import transform_program
from edgeport.errors import SerializationError, UnsupportedOperatorError
from edgeport.named_data import merge_named_data_by_tag
from edgeport.program import schema as S


@dataclass
class MethodMemoryReport:
    """Planned arena bytes against the naive sum of every planned tensor's size."""

    method: str
    tensors: int
    arena_bytes: int
    naive_bytes: int

    def __str__(self) -> str:
        saved = 0.0 if not self.naive_bytes else 100.0 * (1 - self.arena_bytes / self.naive_bytes)
        return (f"{self.method}: {self.tensors} planned tensors, arena {self.arena_bytes} B "
                f"vs naive {self.naive_bytes} B ({saved:.1f}% saved)")


def _upper_bound(dim: Any, where: str) -> int:
    if isinstance(dim, int):
        return dim
    node = getattr(dim, "node", None)
    if node is not None and node.shape_env is not None:
        upper = node.shape_env.bound_sympy(node.expr).upper
        if upper not in (int_oo, sympy.oo) and upper.is_number:
            return int(upper)
    raise UnsupportedOperatorError(
        f"{where}: dynamic dimension {dim} has no upper bound; export with torch.export.Dim(name, max=...)"
    )


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()


def plan_method(ep: ExportedProgram, method: str, config: ExecutorchBackendConfig,
                state: Collection[torch.fx.Node] = ()) -> tuple[dict[torch.fx.Node, PlannedTensor], MemoryPlan]:
    """Lifetimes of every storage-owning tensor in ``ep`` (already in out-variant form), then a plan. ``state``
    (mutated buffers) lives for the whole method, so nothing else ever shares its memory."""
    nodes = list(ep.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    user_inputs = set(ep.graph_signature.user_inputs)
    roots: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for n in nodes:
        if n.op == "placeholder" and n not in state and (
                n.name not in user_inputs or not isinstance(n.meta.get("val"), torch.Tensor)):
            continue
        root = storage_root(n)
        if root is not None:
            roots.setdefault(root, []).append(n)
    records, planned_nodes, shapes = [], [], []
    last = len(nodes)
    for root, aliases in roots.items():
        val = root.meta["val"]
        where = f"method {method!r}, node {root.name!r}"
        shape = tuple(_upper_bound(d, where) for d in val.shape)
        dynamic = any(not isinstance(d, int) for d in val.shape)
        if root.op == "placeholder":
            start = 0
        elif root.target is operator.getitem:  # a delegate output: written when the delegate call runs
            start = index[root.args[0]]
        else:
            start = index[root]
        end = last if root in state else start
        for alias in aliases:
            for user in alias.users:
                end = max(end, last if user.op == "output" else index[user])
        records.append(TensorLifetime(root.name, _nbytes(shape, val.dtype), start, end))
        planned_nodes.append(root)
        shapes.append((shape, val.dtype, dynamic))
    plan = plan_memory(records, config.memory_planning_pass, config.memory_alignment)
    planned = {}
    for root, (shape, dtype, dynamic), offset in zip(planned_nodes, shapes, plan.offsets):
        planned[root] = PlannedTensor(shape, dtype, offset, dynamic)
    # Every alias of a root reads the same planned storage.
    for root, aliases in roots.items():
        for alias in aliases:
            planned.setdefault(alias, planned[root])
    return planned, plan


def delegate_keys(ep: ExportedProgram) -> list[str]:
    """Keys of the lowered modules a program calls, in first-call order, without repeats."""
    keys: list[str] = []
    for node in ep.graph.nodes:
        if is_call_delegate(node) and node.args[0] not in keys:
            keys.append(node.args[0])
    return keys


def to_execution_program(ep: ExportedProgram, config: ExecutorchBackendConfig, method: str = "forward"
                         ) -> tuple[ExportedProgram, dict[torch.fx.Node, str]]:
    """User passes, out-variant conversion, then the write-back of mutated buffers, on a copy of ``ep``; returns
    the program and its state (mutated buffers' placeholders -> fully qualified names)."""
    work = copy_program(ep)
    if config.passes:
        work = transform_program(work, list(config.passes))
    # In place, after construction: torch's ATen verifier (all ops functional) does not apply to out variants.
    to_out_variants(work.graph_module)
    state = write_back_mutated_buffers(work, method)
    return work, state


class ExecutorchProgramManager:
    """The lowered, planned and serialized program (ExecuTorch's ``ExecutorchProgramManager``)."""

    def __init__(self, execution_programs: Mapping[str, ExportedProgram], config_methods: Mapping[str, Any],
                 backend_config: ExecutorchBackendConfig, program: S.Program,
                 memory_reports: list[MethodMemoryReport],
                 named_data: dict[str, tuple[bytes, int]] | None = None,
                 external_data: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self._execution_programs = dict(execution_programs)
        self._config_methods = dict(config_methods)
        self._config = backend_config
        self._program = program
        self.memory_reports = memory_reports
        self._named_data = dict(named_data or {})
        self._external_data = {tag: dict(entries) for tag, entries in (external_data or {}).items()}
        self._tensor_data: dict[str, bytes] | None = None
        self._buffer: bytes | None = None
        self._debug_maps: dict[str, tuple[dict, dict, dict]] = {}
        self._etrecord: Any = None
        #: initial values of the methods' mutated buffers (entry 0 = no data), ExecuTorch's mutable-data segment
        self._mutable_data: list[S.Buffer] = [S.Buffer(b"")]

    @classmethod
    def from_edge_programs(cls, programs: Mapping[str, ExportedProgram], config_methods: Mapping[str, Any],
                           config: ExecutorchBackendConfig) -> ExecutorchProgramManager:
        tables = ProgramTables(external_constants=config.external_constants)
        plans: list[S.ExecutionPlan] = []
        executions: dict[str, ExportedProgram] = {}
        reports = []
        debug_maps: dict[str, tuple[dict, dict, dict]] = {}
        pending = list(programs.items())
        while pending:
            name, ep = pending.pop(0)
            fallbacks: dict[str, str] = {}
            if config.portable_fallbacks:
                for key in delegate_keys(ep):
                    fallbacks[key] = f"{name}__fallback_{len(fallbacks)}"
                    pending.append((fallbacks[key], lookup_lowered_module(key).original_module))
            execution, state = to_execution_program(ep, config, name)
            planned, memory = plan_method(execution, name, config, state)
            emitter = MethodEmitter(name, execution, planned, memory.arena_bytes, tables, fallbacks,
                                    emit_stacktrace=config.emit_stacktrace, state=state)
            plans.append(emitter.emit())
            debug_maps[name] = (emitter.debug_handle_map, emitter.delegate_map, emitter.instruction_id_to_num_outs_map)
            executions[name] = execution
            reports.append(MethodMemoryReport(name, len(memory.offsets), memory.arena_bytes, memory.naive_bytes))
        for name, value in config_methods.items():
            plans.append(emit_constant_method(name, value, tables))
        program = S.Program(
            version=0,
            execution_plan=plans,
            constant_buffer=tables.constant_buffer,
            backend_delegate_data=tables.delegate_data,
            segments=[],
            constant_segment=S.SubsegmentOffsets(0, []),
        )
        named = merge_named_data_by_tag(tables.named_data)
        external: dict[str, dict[str, Any]] = {}
        for tag, constants in tables.external_data.items():
            external.setdefault(tag, {}).update(
                {fqn: ("tensor", data, dtype, sizes) for fqn, (data, dtype, sizes, _) in constants.items()})
        for tag, entries in named.items():
            if tag is None:
                continue
            group = external.setdefault(tag, {})
            for key, (data, alignment) in entries.items():
                if key in group:
                    raise SerializationError(f"{tag}.ptd: key {key!r} is both a constant and a backend's named data")
                group[key] = ("blob", data, alignment)
        manager = cls(executions, config_methods, config, program, reports, named.get(None, {}), external)
        manager._debug_maps = debug_maps
        manager._mutable_data = tables.mutable_buffer
        return manager

    @property
    def methods(self) -> set[str]:
        return set(self._execution_programs)

    @property
    def config_methods(self) -> set[str]:
        return set(self._config_methods)

    @property
    def executorch_program(self) -> S.Program:
        """The program as schema dataclasses, before serialization."""
        return self._program

    def exported_program(self, method_name: str = "forward") -> ExportedProgram:
        """The execution-dialect program of a method (out variants and ``alloc`` nodes)."""
        try:
            return self._execution_programs[method_name]
        except KeyError:
            raise KeyError(f"no method {method_name!r}; methods: {sorted(self._execution_programs)}") from None

    @property
    def debug_handle_map(self) -> dict[str, dict[int, int | list[int]]]:
        """Per method, instruction index -> the debug handle(s) of the edge nodes it carries out (ExecuTorch's
        map: an int for a kernel, the partition's handles for a delegate call)."""
        return {m: dict(maps[0]) for m, maps in self._debug_maps.items()}

    @property
    def delegate_map(self) -> dict[str, dict[int, dict[str, Any]]]:
        """Per method, delegate-call instruction -> ``{"name": backend id, "delegate_map": the backend's own map
        from its internal step ids to debug handles}`` (ExecuTorch's map)."""
        return {m: {i: dict(v) for i, v in maps[1].items()} for m, maps in self._debug_maps.items()}

    @property
    def instruction_id_to_num_outs_map(self) -> dict[str, dict[int, int]]:
        """Per method, delegate-call instruction -> its number of outputs (ExecuTorch's map)."""
        return {m: dict(maps[2]) for m, maps in self._debug_maps.items()}

    def get_etrecord(self) -> Any:
        """The ETRecord recorded when the program was made with ``generate_etrecord=True`` (ExecuTorch's name)."""
        if self._etrecord is None:
            raise RuntimeError("no ETRecord was recorded: pass generate_etrecord=True to to_edge or "
                               "to_edge_transform_and_lower")
        return self._etrecord

    @property
    def buffer(self) -> bytes:
        """The serialized ``.pte`` bytes (computed once)."""
        if self._buffer is None:
            from edgeport.program.pte import serialize_pte

            c = self._config
            try:
                self._buffer = bytes(serialize_pte(
                    self._program,
                    extract_delegate_segments=c.extract_delegate_segments,
                    extract_constant_segment=c.extract_constant_segment,
                    segment_alignment=c.segment_alignment,
                    constant_tensor_alignment=c.constant_tensor_alignment,
                    delegate_alignment=c.delegate_alignment,
                    named_data=self._named_data,
                    mutable_data=self._mutable_data if len(self._mutable_data) > 1 else None,
                ))
            except SerializationError:
                raise
        return self._buffer

    @property
    def tensor_data(self) -> dict[str, bytes]:
        """The ``.ptd`` data files of the program, by file tag (empty unless constants or named data are external)."""
        if self._tensor_data is None:
            from edgeport.aot.emitter import scalar_type
            from edgeport.program.ptd import DataEntry, TensorLayout, serialize_ptd

            files: dict[str, bytes] = {}
            for tag, group in self._external_data.items():
                entries: dict[str, DataEntry] = {}
                for key, item in group.items():
                    if item[0] == "tensor":
                        _, data, dtype, sizes = item
                        layout = TensorLayout(scalar_type(dtype), list(sizes), list(range(len(sizes))))
                        entries[key] = DataEntry(data, self._config.constant_tensor_alignment or 16, layout)
                    else:
                        entries[key] = DataEntry(item[1], item[2])
                files[tag] = serialize_ptd(entries, self._config.segment_alignment)
            self._tensor_data = files
        return self._tensor_data

    def write_tensor_data_to_file(self, outdir: str | os.PathLike[str]) -> list[str]:
        """Write each ``.ptd`` data file to ``outdir/<tag>.ptd`` atomically; returns the paths written."""
        from edgeport.program.pte import write_pte_file

        paths = []
        for tag, data in self.tensor_data.items():
            name = tag if tag.endswith(".ptd") else f"{tag}.ptd"
            path = os.path.join(os.fspath(outdir), name)
            write_pte_file(path, data)
            paths.append(path)
        return paths

    def write_to_file(self, open_file: io.BufferedIOBase) -> None:
        open_file.write(self.buffer)

    def save(self, path: str) -> None:
        """Write the program to ``path`` atomically (temporary file, then rename)."""
        from edgeport.program.pte import write_pte_file

        write_pte_file(path, self.buffer)

    def dump_executorch_program(self, verbose: bool = False, out: TextIO | None = None) -> None:
        """Print the program: a condensed listing, or every schema field with ``verbose=True``."""
        from edgeport.aot.program_printer import format_program

        print(format_program(self._program, verbose=verbose), file=out or sys.stdout)

    def delegation_summary(self) -> str:
        """Per method: delegate calls by backend (with a backend's one-line ``summary`` of each delegate when its
        ``describe_blob`` gives one, e.g. a compiler's cost estimates), kernel calls by operator, the memory plan."""
        from edgeport.aot.program_printer import delegation_summary

        return delegation_summary(self._program, self.memory_reports, self._delegate_summaries())

    def _delegate_summaries(self) -> dict[tuple[int, int], str]:
        """(plan index, delegate index) -> the ``summary`` its backend's ``describe_blob`` gives, where it gives one."""
        from edgeport.inspection import describe_delegate
        from edgeport.program.reader import load_pte

        out: dict[tuple[int, int], str] = {}
        loaded = None
        for pi, plan in enumerate(self._program.execution_plan):
            for di, d in enumerate(plan.delegates):
                loaded = loaded or load_pte(self.buffer)
                described = describe_delegate(d.id, loaded.delegate_data(pi, di), loaded.named_data)
                if isinstance(described.get("summary"), str):
                    out[(pi, di)] = described["summary"]
        return out
