"""Context binaries: edgeport's sealed form (QNN's bytes behind a length and SHA-256 header), and loading one:
described by QNN's system library, created by the backend, graphs retrieved.

QNN's own parsers do not survive every corrupted input (fuzzing found aborts and segfaults in both the system
library and ``contextCreateFromBinary``), so nothing unverified reaches them: a sealed binary must match its
digest, and a raw QNN binary is first loaded and run once in a throw-away child process (:mod:`.probe`).
"""

from __future__ import annotations

import ctypes as C
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
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

SEAL_MAGIC = b"EPQNNCB\x00"
SEAL_VERSION = 1
_SEAL_HEADER = struct.Struct("<8sHHIQ32s")  # magic, format version, header size, flags, payload size, SHA-256
PROBE_TIMEOUT_S = 300.0

GraphMeta = tuple[str, list[tuple[TensorSpec, int]], list[tuple[TensorSpec, int]]]


def seal(raw: bytes) -> bytes:
    """edgeport's sealed context binary: header (magic, version, sizes, SHA-256 of the payload) + QNN's bytes."""
    digest = hashlib.sha256(raw).digest()
    return _SEAL_HEADER.pack(SEAL_MAGIC, SEAL_VERSION, _SEAL_HEADER.size, 0, len(raw), digest) + raw


def is_sealed(binary: bytes | bytearray | memoryview) -> bool:
    return bytes(memoryview(binary)[: len(SEAL_MAGIC)]) == SEAL_MAGIC


def unseal(binary: bytes | bytearray | memoryview) -> memoryview:
    """QNN's bytes inside a sealed context binary; :class:`QnnError` when truncated, corrupted or not sealed."""
    view = memoryview(binary).cast("B")
    if len(view) < _SEAL_HEADER.size or not is_sealed(view):
        raise QnnError(f"not an edgeport context binary ({len(view)} bytes, no {SEAL_MAGIC!r} header)")
    magic, version, header_size, flags, size, digest = _SEAL_HEADER.unpack_from(view)
    if version != SEAL_VERSION or header_size != _SEAL_HEADER.size or flags != 0:
        raise QnnError(f"unsupported edgeport context binary (format {version}, header {header_size}, flags {flags})")
    payload = view[header_size:]
    if size != len(payload):
        raise QnnError(f"truncated or padded context binary: header says {size} payload bytes, found {len(payload)}")
    if hashlib.sha256(payload).digest() != digest:
        raise QnnError("corrupted context binary: SHA-256 of the payload does not match its header")
    return payload


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


def _stderr_tail(stderr: bytes) -> str | None:
    lines = [line for line in stderr.decode(errors="replace").splitlines()
             if line.strip() and "# LIBNATIVE:" not in line]
    return "\n".join(lines[-4:])[-600:] or None


def probe_in_child(backend: QnnBackend, raw: bytes) -> None:
    """Load raw QNN context-binary bytes and run each graph once in a child process; :class:`QnnError` if that
    fails or crashes (the parent never hands unverified bytes to QNN)."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    command = [sys.executable, "-m", "edgeport_qnn.sdk.probe", backend.kind,
               str(backend.libraries.backend(backend.kind)), str(backend.libraries.system)]
    try:
        done = subprocess.run(command, input=raw, capture_output=True, env=env, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise QnnError(f"probing the context binary timed out after {PROBE_TIMEOUT_S:.0f} s") from exc
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        verdict = json.loads(lines[-1]) if lines else {}
    except ValueError:
        verdict = {}
    if done.returncode == 0 and verdict.get("ok") is True:
        return
    if done.returncode < 0 or not verdict:
        raise QnnError(f"QNN crashed (exit status {done.returncode}) loading or running this context binary in a "
                       "probe process; it is corrupted or not for this QNN version",
                       detail=_stderr_tail(done.stderr))
    raise QnnError(f"context binary rejected: {verdict.get('error', 'unknown error')}", verdict.get("code"))


def load_context(cls: type[Context], backend: QnnBackend, binary: bytes | bytearray | memoryview, *,
                 raw: bool = False, probe: bool = True, soc_model: int | None = None) -> Context:
    """Implementation of :meth:`Context.from_binary`."""
    from edgeport_qnn.sdk.session import Graph

    if isinstance(binary, str) or not isinstance(binary, (bytes, bytearray, memoryview)):
        raise TypeError(f"a context binary is bytes-like, got {type(binary).__name__}")
    if memoryview(binary).nbytes == 0:
        raise ValueError("empty context binary")
    if raw:
        if is_sealed(binary):
            raise ValueError("raw=True but this is a sealed edgeport context binary; load it with raw=False")
        buffer = _as_buffer(binary)
        if probe:
            probe_in_child(backend, bytes(buffer))
    else:
        buffer = _as_buffer(unseal(binary))
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
        backend.call(table.contextCreateFromBinary, backend._h.backend, backend.device(soc_model), None, buffer,
                     len(buffer), C.byref(out), None, what="contextCreateFromBinary")
        context = cls(backend, out.value)
        context._loaded_from = buffer
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
