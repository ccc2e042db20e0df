"""ETDump (``.etdp``): what edgeport's runtime recorded while running a program, in ExecuTorch's format.

``Runtime.load_program(..., enable_etdump=True)`` (ExecuTorch's name) makes every method of the program record,
per execution, one profiling event per instruction: a kernel call as ``native_call_<op>.<overload>`` inside an
``OPERATOR_CALL``, a delegate call as ``DELEGATE_CALL``, with the chain and instruction index and start / end
times in nanoseconds (ExecuTorch's runtime uses the same tick on Linux); loading records ``Program::load_method``
and ``Method::init`` in a ``Default`` block. ``Program.write_etdump_result_to_file(path)`` writes them as a
size-prefixed ETDump flatbuffer that ExecuTorch's devtools (``deserialize_from_etdump_flatcc``, the Inspector)
read; :func:`load_etdump` reads one (edgeport's or ExecuTorch's). Off by default; when off the runtime does no
work for it. Torch-free.
"""

from __future__ import annotations

import struct
import time
import types
from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from edgeport.errors import ProgramError
from edgeport.program import schema as S
from edgeport.program.flatbuffer_writer import _Writer
from edgeport.program.layout import Layout, build_layout, read_schema_text
from edgeport.program.reader import _byte_view, _Decoder

__all__ = ["ETDUMP_VERSION", "ETDump", "ETDumpRecorder", "Event", "ProfileEvent", "RunData", "load_etdump",
           "serialize_etdump"]

ETDUMP_VERSION = 0  # what ExecuTorch 1.5.1 writes
FILE_IDENTIFIER = b"ED00"


class ValueType(IntEnum):
    Null = 0
    Int = 1
    Bool = 2
    Float = 3
    Double = 4
    Tensor = 5
    TensorList = 6
    String = 7


# --------------------------------------------------------------------------------------------- wire tables
@dataclass
class Null:
    pass


@dataclass
class Tensor:
    scalar_type: S.ScalarType = S.ScalarType.FLOAT
    sizes: list[int] = field(default_factory=list)
    strides: list[int] = field(default_factory=list)
    offset: int = 0


@dataclass
class Float:
    float_val: float = 0.0


@dataclass
class TensorList:
    tensors: list[Tensor] = field(default_factory=list)


@dataclass
class Value:
    val: ValueType = ValueType.Null
    tensor: Tensor | None = None
    tensor_list: TensorList | None = None
    int_value: Int | None = None
    float_value: Float | None = None
    double_value: Double | None = None
    bool_value: Bool | None = None
    output: Bool | None = None


@dataclass
class DebugEvent:
    chain_index: int = 0
    instruction_id: int = -1
    debug_entry: Value | None = None
    delegate_debug_id_int: int = -1
    delegate_debug_id_str: str | None = None
    name: str | None = None


@dataclass
class AllocationEvent:
    allocator_id: int = 0
    allocation_size: int = 0


@dataclass
class ProfileEvent:
    name: str | None = None
    chain_index: int = 0
    instruction_id: int = -1
    delegate_debug_id_int: int = -1
    delegate_debug_id_str: str | None = None
    delegate_debug_metadata: bytes | None = None
    start_time: int = 0
    end_time: int = 0


@dataclass
class Event:
    profile_event: ProfileEvent | None = None
    allocation_event: AllocationEvent | None = None
    debug_event: DebugEvent | None = None


@dataclass
class Allocator:
    name: str | None = None


@dataclass
class RunData:
    name: str | None = None
    bundled_input_index: int = -1
    allocators: list[Allocator] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


@dataclass
class ETDump:
    version: int = ETDUMP_VERSION
    run_data: list[RunData] = field(default_factory=list)


# Int, Bool, Double and String have the same fields as the program's tables of those names: shared
Int, Bool, Double, String = S.Int, S.Bool, S.Double, S.String
_CLASSES: dict[str, type] = {
    "Null": Null, "Tensor": Tensor, "Int": Int, "Bool": Bool, "Float": Float, "Double": Double, "String": String,
    "TensorList": TensorList, "Value": Value, "DebugEvent": DebugEvent, "AllocationEvent": AllocationEvent,
    "ProfileEvent": ProfileEvent, "Event": Event, "Allocator": Allocator, "RunData": RunData, "ETDump": ETDump,
}


@lru_cache(maxsize=1)
def _layout() -> Layout:
    text = resources.files("edgeport.devtools").joinpath("etdump.fbs").read_text(encoding="utf-8")
    lay = build_layout([read_schema_text("scalar_type.fbs"), text], _CLASSES,
                       types.SimpleNamespace(ScalarType=S.ScalarType, ValueType=ValueType))
    if lay.file_identifier != FILE_IDENTIFIER or lay.root != "ETDump":
        raise RuntimeError('etdump.fbs must declare file_identifier "ED00" and root_type ETDump')
    return lay


def serialize_etdump(etdump: ETDump) -> bytes:
    """The size-prefixed ETDump flatbuffer of ``etdump`` (as ExecuTorch's runtime writes it)."""
    import flatbuffers

    builder = flatbuffers.Builder(4096)
    root = _Writer(_layout(), 8, 8).packers["ETDump"](builder, etdump)
    builder.FinishSizePrefixed(root, file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def load_etdump(data: Any, name: str = "<bytes>") -> ETDump:
    """Parse and check a size-prefixed ETDump (edgeport's or ExecuTorch's); ``ProgramError`` names the problem."""
    view = _byte_view(data)
    n = len(view)
    if n < 12:
        raise ProgramError(f"ETDump {name}: {n} bytes, too short")
    (size,) = struct.unpack_from("<I", view, 0)
    if size + 4 > n or size < 8:
        raise ProgramError(f"ETDump {name}: the size prefix says {size} bytes, the file has {n - 4} after it")
    body = view[4:4 + size]
    if bytes(body[4:8]) != FILE_IDENTIFIER:
        raise ProgramError(f"ETDump {name}: file identifier {bytes(body[4:8])!r}, expected {FILE_IDENTIFIER!r}")
    (root,) = struct.unpack_from("<I", body, 0)
    if not 8 <= root < size:
        raise ProgramError(f"ETDump {name}: root table offset {root} is outside the buffer ({size} bytes)")
    dec = _Decoder(_layout())
    dec.start(view, 4 + size)  # offsets are relative; alignment counts from the file's first byte (the prefix)
    try:
        return dec.table("ETDump", 4 + root, "etdump")
    except ProgramError as exc:
        raise ProgramError(f"ETDump {name}: {exc}") from None
    finally:
        dec.finish()


# --------------------------------------------------------------------------------------------- recording
def now_ns() -> int:
    return time.perf_counter_ns()


class DelegateEventTracer:
    """What an executor's ``set_event_tracer(handle, tracer)`` receives while a program records an ETDump.

    During ``execute`` the executor calls :meth:`log_profiling_delegate` once per step it can time (ExecuTorch's
    ``event_tracer_log_profiling_delegate``); the event lands in the current run, attached to the delegate call
    being executed. Times are nanoseconds from :meth:`now_ns` (``time.perf_counter_ns``), the clock of every
    other event of the ETDump."""

    __slots__ = ("_events", "_chain", "_instruction")

    def __init__(self) -> None:
        self._events: list[tuple] | None = None
        self._chain = -1
        self._instruction = -1

    now_ns = staticmethod(time.perf_counter_ns)

    def log_profiling_delegate(self, name: str | None, delegate_debug_id: int | str, start_ns: int, end_ns: int,
                               metadata: bytes = b"", debug_handles: tuple[int, ...] = ()) -> None:
        """One timed step of the delegate. ``delegate_debug_id``: an int or a str that the backend's
        ``PreprocessResult.debug_handle_map`` maps to edge nodes (ExecuTorch's Inspector looks it up there);
        ``debug_handles``: the edge nodes' handles, when the executor knows them itself (kept in the event's
        metadata, which edgeport's Inspector reads)."""
        events = self._events
        if events is None:
            return  # not inside a recorded run (e.g. the executor was called directly)
        if debug_handles:
            metadata = metadata or ("debug_handles=" + ",".join(map(str, debug_handles))).encode()
        events.append((_DELEGATE_EVENT, self._chain, self._instruction, int(start_ns), int(end_ns), name,
                       delegate_debug_id, bytes(metadata)))


_DELEGATE_EVENT = "\0delegate"  # marks a delegate sub-event among a run's raw tuples
_DEBUG_EVENT = "\0debug"  # marks an intermediate output (a DebugEvent) among them


class ETDumpRecorder:
    """Collects the event blocks of one program's runs (the runtime calls it; users call ``write``).

    Runs are kept as the runtime's raw tuples and turned into ETDump tables only when written, so recording
    costs a clock read and a tuple per instruction."""

    def __init__(self, debug_buffer_size: int = 0) -> None:
        self._loading: list[tuple[str, int, int]] = []
        self._runs: list[list[tuple]] = []
        #: intermediate outputs: each recorded value's bytes, 16-byte aligned (the debug buffer ExecuTorch writes
        #: beside its ETDump); recorded only when ``debug_buffer_size`` > 0, up to that many bytes
        self.debug_buffer_size = max(0, int(debug_buffer_size))
        self.debug_buffer = bytearray()
        self.dropped_bytes = 0  # what did not fit: write() warns with the size that would have been needed

    @property
    def records_outputs(self) -> bool:
        return self.debug_buffer_size > 0

    def _store(self, array: np.ndarray) -> Tensor | None:
        data = np.ascontiguousarray(array)
        start = (len(self.debug_buffer) + 15) // 16 * 16
        if start + data.nbytes > self.debug_buffer_size:
            self.dropped_bytes += data.nbytes
            return None
        self.debug_buffer.extend(b"\0" * (start - len(self.debug_buffer)))
        self.debug_buffer.extend(data.tobytes())
        strides = [st // data.itemsize for st in data.strides] if data.itemsize else []
        return Tensor(S.scalar_type_from_numpy(data.dtype), list(data.shape), strides, start)

    def output_event(self, events: list[tuple], chain: int, instruction: int, value: Any) -> None:
        """The value an instruction produced (a kernel's outs, a delegate's outputs), as a debug event of the run
        (ExecuTorch's intermediate-output logging). Values that are neither arrays, lists of arrays nor scalars
        are not recorded."""
        entry = self._value(value)
        if entry is not None:
            events.append((_DEBUG_EVENT, chain, instruction, DebugEvent(chain, instruction, entry)))

    def _value(self, value: Any) -> Value | None:
        if isinstance(value, np.ndarray):
            t = self._store(value)
            return None if t is None else Value(ValueType.Tensor, tensor=t)
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, np.ndarray) for v in value):
            if len(value) == 1:
                return self._value(value[0])
            tensors = [self._store(v) for v in value]
            if any(t is None for t in tensors):
                return None
            return Value(ValueType.TensorList, tensor_list=TensorList([t for t in tensors if t is not None]))
        if isinstance(value, (bool, np.bool_)):
            return Value(ValueType.Bool, bool_value=Bool(bool(value)))
        if isinstance(value, (int, np.integer)):
            return Value(ValueType.Int, int_value=Int(int(value)))
        if isinstance(value, (float, np.floating)):
            return Value(ValueType.Double, double_value=Double(float(value)))
        return None

    def loading_event(self, name: str, start: int, end: int) -> None:
        self._loading.append((name, start, end))

    def execution(self, events: list[tuple[str, int, int, int, int]]) -> None:
        """One method execution: ``(name, chain, instruction, start_ns, end_ns)`` per kernel or delegate call
        (``name``: ``op.overload`` for a kernel, ``DELEGATE_CALL`` for a delegate)."""
        self._runs.append(events)

    def etdump(self) -> ETDump:
        blocks = []
        if self._loading:
            blocks.append(RunData(name="Default", events=[
                Event(profile_event=ProfileEvent(name=n, chain_index=-1, instruction_id=0, start_time=a, end_time=b))
                for n, a, b in self._loading]))
        for run in list(self._runs):
            block = RunData(name="Execute")
            for event in run:
                if event[0] == _DEBUG_EVENT:
                    block.events.append(Event(debug_event=event[3]))
                    continue
                if event[0] == _DELEGATE_EVENT:
                    _, chain, instr, start, end, sub_name, debug_id, metadata = event
                    is_int = isinstance(debug_id, int)
                    block.events.append(Event(profile_event=ProfileEvent(
                        name=sub_name or "", chain_index=chain, instruction_id=instr,
                        delegate_debug_id_int=debug_id if is_int else -1,
                        delegate_debug_id_str=None if is_int else str(debug_id),
                        delegate_debug_metadata=metadata or None, start_time=start, end_time=end)))
                    continue
                name, chain, instr, start, end = event
                if name != "DELEGATE_CALL":
                    block.events.append(Event(profile_event=ProfileEvent(
                        name=f"native_call_{name}", chain_index=chain, instruction_id=instr, start_time=start,
                        end_time=end)))
                    name = "OPERATOR_CALL"
                block.events.append(Event(profile_event=ProfileEvent(
                    name=name, chain_index=chain, instruction_id=instr, start_time=start, end_time=end)))
            blocks.append(block)
        return ETDump(ETDUMP_VERSION, blocks)

    def write(self, path: str, debug_buffer_path: str | None = None) -> None:
        import os

        if self.dropped_bytes:
            import warnings

            warnings.warn(f"the debug buffer ({self.debug_buffer_size} bytes) was too small: {self.dropped_bytes} "
                          "bytes of intermediate outputs were not recorded (their debug events are missing); load "
                          f"the program with debug_buffer_size >= {len(self.debug_buffer) + self.dropped_bytes + 4096}",
                          RuntimeWarning, stacklevel=3)
        if debug_buffer_path is not None:
            with open(debug_buffer_path, "wb") as f:
                f.write(self.debug_buffer)
        data = serialize_etdump(self.etdump())
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
