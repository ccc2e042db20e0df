"""``QnnBackend``'s blob: edgeport's own versioned container around a sealed QNN context binary.

Layout (little endian)::

    0   4  magic b"EPQN"
    4   4  uint32 format version (FORMAT_VERSION)
    8   4  uint32 n: size of the JSON header
    12  n  JSON header: producing plugin version, QNN core/backend API and build, SoC, graph name, the graph's
           inputs and outputs (shape, dtype: NCHW as PyTorch sees them), QNN op counts
    12+n   sealed context binary (:func:`edgeport_qnn.sdk.binary.seal`: magic, size, SHA-256, QNN's bytes)

Torch-free; nothing here touches QNN.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

MAGIC = b"EPQN"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<4sII")
_MAX_HEADER = 1 << 20


class BlobError(ValueError):
    """Not a valid QnnBackend blob (the executor turns it into ``ProgramError``)."""


@dataclass
class BlobHeader:
    plugin_version: str
    qnn_core_api: str
    qnn_backend_api: str
    qnn_build: str
    soc_model: str
    graph: str
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)
    #: "soc": the context was built on a device configured with ``soc_model`` (quantized or fp16 graphs);
    #: "default": on the backend's default device (float32 graphs: the emulator keeps them in fp32 there)
    device: str = "default"
    precision: str = "fp32"  #: HTP graph precision of float tensors: "fp32" or "fp16"


def pack_blob(header: BlobHeader, sealed_binary: bytes) -> bytes:
    text = json.dumps({"format": "edgeport-qnn context", **asdict(header)}, sort_keys=True).encode()
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(text)) + text + sealed_binary


def _tensor_list(value: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value or len(value) > 4096:
        raise BlobError(f"header field {what!r} must be a non-empty list")
    for t in value:
        shape = t.get("shape") if isinstance(t, dict) else None
        if (not isinstance(shape, list) or len(shape) > 8 or
                not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in shape)
                or t.get("dtype") != "float32"):
            raise BlobError(f"header field {what!r} holds a malformed tensor description {t!r}"[:300])
    return value


def unpack_blob(blob: bytes | bytearray | memoryview) -> tuple[BlobHeader, memoryview]:
    """(header, sealed context binary) of a blob; :class:`BlobError` saying what is wrong otherwise."""
    view = memoryview(blob).cast("B")
    if len(view) < _PREFIX.size:
        raise BlobError(f"QnnBackend blob of {len(view)} bytes is truncated (header needs {_PREFIX.size})")
    magic, version, size = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise BlobError(f"not a QnnBackend blob: magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise BlobError(f"QnnBackend blob format version {version}; this edgeport-qnn reads version "
                        f"{FORMAT_VERSION}: lower the model again with this edgeport-qnn")
    if size > _MAX_HEADER or _PREFIX.size + size > len(view):
        raise BlobError(f"QnnBackend blob truncated: header of {size} bytes, blob of {len(view)}")
    try:
        data = json.loads(bytes(view[_PREFIX.size:_PREFIX.size + size]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BlobError(f"QnnBackend blob header is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != "edgeport-qnn context":
        raise BlobError("QnnBackend blob header is not an edgeport-qnn header")
    try:
        header = BlobHeader(**{k: v for k, v in data.items() if k != "format"})
    except TypeError as exc:
        raise BlobError(f"QnnBackend blob header has unexpected fields: {exc}") from None
    for name in ("plugin_version", "qnn_core_api", "qnn_backend_api", "qnn_build", "soc_model", "graph"):
        if not isinstance(getattr(header, name), str):
            raise BlobError(f"QnnBackend blob header field {name!r} is not a string")
    if header.device not in ("default", "soc") or header.precision not in ("fp32", "fp16"):
        raise BlobError(f"QnnBackend blob header: device {header.device!r} / precision {header.precision!r} unknown")
    _tensor_list(header.inputs, "inputs")
    _tensor_list(header.outputs, "outputs")
    if not isinstance(header.ops, dict):
        raise BlobError("QnnBackend blob header field 'ops' is not a mapping")
    return header, view[_PREFIX.size + size:]


def describe_blob(processed: bytes | memoryview) -> dict[str, Any]:
    """What ``edgeport inspect`` shows for a QnnBackend delegate; ``ValueError`` for bytes that are not one."""
    header, binary = unpack_blob(processed)
    return {
        "format": f"edgeport-qnn context v{FORMAT_VERSION} (sealed QNN context binary)",
        "producer": f"edgeport-qnn {header.plugin_version}",
        "qnn": {"core_api": header.qnn_core_api, "backend_api": header.qnn_backend_api, "build": header.qnn_build},
        "soc_model": header.soc_model,
        "device": header.device,
        "precision": header.precision,
        "inputs": header.inputs,
        "outputs": header.outputs,
        "qnn_ops": header.ops,
        "context_binary_bytes": len(binary),
    }
