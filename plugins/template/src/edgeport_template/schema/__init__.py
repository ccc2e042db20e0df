"""TemplateBackend's blob format, version 1 (see ``README.md`` beside this file). Torch-free.

Shared by ``preprocess`` (which writes blobs with :func:`pack`) and the executor (which reads them with
:func:`unpack`). :func:`unpack` checks the whole header before anything is used and raises
:class:`edgeport.ProgramError` naming the problem.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from edgeport import ProgramError

MAGIC = b"EPTB"  # pick four bytes of your own for your backend
FORMAT_VERSION = 1
HEADER = struct.Struct("<4sI16s16s32sII")  # magic, version, plugin version, target, backend id, N, D
ALIGNMENT = 16

#: dtype name (torch spelling) -> numpy little-endian type string, for inputs and constants.
DTYPES: dict[str, str] = {
    "float32": "<f4",
    "float16": "<f2",
    "int64": "<i8",
    "int32": "<i4",
    "int8": "|i1",
    "uint8": "|u1",
    "bool": "|b1",
}


@dataclass(frozen=True)
class Header:
    format_version: int
    plugin_version: str
    target: str
    backend_id: str
    program_length: int
    data_length: int


def align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def data_start(program_length: int) -> int:
    """Offset of the data region in a blob whose program document is ``program_length`` bytes long."""
    return align(HEADER.size + program_length)


def _field(text: str, size: int, what: str) -> bytes:
    raw = text.encode("ascii")
    if len(raw) > size:
        raise ValueError(f"{what} {text!r} is longer than {size} bytes")
    return raw


def pack(program: dict[str, Any], data: bytes, *, plugin_version: str, target: str, backend_id: str) -> bytes:
    """Assemble a blob: header, the program document (JSON), padding, the data region."""
    document = json.dumps(program, separators=(",", ":")).encode("utf-8")
    head = HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        _field(plugin_version, 16, "plugin version"),
        _field(target, 16, "target"),
        _field(backend_id, 32, "backend id"),
        len(document),
        len(data),
    )
    body = head + document
    return body + bytes(data_start(len(document)) - len(body)) + bytes(data)


def _text(raw: bytes, what: str, backend_id: str) -> str:
    try:
        return raw.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        raise ProgramError(f"{backend_id} blob: the header's {what} field is corrupt") from None


def unpack(blob: memoryview, backend_id: str, plugin_version: str) -> tuple[Header, dict[str, Any], memoryview]:
    """Check a blob's header and return ``(header, program document, data region)``.

    Raises :class:`edgeport.ProgramError` for a truncated blob, a wrong magic, a format version this executor
    does not read, a blob written for another backend, extra or missing bytes, or a corrupt document.
    """
    where = f"{backend_id} blob"
    if len(blob) < HEADER.size:
        raise ProgramError(f"{where}: truncated: {len(blob)} bytes, the header alone needs {HEADER.size}")
    magic, version, raw_plugin, raw_target, raw_backend, n, d = HEADER.unpack_from(blob, 0)
    if magic != MAGIC:
        raise ProgramError(f"{where}: bad magic {bytes(magic)!r}, expected {MAGIC!r}: this is not a {backend_id} blob")
    written_by = _text(raw_plugin, "plugin version", backend_id)
    if version != FORMAT_VERSION:
        raise ProgramError(
            f"{where}: format version {version} (written by plugin version {written_by!r}) is not supported: "
            f"this plugin ({plugin_version}) reads format version {FORMAT_VERSION}; lower the model again with "
            "the installed plugin"
        )
    blob_backend = _text(raw_backend, "backend id", backend_id)
    if blob_backend != backend_id:
        raise ProgramError(f"{where}: written for backend {blob_backend!r}, not {backend_id!r}")
    target = _text(raw_target, "target", backend_id)
    start = data_start(n)
    if start + d != len(blob):
        raise ProgramError(
            f"{where}: size mismatch: the header announces {n} bytes of program and {d} bytes of data "
            f"({start + d} bytes in all) but the blob has {len(blob)} (truncated or padded)"
        )
    try:
        program = json.loads(bytes(blob[HEADER.size : HEADER.size + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProgramError(f"{where}: the program document is corrupt: {exc}") from None
    if not isinstance(program, dict):
        raise ProgramError(f"{where}: the program document must be a JSON object, got {type(program).__name__}")
    header = Header(version, written_by, target, blob_backend, n, d)
    return header, program, blob[start : start + d]
