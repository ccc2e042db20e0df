"""The Inspector: an ETDump's events joined with an ETRecord's graph (ExecuTorch's ``Inspector`` API).

``Inspector(etdump_path=..., etrecord=..., debug_buffer_path=...)`` reads an ETDump written by edgeport's runtime
or ExecuTorch's, groups its events into blocks (``Default``: loading; ``Execute``: the runs, one timing per run
and event), and, with an ETRecord, names each event's edge operators, their source lines (``stack_traces``) and
modules (``module_hierarchy``) through the debug maps. Delegate sub-events are resolved through the backend's
delegate map, or through the debug handles an executor put in the event's metadata. Times in the ETDump are
read as ``source_time_scale`` units (edgeport and ExecuTorch's Linux runtime record nanoseconds) and reported in
``target_time_scale`` units (milliseconds by default).

``to_dataframe()`` needs pandas (not an edgeport dependency); ``to_rows()`` gives the same table as dicts.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from edgeport.devtools import etdump as E
from edgeport.errors import EdgeportError
from edgeport.program import schema as S

_SCALE = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
#: events of loading or running the method as a whole: they carry no instruction's operators
_WHOLE_METHOD = ("Method::init", "Program::load_method", "Method::execute")


class InspectorError(EdgeportError):
    """An ETDump, debug buffer or ETRecord the Inspector cannot use."""


@dataclass
class PerfData:
    """One event's durations over the runs, in the Inspector's target time scale."""

    raw: list[float]

    def _q(self, q: float) -> float:
        data = sorted(self.raw)
        return data[min(len(data) - 1, int(q * len(data)))]

    @property
    def p10(self) -> float:
        return self._q(0.10)

    @property
    def p50(self) -> float:
        return statistics.median(self.raw)

    @property
    def p90(self) -> float:
        return self._q(0.90)

    @property
    def avg(self) -> float:
        return statistics.fmean(self.raw)

    @property
    def min(self) -> float:
        return min(self.raw)

    @property
    def max(self) -> float:
        return max(self.raw)


@dataclass
class Event:
    """One event signature (name, instruction, delegate debug id) of a block, over every run of the block."""

    name: str
    instruction_id: int
    chain_index: int
    delegate_debug_identifier: int | str | None
    perf_data: PerfData | None = None
    debug_data: list[Any] = field(default_factory=list)  # intermediate outputs, one entry per run
    debug_handles: tuple[int, ...] = ()
    op_types: list[str] = field(default_factory=list)
    stack_traces: dict[str, str] = field(default_factory=dict)
    module_hierarchy: dict[str, dict[str, Any]] = field(default_factory=dict)
    is_delegated_op: bool = False
    delegate_backend_name: str | None = None
    delegate_debug_metadatas: list[bytes] = field(default_factory=list)

    def asdict(self) -> dict[str, Any]:
        perf = self.perf_data
        row: dict[str, Any] = {"event_name": self.name, "instruction_id": self.instruction_id,
                               "delegate_debug_identifier": self.delegate_debug_identifier}
        for stat in ("p10", "p50", "p90", "avg", "min", "max"):
            row[stat] = getattr(perf, stat) if perf is not None and perf.raw else None
        row.update(raw=list(perf.raw) if perf is not None else [], op_types=list(self.op_types),
                   is_delegated_op=self.is_delegated_op, delegate_backend_name=self.delegate_backend_name,
                   debug_handles=list(self.debug_handles), stack_traces=dict(self.stack_traces),
                   module_hierarchy=dict(self.module_hierarchy), num_debug_outputs=len(self.debug_data))
        return row


@dataclass
class EventBlock:
    name: str
    events: list[Event]
    runs: int


def _read(path: str | os.PathLike, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InspectorError(f"cannot read the {what} {os.fspath(path)!r}: {exc.strerror or exc}") from exc


def _tensor(t: E.Tensor, buffer: bytes | None, where: str) -> np.ndarray:
    try:
        dtype = S.numpy_dtype(int(t.scalar_type), storage=True)
    except Exception as exc:  # noqa: BLE001 - an unknown scalar type in a foreign file
        raise InspectorError(f"{where}: scalar type {t.scalar_type} is not a tensor type ({exc})") from exc
    sizes = [int(s) for s in t.sizes]
    if any(s < 0 for s in sizes):
        raise InspectorError(f"{where}: negative tensor size {sizes}")
    count = int(np.prod(sizes)) if sizes else 1
    if buffer is None:
        raise InspectorError(f"{where}: the ETDump holds intermediate outputs; pass debug_buffer_path=")
    end = int(t.offset) + count * dtype.itemsize
    if int(t.offset) < 0 or end > len(buffer):
        raise InspectorError(f"{where}: bytes {t.offset}..{end} are outside the debug buffer ({len(buffer)} bytes): "
                             "wrong or truncated debug buffer file")
    return np.frombuffer(buffer, dtype=dtype, count=count, offset=int(t.offset)).reshape(sizes).copy()


def _value(v: E.Value | None, buffer: bytes | None, where: str) -> Any:
    if v is None:
        return None
    kind = int(v.val)
    if kind == E.ValueType.Tensor and v.tensor is not None:
        return _tensor(v.tensor, buffer, where)
    if kind == E.ValueType.TensorList and v.tensor_list is not None:
        return [_tensor(t, buffer, where) for t in v.tensor_list.tensors]
    for attr, field_name in (("int_value", "int_val"), ("bool_value", "bool_val"), ("double_value", "double_val"),
                             ("float_value", "float_val")):
        obj = getattr(v, attr)
        if obj is not None:
            return getattr(obj, field_name)
    return None


class Inspector:
    """ExecuTorch's ``Inspector`` over edgeport's or ExecuTorch's ETDump, with edgeport's or ExecuTorch's-format
    ETRecord (a path or an :class:`~edgeport.devtools.etrecord.ETRecord`)."""

    def __init__(self, etdump_path: str | os.PathLike, etrecord: Any = None,
                 source_time_scale: str = "ns", target_time_scale: str = "ms",
                 debug_buffer_path: str | os.PathLike | None = None) -> None:
        for scale in (source_time_scale, target_time_scale):
            if scale not in _SCALE:
                raise ValueError(f"time scale {scale!r}: use one of {sorted(_SCALE)}")
        self._factor = _SCALE[source_time_scale] / _SCALE[target_time_scale]
        self.target_time_scale = target_time_scale
        where = os.fspath(etdump_path)
        try:
            self._etdump = E.load_etdump(_read(etdump_path, "ETDump"), where)
        except EdgeportError as exc:
            raise InspectorError(str(exc)) from exc
        self._buffer = None if debug_buffer_path is None else _read(debug_buffer_path, "debug buffer")
        self._etrecord = self._load_etrecord(etrecord)
        self._nodes: dict[int, Any] = {}
        #: the ETDump holds intermediate outputs (loaded into ``Event.debug_data`` when a debug buffer is given)
        self.has_intermediate_outputs = False
        if self._etrecord is not None:
            program = self._etrecord.edge_programs().get("forward")
            if program is not None:
                self._nodes = {n.meta["debug_handle"]: n for n in program.graph.nodes
                               if n.op == "call_function" and isinstance(n.meta.get("debug_handle"), int)}
        self.event_blocks: list[EventBlock] = self._blocks(where)

    @staticmethod
    def _load_etrecord(etrecord: Any) -> Any:
        if etrecord is None or hasattr(etrecord, "edge_programs"):
            return etrecord
        from edgeport.devtools.etrecord import parse_etrecord

        return parse_etrecord(etrecord)

    # -- events --------------------------------------------------------------------------------------------
    def _maps(self) -> tuple[dict[str, Any], dict[str, Any]]:
        record = self._etrecord
        if record is None:
            return {}, {}
        dhm = (record._debug_handle_map or {}).get("forward", {})
        dm = (record._delegate_map or {}).get("forward", {})
        return {str(k): v for k, v in dhm.items()}, {str(k): v for k, v in dm.items()}

    def _blocks(self, where: str) -> list[EventBlock]:
        handle_map, delegate_map = self._maps()
        order: list[str] = []
        grouped: dict[str, dict[tuple, Event]] = {}
        runs: dict[str, int] = {}
        for bi, run in enumerate(self._etdump.run_data):
            name = run.name or f"block {bi}"
            if name not in grouped:
                order.append(name)
                grouped[name], runs[name] = {}, 0
            runs[name] += 1
            events = grouped[name]
            seen: dict[tuple, int] = {}
            for ei, ev in enumerate(run.events):
                pe, de = ev.profile_event, ev.debug_event
                if pe is not None:
                    ident = pe.delegate_debug_id_str if pe.delegate_debug_id_str else (
                        pe.delegate_debug_id_int if pe.delegate_debug_id_int not in (None, -1) else None)
                    key = (pe.name or "", pe.chain_index, pe.instruction_id, ident)
                    seen[key] = seen.get(key, 0) + 1
                    key = (*key, seen[key])  # the same signature twice in one run: separate events
                    event = events.get(key)
                    if event is None:
                        event = events[key] = self._new_event(pe.name or str(ident), pe.instruction_id,
                                                              pe.chain_index, ident, handle_map, delegate_map)
                    duration = (int(pe.end_time) - int(pe.start_time)) * self._factor
                    event.perf_data = event.perf_data or PerfData([])
                    event.perf_data.raw.append(duration)
                    if pe.delegate_debug_metadata:
                        event.delegate_debug_metadatas.append(bytes(pe.delegate_debug_metadata))
                        if not event.debug_handles:
                            self._resolve(event, _handles_in(bytes(pe.delegate_debug_metadata)))
                elif de is not None:
                    self.has_intermediate_outputs = True
                    if self._buffer is None:
                        continue  # profiling only: outputs are read when a debug buffer is given
                    value = _value(de.debug_entry, self._buffer, f"{where}: run {bi} event {ei}")
                    for event in events.values():  # the instruction's own (non-sub-) events get its outputs
                        if event.instruction_id == de.instruction_id and event.chain_index == de.chain_index \
                                and event.delegate_debug_identifier is None and event.name != "OPERATOR_CALL":
                            if len(event.debug_data) < runs[name]:
                                event.debug_data.append(value)
        return [EventBlock(n, list(grouped[n].values()), runs[n]) for n in order]

    def _new_event(self, name: str, instr: int, chain: int, ident: int | str | None, handle_map: dict[str, Any],
                   delegate_map: dict[str, Any]) -> Event:
        event = Event(name, instr, chain, ident)
        meta = delegate_map.get(str(instr))
        if ident is None:
            if name == "DELEGATE_CALL" and meta is not None:
                event.delegate_backend_name = meta.get("name")
            handles = handle_map.get(str(instr)) if name not in _WHOLE_METHOD else None
        else:
            event.is_delegated_op = True
            event.delegate_backend_name = meta.get("name") if meta else None
            inner = (meta or {}).get("delegate_map") or {}
            handles = inner.get(ident, inner.get(str(ident)))
        if handles is not None:
            self._resolve(event, handles if isinstance(handles, (list, tuple)) else [handles])
        return event

    def _resolve(self, event: Event, handles: Sequence[int]) -> None:
        event.debug_handles = tuple(int(h) for h in handles)
        for h in event.debug_handles:
            node = self._nodes.get(h)
            if node is None:
                continue
            target = getattr(node.target, "__name__", str(node.target)).removeprefix("aten.")
            event.op_types.append(target)
            if node.meta.get("stack_trace"):
                event.stack_traces[node.name] = node.meta["stack_trace"]
            if node.meta.get("nn_module_stack"):
                event.module_hierarchy[node.name] = dict(node.meta["nn_module_stack"])

    # -- tables --------------------------------------------------------------------------------------------
    def to_rows(self, include_delegate_debug_data: bool = True) -> list[dict[str, Any]]:
        """One dict per event and block (the columns of :meth:`to_dataframe`)."""
        rows = []
        for block in self.event_blocks:
            for event in block.events:
                if not include_delegate_debug_data and event.is_delegated_op:
                    continue
                rows.append({"event_block_name": block.name, **event.asdict()})
        return rows

    def to_dataframe(self, include_delegate_debug_data: bool = True) -> Any:
        """The event table as a pandas DataFrame (ExecuTorch's columns where they exist)."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("Inspector.to_dataframe needs pandas (pip install pandas); Inspector.to_rows() gives "
                              "the same table without it") from exc
        return pd.DataFrame(self.to_rows(include_delegate_debug_data))

    def print_data_tabular(self, file: TextIO | None = None, include_delegate_debug_data: bool = True) -> None:
        """Print the event table (block, event, op types, avg/min/max in the target time scale, backend)."""
        out = file or sys.stdout
        unit = self.target_time_scale
        head = ["block", "event", f"avg ({unit})", f"min ({unit})", f"max ({unit})", "runs", "op_types", "backend"]
        lines = [head]
        for r in self.to_rows(include_delegate_debug_data):
            lines.append([r["event_block_name"], str(r["event_name"])[:60],
                          *(f"{r[k]:.4f}" if r[k] is not None else "-" for k in ("avg", "min", "max")),
                          str(len(r["raw"])), ", ".join(r["op_types"])[:70], r["delegate_backend_name"] or ""])
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        for i, line in enumerate(lines):
            out.write("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() + "\n")
            if i == 0:
                out.write("  ".join("-" * w for w in widths) + "\n")

    def find_total_for_module(self, module_name: str) -> float:
        """Total average time (target scale) of the events whose operators belong to a module whose name contains
        ``module_name``. ``OPERATOR_CALL`` events and delegate sub-events are skipped, so each instruction counts
        once (the kernel's own event, the whole delegate call)."""
        total = 0.0
        for block in self.event_blocks:
            for event in block.events:
                if event.name == "OPERATOR_CALL" or event.is_delegated_op or event.perf_data is None:
                    continue
                if any(module_name in key for stack in event.module_hierarchy.values() for key in stack):
                    total += event.perf_data.avg
        return total

    def calculate_numeric_gap(self, distance: str = "MSE", inputs: Sequence[Any] | None = None) -> list[dict]:
        """Compare each instruction's recorded output (debug buffer, first run) with the same value in the ETRecord's
        edge program run eagerly on ``inputs`` (default: the ETRecord's representative inputs); ``distance``:
        ``"MSE"``, ``"L1"`` or ``"SNR"`` (dB). Returns one row per compared instruction."""
        from edgeport.devtools.inspector_numeric import numeric_gap

        if self._etrecord is None:
            raise InspectorError("calculate_numeric_gap needs the ETRecord (Inspector(..., etrecord=...))")
        if not self.has_intermediate_outputs:
            raise InspectorError("the ETDump holds no intermediate outputs: load the program with "
                                 "enable_etdump=True and debug_buffer_size > 0")
        if self._buffer is None:
            raise InspectorError("the intermediate outputs are in the debug buffer: pass debug_buffer_path=")
        return numeric_gap(self, distance, inputs)


def _handles_in(metadata: bytes) -> list[int]:
    """``debug_handles=1,2,3`` (what edgeport's executors put in a sub-event's metadata) -> ``[1, 2, 3]``."""
    text = metadata.decode("utf-8", "replace")
    if not text.startswith("debug_handles="):
        return []
    return [int(h) for h in text.removeprefix("debug_handles=").split(",") if h.strip().isdigit()]
