"""Loading a QNN context binary: described by QNN's system library, created by the backend, graphs retrieved."""

from __future__ import annotations

import ctypes as C
from typing import TYPE_CHECKING

from edgeport_qnn.sdk import abi
from edgeport_qnn.sdk.errors import QnnError
from edgeport_qnn.sdk.interface import BinaryInfo
from edgeport_qnn.sdk.loader import system_table
from edgeport_qnn.sdk.tensors import TensorSpec, spec_from_tensor

if TYPE_CHECKING:
    from edgeport_qnn.sdk.session import Context, QnnBackend

MIN_BINARY_SIZE = 64  # far below any real context binary (a one-node graph is ~48 KiB)
MAX_BINARY_SIZE = 2**40
_MAX_GRAPHS = 4096
_MAX_GRAPH_TENSORS = 65536

GraphMeta = tuple[str, list[tuple[TensorSpec, int]], list[tuple[TensorSpec, int]]]


def _as_buffer(binary: object) -> C.Array:
    if isinstance(binary, str) or not isinstance(binary, (bytes, bytearray, memoryview)):
        raise TypeError(f"a context binary is bytes-like, got {type(binary).__name__}")
    view = memoryview(binary)
    if not view.c_contiguous:
        raise ValueError("the context binary buffer must be contiguous")
    data = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    if len(data) == 0:
        raise ValueError("empty context binary")
    if len(data) < MIN_BINARY_SIZE:
        raise ValueError(f"context binary of {len(data)} bytes is too short to be valid (truncated?)")
    if len(data) > MAX_BINARY_SIZE:
        raise ValueError(f"context binary of {len(data)} bytes is implausibly large")
    buffer = (C.c_char * len(data))()  # our own copy: QNN may read it for as long as the context lives
    C.memmove(buffer, bytes(data), len(data))
    return buffer


def _tensors(array: object, count: int, graph: str, what: str) -> list[tuple[TensorSpec, int]]:
    if count > _MAX_GRAPH_TENSORS or (count and not array):
        raise ValueError(f"graph {graph!r}: implausible {what} list ({count} tensors)")
    out = []
    for i in range(count):
        tensor = array[i]  # type: ignore[index]
        out.append((spec_from_tensor(tensor), int(tensor.v1.id)))
    return out


def describe_binary(backend: QnnBackend, buffer: C.Array) -> tuple[int, list[GraphMeta]]:
    """(backend id, graphs) of a context binary, read with the system library; :class:`QnnError` if rejected."""
    table = system_table(backend.libraries.system)
    handle = C.c_void_p()
    status = table.systemContextCreate(C.byref(handle))
    if abi.error_code(status) != abi.SUCCESS:
        raise QnnError("systemContextCreate failed", abi.error_code(status))
    try:
        info = C.POINTER(BinaryInfo)()
        size = abi.ContextBinarySize()
        status = table.systemContextGetBinaryInfo(handle, buffer, len(buffer), C.byref(info), C.byref(size))
        if abi.error_code(status) != abi.SUCCESS:
            raise QnnError("not a valid QNN context binary (the system library rejects it)", abi.error_code(status))
        if not info:
            raise QnnError("the system library returned no context-binary description")
        described = info.contents
        if described.version in (1, 2):
            body = described.v1
        elif described.version == 3:
            body = described.v3
        else:
            raise QnnError(f"unsupported context-binary description version {described.version}")
        if not 0 < body.num_graphs <= _MAX_GRAPHS or not body.graphs:
            raise QnnError(f"context binary describes {body.num_graphs} graphs")
        graphs: list[GraphMeta] = []
        try:
            for i in range(body.num_graphs):
                entry = body.graphs[i]
                if entry.version not in (1, 2, 3):
                    raise ValueError(f"unsupported graph description version {entry.version}")
                g = entry.v1  # versions 2 and 3 extend version 1 at the end
                if not g.graph_name:
                    raise ValueError("graph without a name")
                name = g.graph_name.decode("ascii", errors="replace")
                graphs.append((name, _tensors(g.inputs, g.num_inputs, name, "input"),
                               _tensors(g.outputs, g.num_outputs, name, "output")))
        except ValueError as exc:
            raise QnnError("context binary carries an unusable graph description", detail=str(exc)) from exc
        if len({name for name, _, _ in graphs}) != len(graphs):
            raise QnnError("context binary has duplicate graph names")
        return int(body.backend_id), graphs
    finally:
        table.systemContextFree(handle)


def load_context(cls: type[Context], backend: QnnBackend, binary: bytes | bytearray | memoryview) -> Context:
    """Implementation of :meth:`Context.from_binary`."""
    from edgeport_qnn.sdk.session import Graph

    buffer = _as_buffer(binary)
    backend._require_open()
    backend_id, graphs = describe_binary(backend, buffer)
    if backend_id != backend.backend_id:
        raise QnnError(f"context binary is for QNN backend id {backend_id}, this backend is {backend.backend_id} "
                       f"({backend.kind})")
    for name, inputs, outputs in graphs:
        if not inputs or not outputs:
            raise QnnError(f"graph {name!r} in the context binary has no inputs or no outputs")
    table = backend._table
    with backend._lock:
        backend._require_open()
        out = C.c_void_p()
        backend.call(table.contextCreateFromBinary, backend._h.backend, backend._h.device, None, buffer,
                     len(buffer), C.byref(out), None, what="contextCreateFromBinary")
        context = cls(backend, out.value)
        context._keep(buffer)
        try:
            for name, inputs, outputs in graphs:
                handle = C.c_void_p()
                backend.call(table.graphRetrieve, context.handle, name.encode(), C.byref(handle),
                             what=f"graphRetrieve {name!r}")
                context.graphs[name] = Graph(context, name, handle.value, inputs, outputs)
        except BaseException:
            context.close()
            raise
    return context
