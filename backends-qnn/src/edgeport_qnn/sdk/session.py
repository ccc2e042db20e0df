"""A small, safe wrapper over the QNN C API: backend + device, contexts, graph building, execution, and the
context binary (QNN's ahead-of-time artefact) saved and loaded back.

Every argument is checked in Python before a pointer reaches C; every QNN failure becomes :class:`QnnError`.
Handles are freed exactly once: by ``close()``/``with``, or by a finalizer when an object is collected or the
interpreter exits. Contexts are freed before their backend. All QNN calls of one backend are serialized.
"""

from __future__ import annotations

import ctypes as C
import logging
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeport_qnn.sdk import abi
from edgeport_qnn.sdk.errors import QnnError
from edgeport_qnn.sdk.interface import LogCallback
from edgeport_qnn.sdk.loader import FunctionTable, backend_table
from edgeport_qnn.sdk.locate import QnnLibraries, find_qnn_libraries
from edgeport_qnn.sdk.tensors import Keep, TensorSpec, make_tensor

if TYPE_CHECKING:
    from edgeport_qnn.sdk.builder import GraphBuilder

_logger = logging.getLogger("edgeport_qnn.sdk")

try:
    _vsnprintf = C.CDLL(None).vsnprintf
    _vsnprintf.argtypes = [C.c_char_p, C.c_size_t, C.c_char_p, C.c_void_p]
    _vsnprintf.restype = C.c_int
except (OSError, AttributeError):  # pragma: no cover - no C library symbols in the process
    _vsnprintf = None


class _LogSink:
    """Receives QNN's log messages (instead of QNN printing them), keeps the recent ones for error reports and
    forwards them to the ``edgeport_qnn.sdk`` logger at DEBUG level."""

    def __init__(self) -> None:
        self.records: deque[tuple[int, int, str]] = deque(maxlen=64)
        self.seq = 0
        self.callback = LogCallback(self._on_message)

    def _on_message(self, fmt: bytes | None, level: int, timestamp: int, args: int | None) -> None:
        try:
            if _vsnprintf is not None and fmt:
                buf = C.create_string_buffer(1024)
                _vsnprintf(buf, len(buf), fmt, args)
                raw = buf.value
            else:
                raw = fmt or b""
            text = raw.decode("utf-8", errors="replace").strip()
            self.seq += 1
            self.records.append((self.seq, level, text))
            _logger.debug("QNN log (level %d): %s", level, text)
        except BaseException:  # noqa: BLE001 - nothing may propagate into C
            pass

    def since(self, mark: int, max_level: int = abi.LogLevel.WARN) -> list[str]:
        return [text for seq, level, text in self.records if seq > mark and level <= max_level]


class _Handles:
    """Mutable holder shared between an object and its finalizer (which must not reference the object)."""

    def __init__(self) -> None:
        self.backend: int | None = None
        self.device: int | None = None
        self.log: int | None = None
        self.context: int | None = None
        self.devices: dict[int, int] = {}  # SoC-configured devices: socModel -> handle
        self.children: list[weakref.finalize] = []


def _free_backend(table: FunctionTable, h: _Handles, sink: _LogSink | None, lock: threading.RLock) -> None:
    with lock:
        for child in reversed(h.children):
            child()
        h.children.clear()
        for handle in h.devices.values():
            table.deviceFree(handle)
        h.devices.clear()
        if h.device is not None:
            table.deviceFree(h.device)
            h.device = None
        if h.backend is not None:
            table.backendFree(h.backend)
            h.backend = None
        if h.log is not None:
            table.logFree(h.log)
            h.log = None
    del sink  # the log callback stays alive until after logFree


def _free_context(table: FunctionTable, h: _Handles, lock: threading.RLock) -> None:
    with lock:
        if h.context is not None:
            table.contextFree(h.context, None)
            h.context = None


class QnnBackend:
    """A QNN backend (``"htp"``: Hexagon tensor processor; on x86 its kernels run in Qualcomm's emulator) with
    its device. Create with :meth:`load`; use as a context manager or call :meth:`close`."""

    def __init__(self, table: FunctionTable, libraries: QnnLibraries, kind: str, log_level: int | None) -> None:
        self._table = table
        self.libraries = libraries
        self.kind = kind
        self._lock = threading.RLock()
        self._h = _Handles()
        #: SoC of the device created last: the HTP's backend-level op validation follows that device's architecture
        self.last_device_soc: int | None = None
        self._sink = _LogSink() if log_level is not None else None
        self._finalizer = weakref.finalize(self, _free_backend, table, self._h, self._sink, self._lock)
        try:
            if self._sink is not None:
                log = C.c_void_p()
                self.call(table.logCreate, self._sink.callback, int(log_level), C.byref(log), what="logCreate")
                self._h.log = log.value
            backend = C.c_void_p()
            self.call(table.backendCreate, self._h.log, None, C.byref(backend), what="backendCreate")
            self._h.backend = backend.value
            device = C.c_void_p()
            self.call(table.deviceCreate, self._h.log, None, C.byref(device), what="deviceCreate")
            self._h.device = device.value
        except BaseException:
            self.close()
            raise

    @classmethod
    def load(cls, kind: str = "htp", *, libraries: QnnLibraries | None = None,
             log_level: abi.LogLevel | None = abi.LogLevel.ERROR) -> QnnBackend:
        """Load backend ``kind`` from the located QNN libraries. ``log_level`` is the most verbose QNN message
        level captured (messages go to the ``edgeport_qnn.sdk`` logger at DEBUG and into :class:`QnnError`
        reports); ``None`` registers no log callback, leaving QNN to print to stdout itself."""
        libraries = libraries or find_qnn_libraries()
        table = backend_table(libraries.backend(kind))
        return cls(table, libraries, kind, log_level)

    # ------------------------------------------------------------------------------------------ info
    @property
    def provider_name(self) -> str:
        return (self._table.provider.provider_name or b"").decode(errors="replace")

    @property
    def backend_id(self) -> int:
        return int(self._table.provider.backend_id)

    @property
    def api_version(self) -> tuple[str, str]:
        """(core API version, backend API version) of the loaded provider."""
        v = self._table.provider.api_version
        return str(v.core), str(v.backend)

    @property
    def build_id(self) -> str:
        out = C.c_char_p()
        self.call(self._table.backendGetBuildId, C.byref(out), what="backendGetBuildId")
        return (out.value or b"").decode(errors="replace")

    @property
    def closed(self) -> bool:
        return self._h.backend is None

    # ------------------------------------------------------------------------------------------ calls
    def call(self, fn: Any, *args: Any, what: str, op: str | None = None) -> None:
        """Call QNN entry ``fn`` under this backend's lock; raise :class:`QnnError` unless it succeeds."""
        with self._lock:
            mark = self._sink.seq if self._sink is not None else 0
            status = fn(*args)
            code = abi.error_code(status)
            if code == abi.SUCCESS:
                return
            log = self._sink.since(mark) if self._sink is not None else []
        raise QnnError(f"{what} failed", code, op=op, detail=self._error_message(status), library_log=log)

    def _error_message(self, status: int) -> str | None:
        try:
            text = C.c_char_p()
            if abi.error_code(self._table.errorGetMessage(status, C.byref(text))) == abi.SUCCESS and text.value:
                message = text.value.decode(errors="replace")
                return message.split(": ", 1)[1] if ": " in message else message
        except QnnError:
            pass
        return None

    def _require_open(self) -> None:
        if self.closed:
            raise QnnError("the QNN backend is closed")

    def _adopt(self, finalizer: weakref.finalize) -> None:
        self._h.children = [f for f in self._h.children if f.alive]
        self._h.children.append(finalizer)

    # ------------------------------------------------------------------------------------------ contexts
    def device(self, soc_model: int | None = None) -> int | None:
        """The device handle for QNN SoC id ``soc_model`` (created once, configured with the SoC, from which the
        HTP takes its architecture: e.g. 57 = SM8650, v75); ``None``: the backend's default device (on the x86
        emulator: HTP v68)."""
        if soc_model is None:
            return self._h.device
        soc = int(soc_model)
        with self._lock:
            self._require_open()
            if soc not in self._h.devices:
                from edgeport_qnn.sdk.configs import config_list, htp_device_records

                keep = Keep()
                configs = config_list(htp_device_records(soc, keep), keep) if self.kind == "htp" else None
                out = C.c_void_p()
                self.call(self._table.deviceCreate, self._h.log, configs, C.byref(out),
                          what=f"deviceCreate for SoC {soc}")
                self._h.devices[soc] = out.value
                self.last_device_soc = soc
                _SOC_CONFIGURED.set()
            return self._h.devices[soc]

    @property
    def soc_configured(self) -> bool:
        """Whether a SoC-configured device was created in this process (by any backend instance). On the x86
        emulator this is sticky for the process: every float32 graph prepared afterwards, on any device, runs at
        fp16 precision."""
        return _SOC_CONFIGURED.is_set()

    def create_context(self, soc_model: int | None = None) -> Context:
        """A new, empty context to build graphs in, on the device of ``soc_model`` (see :meth:`device`)."""
        return Context._create(self, soc_model)

    def load_context(self, binary: bytes | bytearray | memoryview, *, raw: bool = False,
                     probe: bool = True, soc_model: int | None = None) -> Context:
        """A context loaded from a context binary (see :meth:`Context.from_binary`)."""
        return Context.from_binary(self, binary, raw=raw, probe=probe, soc_model=soc_model)

    def close(self) -> None:
        """Free the device, the backend and the log handle (and any context still open). Idempotent."""
        self._finalizer()

    def __enter__(self) -> QnnBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<QnnBackend {self.kind} {self.provider_name} api={self.api_version[0]} {state}>"


_SOC_CONFIGURED = threading.Event()  #: a SoC-configured HTP device was created in this process (see soc_configured)
_STAGE_BYTES = 16384  #: inputs/outputs up to this size are copied through buffers bound once


class Graph:
    """A finalized graph: run it with :meth:`execute`."""

    def __init__(self, context: Context, name: str, handle: int, inputs: Sequence[tuple[TensorSpec, int]],
                 outputs: Sequence[tuple[TensorSpec, int]]) -> None:
        self.context = context
        self.name = name
        self._handle = handle
        self.inputs: tuple[TensorSpec, ...] = tuple(spec for spec, _ in inputs)
        self.outputs: tuple[TensorSpec, ...] = tuple(spec for spec, _ in outputs)
        keep = self._keep = Keep()
        self._in_templates = [make_tensor(s, abi.TensorType.APP_WRITE, keep, tensor_id=i) for s, i in inputs]
        self._out_templates = [make_tensor(s, abi.TensorType.APP_READ, keep, tensor_id=i) for s, i in outputs]
        # the tensor arrays graphExecute reads, built once: a run only points their buffers at its arrays (under
        # the backend lock), so per-run Python work stays small (it is most of a small graph's latency)
        self._ins = (abi.Tensor * max(len(self._in_templates), 1))(*self._in_templates)
        self._outs = (abi.Tensor * max(len(self._out_templates), 1))(*self._out_templates)
        self._in_bufs = [self._ins[i].v1.client_buf for i in range(len(self.inputs))]
        self._out_bufs = [self._outs[i].v1.client_buf for i in range(len(self.outputs))]
        for buf, spec in (*zip(self._in_bufs, self.inputs), *zip(self._out_bufs, self.outputs)):
            buf.data_size = spec.nbytes
        self._out_alloc = [(spec.shape, spec.dtype) for spec in self.outputs]
        # small tensors go through buffers bound once (a copy costs less than binding a new array's address);
        # large ones are bound per run (no copy)
        self._in_stage = [np.empty(spec.shape, spec.dtype) if spec.nbytes <= _STAGE_BYTES else None
                          for spec in self.inputs]
        self._out_stage = [np.empty(spec.shape, spec.dtype) if spec.nbytes <= _STAGE_BYTES else None
                           for spec in self.outputs]
        for buf, stage in (*zip(self._in_bufs, self._in_stage), *zip(self._out_bufs, self._out_stage)):
            if stage is not None:
                buf.data = stage.ctypes.data
        self._in_expected = [(spec.dtype, spec.shape) for spec in self.inputs]
        self._ins_ptr = C.cast(self._ins, C.POINTER(abi.Tensor))
        self._outs_ptr = C.cast(self._outs, C.POINTER(abi.Tensor))
        self._n_in, self._n_out = len(self.inputs), len(self.outputs)
        self._execute = context.backend._table.graphExecute
        self._what = f"graphExecute of graph {name!r}"

    def _check_inputs(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        if type(inputs) not in (list, tuple) and (isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence)):
            raise ValueError(f"graph {self.name!r}: inputs must be a list of numpy arrays")
        if len(inputs) != len(self.inputs):
            raise ValueError(f"graph {self.name!r} takes {len(self.inputs)} inputs, got {len(inputs)}")
        for i, ((dtype, shape), array) in enumerate(zip(self._in_expected, inputs)):
            # a run's hot path: plain comparisons (dtype + shape imply the byte size QNN reads)
            if type(array) is not np.ndarray or array.dtype != dtype or array.shape != shape or not (
                    array.flags.c_contiguous and array.flags.aligned):
                self._explain(i, array)
        return inputs

    def _explain(self, index: int, array: Any) -> None:
        spec = self.inputs[index]
        dtype, shape = spec.dtype, spec.shape
        if not isinstance(array, np.ndarray):
            raise ValueError(f"input {spec.name!r}: expected a numpy array, got {type(array).__name__}")
        if array.dtype != dtype:
            raise ValueError(f"input {spec.name!r}: dtype {array.dtype} != expected {dtype}")
        if array.shape != shape:
            raise ValueError(f"input {spec.name!r}: shape {array.shape} != expected {shape}")
        if not (array.flags.c_contiguous and array.flags.aligned):
            raise ValueError(f"input {spec.name!r}: array must be C-contiguous and aligned "
                             "(use numpy.ascontiguousarray)")
        if type(array) is not np.ndarray:  # a subclass: its buffer is still the array's
            return

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the graph once. ``inputs`` match :attr:`inputs` exactly (dtype, shape, C-contiguous); returns
        fresh output arrays (quantized outputs hold raw values: dequantize with their ``quant``)."""
        arrays = self._check_inputs(inputs)
        backend = self.context.backend
        with backend._lock:
            self.context._require_open()
            for buf, stage, array in zip(self._in_bufs, self._in_stage, arrays):
                if stage is None:
                    buf.data = array.ctypes.data
                else:
                    np.copyto(stage, array)
            fresh = [None if stage is not None else np.empty(shape, dtype)
                     for stage, (shape, dtype) in zip(self._out_stage, self._out_alloc)]
            for buf, array in zip(self._out_bufs, fresh):
                if array is not None:
                    buf.data = array.ctypes.data
            sink = backend._sink
            mark = sink.seq if sink is not None else 0
            status = self._execute(self._handle, self._ins_ptr, self._n_in, self._outs_ptr, self._n_out, None, None)
            code = status & 0xFFFF
            if code != abi.SUCCESS:  # what QnnBackend.call raises, inlined for the hot path
                raise QnnError(f"{self._what} failed", code, detail=backend._error_message(status),
                               library_log=sink.since(mark) if sink is not None else [])
            return [array if array is not None else stage.copy() for array, stage in zip(fresh, self._out_stage)]

    def __repr__(self) -> str:
        return f"<Graph {self.name!r} inputs={[s.name for s in self.inputs]} outputs={[s.name for s in self.outputs]}>"


class Context:
    """A QNN context: holds graphs; serializes to / loads from a context binary."""

    def __init__(self, backend: QnnBackend, handle: int) -> None:
        self.backend = backend
        self._h = _Handles()
        self._h.context = handle
        self._finalizer = weakref.finalize(self, _free_context, backend._table, self._h, backend._lock)
        backend._adopt(self._finalizer)
        self.graphs: dict[str, Graph] = {}
        self._builders: list[Any] = []
        self._keep = Keep()
        self._loaded_from: C.Array | None = None
        self.soc_model: int | None = None  #: the SoC of the device it was created on (None: default device)

    @classmethod
    def _create(cls, backend: QnnBackend, soc_model: int | None = None) -> Context:
        with backend._lock:
            backend._require_open()
            device = backend.device(soc_model)
            out = C.c_void_p()
            backend.call(backend._table.contextCreate, backend._h.backend, device, None, C.byref(out),
                         what="contextCreate")
            context = cls(backend, out.value)
            context.soc_model = None if soc_model is None else int(soc_model)
            return context

    @classmethod
    def from_binary(cls, backend: QnnBackend, binary: bytes | bytearray | memoryview, *, raw: bool = False,
                    probe: bool = True, soc_model: int | None = None) -> Context:
        """Load a context binary and retrieve its graphs (``context.graphs``).

        By default ``binary`` is edgeport's sealed form (:meth:`context_binary`): its size and SHA-256 are checked
        before QNN sees a byte. With ``raw=True`` it is QNN's own format (:meth:`raw_context_binary`, or from
        Qualcomm's tools); since QNN's parsers can crash on corrupted input, such bytes are first loaded and run
        once in a child process (``probe=False`` skips that, for bytes you trust). Corrupted, truncated or foreign
        binaries raise :class:`QnnError` (``ValueError``/``TypeError`` for empty or non-bytes input)."""
        from edgeport_qnn.sdk.binary import load_context

        return load_context(cls, backend, binary, raw=raw, probe=probe, soc_model=soc_model)

    @property
    def closed(self) -> bool:
        return self._h.context is None

    @property
    def handle(self) -> int:
        self._require_open()
        assert self._h.context is not None
        return self._h.context

    def _require_open(self) -> None:
        self.backend._require_open()
        if self.closed:
            raise QnnError("the QNN context is closed")

    def graph_builder(self, name: str, *, fp16: bool = False, optimization_level: int | None = None,
                      vtcm_mb: int | None = None) -> GraphBuilder:
        """Start building graph ``name`` in this context. HTP graph options: ``fp16`` runs float32 tensors in fp16
        precision, ``optimization_level`` (1-3) is the finalize optimization level, ``vtcm_mb`` the VTCM size."""
        from edgeport_qnn.sdk.builder import GraphBuilder

        return GraphBuilder(self, name, fp16=fp16, optimization_level=optimization_level, vtcm_mb=vtcm_mb)

    def graph(self, name: str | None = None) -> Graph:
        """Graph ``name`` (or the only graph)."""
        if name is None:
            if len(self.graphs) != 1:
                raise ValueError(f"context holds {len(self.graphs)} graphs {sorted(self.graphs)}; name one")
            return next(iter(self.graphs.values()))
        try:
            return self.graphs[name]
        except KeyError:
            raise ValueError(f"no graph {name!r} in this context; graphs: {sorted(self.graphs)}") from None

    def context_binary(self) -> bytes:
        """The context (all graphs finalized) as edgeport's sealed context binary: QNN's ahead-of-time artefact
        behind a header carrying its size and SHA-256, so that corruption is caught before QNN parses it."""
        from edgeport_qnn.sdk.binary import seal

        return seal(self.raw_context_binary())

    def raw_context_binary(self) -> bytes:
        """The context serialized in QNN's own format (what Qualcomm's tools load)."""
        backend = self.backend
        with backend._lock:
            self._require_open()
            if self._loaded_from is not None:  # QNN cannot re-serialize a deserialized context
                return bytes(self._loaded_from)
            pending = [b.name for b in self._builders if not b.finalized]
            if pending:
                raise QnnError(f"cannot serialize the context: graphs {pending} are not finalized")
            size = abi.ContextBinarySize()
            backend.call(backend._table.contextGetBinarySize, self.handle, C.byref(size), what="contextGetBinarySize")
            if not 0 < size.value < 2**40:
                raise QnnError(f"contextGetBinarySize returned {size.value}")
            buffer = C.create_string_buffer(size.value)
            written = abi.ContextBinarySize()
            backend.call(backend._table.contextGetBinary, self.handle, buffer, size.value, C.byref(written),
                         what="contextGetBinary")
            if not 0 < written.value <= size.value:
                raise QnnError(f"contextGetBinary wrote {written.value} bytes into a {size.value}-byte buffer")
            return buffer.raw[: written.value]

    def close(self) -> None:
        """Free the context (its graphs become unusable). Idempotent."""
        self._finalizer()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Context", "Graph", "QnnBackend", "QnnError"]
