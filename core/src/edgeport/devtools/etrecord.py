"""ETRecord: what the Inspector needs from lowering time, in ExecuTorch's file format.

An ETRecord is a zip file holding the exported program, the edge program(s) the partitioners saw (nodes carry
debug handles) and the emitter's debug maps. ``to_edge(..., generate_etrecord=True)`` or
``to_edge_transform_and_lower(..., generate_etrecord=True)`` records one; ``get_etrecord()`` on the manager
``to_executorch`` returns gives it with the debug maps added, ready to ``save``. ExecuTorch 1.5.1's
``parse_etrecord`` and ``Inspector`` read the files edgeport writes (tested).

Entries (ExecuTorch's names): ``ETRECORD_V0`` (empty marker), ``exported_program`` (+ ``_state_dict``,
``_constants``, ``_example_inputs``), ``edge_dialect_exported_program/<method>`` (+ the same three), JSON
``debug_handle_map``, ``delegate_map``, ``instruction_id_to_num_outs_map`` and ``export_graph_id``, and
``torch.save`` bytes of ``reference_outputs`` / ``representative_inputs`` when a bundled program supplied them.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Mapping
from typing import IO, Any

from edgeport.devtools.program_serde import (
    ProgramSerdeError,
    SerializedProgram,
    deserialize_program,
    serialize_program,
)
from edgeport.errors import EdgeportError

IDENTIFIER = "ETRECORD_V0"
EXPORTED_PROGRAM = "exported_program"
EXPORT_GRAPH_ID = "export_graph_id"
EDGE_DIALECT_EXPORTED_PROGRAM = "edge_dialect_exported_program"
DEBUG_HANDLE_MAP_NAME = "debug_handle_map"
DELEGATE_MAP_NAME = "delegate_map"
INSTRUCTION_ID_TO_NUM_OUTS_MAP_NAME = "instruction_id_to_num_outs_map"
REFERENCE_OUTPUTS = "reference_outputs"
REPRESENTATIVE_INPUTS = "representative_inputs"
_SUFFIXES = ("_state_dict", "_constants", "_example_inputs")


class ETRecordError(EdgeportError):
    """An ETRecord file that cannot be read, or an ETRecord that cannot be saved."""


class ETRecord:
    """The lowering-time record (ExecuTorch's ``ETRecord``, same fields and file format)."""

    def __init__(self, exported_program: Any = None, export_graph_id: int | None = None,
                 edge_dialect_program: Any = None, graph_map: dict[str, Any] | None = None,
                 _debug_handle_map: dict[str, Any] | None = None, _delegate_map: dict[str, Any] | None = None,
                 _instruction_id_to_num_outs_map: dict[str, Any] | None = None,
                 _reference_outputs: dict[str, Any] | None = None,
                 _representative_inputs: list[Any] | None = None) -> None:
        self.exported_program = exported_program
        self.export_graph_id = export_graph_id
        self.edge_dialect_program = edge_dialect_program
        self.graph_map = graph_map
        self._debug_handle_map = _debug_handle_map
        self._delegate_map = _delegate_map
        self._instruction_id_to_num_outs_map = _instruction_id_to_num_outs_map
        self._reference_outputs = _reference_outputs
        self._representative_inputs = _representative_inputs

    # -- building ----------------------------------------------------------------------------------------
    def add_exported_program(self, exported_program: Any) -> None:
        """The program ``torch.export`` produced (a dict of methods: ``"forward"`` is kept, as ExecuTorch does)."""
        if self.exported_program is not None:
            raise ETRecordError("this ETRecord already holds an exported program")
        if isinstance(exported_program, Mapping):
            exported_program = exported_program.get("forward")
        if exported_program is not None:
            self.exported_program = exported_program
            self.export_graph_id = id(exported_program.graph)

    def add_edge_dialect_program(self, edge_dialect_program: Any) -> None:
        """The edge program(s): an ``ExportedProgram``, a ``{method: program}`` dict or an edge manager."""
        if self.edge_dialect_program is not None:
            raise ETRecordError("this ETRecord already holds an edge dialect program")
        if hasattr(edge_dialect_program, "methods") and hasattr(edge_dialect_program, "exported_program"):
            edge_dialect_program = {m: edge_dialect_program.exported_program(m)
                                    for m in sorted(edge_dialect_program.methods)}
        if isinstance(edge_dialect_program, Mapping):
            programs = dict(edge_dialect_program)
            edge_dialect_program = next(iter(programs.values())) if list(programs) == ["forward"] else programs
        self.edge_dialect_program = edge_dialect_program

    def add_executorch_program(self, executorch_program: Any) -> None:
        """The debug maps of the program ``to_executorch`` made (or of a bundled program's, with its test
        inputs and expected outputs as representative inputs and reference outputs)."""
        if self._debug_handle_map is not None:
            raise ETRecordError("this ETRecord already holds an ExecuTorch program's debug maps")
        program = executorch_program
        suites = getattr(executorch_program, "method_test_suites", None)
        if suites is not None:  # a BundledProgram
            program = executorch_program.executorch_program
            if program is None:
                raise ETRecordError("this BundledProgram was made from .pte bytes: make it from the manager "
                                    "to_executorch() returned, whose debug maps the ETRecord needs")
            self._reference_outputs = {
                s.method_name: [[t for t in case.expected_outputs] for case in s.test_cases] for s in suites}
            self._representative_inputs = [list(case.inputs) for s in suites if s.method_name == "forward"
                                           for case in s.test_cases]
        for attr in ("debug_handle_map", "delegate_map", "instruction_id_to_num_outs_map"):
            if not hasattr(program, attr):
                raise ETRecordError(f"{type(program).__name__} has no {attr}: pass what to_executorch returned")
        self._debug_handle_map = program.debug_handle_map
        self._delegate_map = program.delegate_map
        self._instruction_id_to_num_outs_map = program.instruction_id_to_num_outs_map

    def copy(self) -> ETRecord:
        """The lowering-time part of this record, without an ExecuTorch program's debug maps."""
        return ETRecord(self.exported_program, self.export_graph_id, self.edge_dialect_program, self.graph_map)

    def edge_programs(self) -> dict[str, Any]:
        """The edge programs by method name."""
        if self.edge_dialect_program is None:
            return {}
        if isinstance(self.edge_dialect_program, Mapping):
            return dict(self.edge_dialect_program)
        return {"forward": self.edge_dialect_program}

    # -- saving ------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike | IO[bytes]) -> None:
        """Write the ETRecord (ExecuTorch's format). Needs the edge program and the debug maps: save the record
        ``get_etrecord()`` gives on the manager ``to_executorch`` returned."""
        if not (self.edge_dialect_program is not None and self._debug_handle_map):
            raise ETRecordError("an ETRecord needs the edge program and the ExecuTorch program's debug maps: call "
                                "get_etrecord() on what to_executorch() returned, not on the edge manager")
        target = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
        with zipfile.ZipFile(target, "w") as z:
            z.writestr(IDENTIFIER, "")
            if self.exported_program is not None:
                _write_program(z, EXPORTED_PROGRAM, self.exported_program)
            for method, program in self.edge_programs().items():
                _write_program(z, f"{EDGE_DIALECT_EXPORTED_PROGRAM}/{method}", program)
            for name, program in (self.graph_map or {}).items():
                _write_program(z, name if "/" in name else f"{name}/forward", program)
            z.writestr(DEBUG_HANDLE_MAP_NAME, json.dumps(self._debug_handle_map))
            if self._delegate_map is not None:
                z.writestr(DELEGATE_MAP_NAME, json.dumps(self._delegate_map))
            if self._instruction_id_to_num_outs_map is not None:
                z.writestr(INSTRUCTION_ID_TO_NUM_OUTS_MAP_NAME, json.dumps(self._instruction_id_to_num_outs_map))
            for name, value in ((REFERENCE_OUTPUTS, self._reference_outputs),
                                (REPRESENTATIVE_INPUTS, self._representative_inputs)):
                if value is not None:
                    z.writestr(name, _torch_bytes(value))
            if self.export_graph_id is not None:
                z.writestr(EXPORT_GRAPH_ID, json.dumps(self.export_graph_id))


def _torch_bytes(value: Any) -> bytes:
    import numpy as np
    import torch

    def as_torch(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(v))
        if isinstance(v, dict):
            return {k: as_torch(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(as_torch(x) for x in v)
        return v

    buf = io.BytesIO()
    torch.save(as_torch(value), buf)
    return buf.getvalue()


def _write_program(z: zipfile.ZipFile, name: str, program: Any) -> None:
    try:
        data = serialize_program(program)
    except ProgramSerdeError as exc:
        raise ETRecordError(f"cannot store {name!r} in the ETRecord: {exc}") from exc
    z.writestr(name, data.exported_program)
    z.writestr(f"{name}_state_dict", data.state_dict)
    z.writestr(f"{name}_constants", data.constants)
    z.writestr(f"{name}_example_inputs", data.example_inputs)


# --------------------------------------------------------------------------------------------- reading
def parse_etrecord(etrecord_path: str | os.PathLike) -> ETRecord:
    """Read an ETRecord file (edgeport's or ExecuTorch's; ExecuTorch's edge programs hold edge-dialect operators
    torch alone cannot read, which is said in the error)."""
    where = os.fspath(etrecord_path)
    try:
        z = zipfile.ZipFile(where)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ETRecordError(f"{where}: not an ETRecord (not a zip file: {exc})") from exc
    with z:
        names = set(z.namelist())
        if IDENTIFIER not in names:
            raise ETRecordError(f"{where}: not an ETRecord (no {IDENTIFIER} entry); write one with "
                                "get_etrecord().save(path)")
        record = ETRecord()

        def read_json(name: str) -> Any:
            try:
                return json.loads(z.read(name))
            except ValueError as exc:
                raise ETRecordError(f"{where}: entry {name!r} is not valid JSON ({exc})") from exc

        def read_program(name: str) -> Any:
            missing = [name + s for s in _SUFFIXES if name + s not in names]
            if missing:
                raise ETRecordError(f"{where}: program {name!r} is incomplete (missing {missing})")
            try:
                return deserialize_program(SerializedProgram(*(z.read(name + s) for s in ("", *_SUFFIXES))),
                                           f"{where}:{name}")
            except ProgramSerdeError as exc:
                raise ETRecordError(str(exc)) from exc

        programs = {n for n in names if n != IDENTIFIER and not n.endswith(_SUFFIXES) and n not in (
            DEBUG_HANDLE_MAP_NAME, DELEGATE_MAP_NAME, INSTRUCTION_ID_TO_NUM_OUTS_MAP_NAME, REFERENCE_OUTPUTS,
            REPRESENTATIVE_INPUTS, EXPORT_GRAPH_ID)}
        edge: dict[str, Any] = {}
        graph_map: dict[str, Any] = {}
        for name in sorted(programs):
            if name == EXPORTED_PROGRAM:
                record.exported_program = read_program(name)
            elif name.startswith(EDGE_DIALECT_EXPORTED_PROGRAM + "/"):
                edge[name.split("/", 1)[1]] = read_program(name)
            elif name == EDGE_DIALECT_EXPORTED_PROGRAM:  # ExecuTorch's older single-program layout
                edge["forward"] = read_program(name)
            else:
                graph_map[name] = read_program(name)
        if edge:
            record.add_edge_dialect_program(edge)
        record.graph_map = graph_map or None
        if DEBUG_HANDLE_MAP_NAME in names:
            record._debug_handle_map = read_json(DEBUG_HANDLE_MAP_NAME)
        if DELEGATE_MAP_NAME in names:
            record._delegate_map = read_json(DELEGATE_MAP_NAME)
        if INSTRUCTION_ID_TO_NUM_OUTS_MAP_NAME in names:
            record._instruction_id_to_num_outs_map = read_json(INSTRUCTION_ID_TO_NUM_OUTS_MAP_NAME)
        if EXPORT_GRAPH_ID in names:
            record.export_graph_id = read_json(EXPORT_GRAPH_ID)
        for name, attr in ((REFERENCE_OUTPUTS, "_reference_outputs"), (REPRESENTATIVE_INPUTS,
                                                                          "_representative_inputs")):
            if name in names:
                import torch

                try:
                    setattr(record, attr, torch.load(io.BytesIO(z.read(name)), weights_only=True))
                except Exception as exc:
                    raise ETRecordError(f"{where}: entry {name!r} cannot be read ({type(exc).__name__}: "
                                        f"{exc})") from exc
    return record
