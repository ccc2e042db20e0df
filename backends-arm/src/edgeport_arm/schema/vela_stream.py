"""The ``vela_bin_stream`` block format of ExecuTorch's Ethos-U delegate: writer, validating reader, npz import.

Torch-free. A stream is a sequence of blocks; each block has a 32-byte header -- a 16-byte NUL-padded UTF-8
name (at most 15 characters), the unpadded data length (uint32 LE), an external flag (1 = the data is an ASCII
key into the program's named data instead of the bytes themselves) and 11 zero bytes -- followed by its data,
zero-padded to a multiple of 16. The blocks are ``vela_bin_stream`` (empty), ``cmd_data``, ``weight_data``,
``scratch_size`` (uint32 LE), ``inputs``, ``outputs`` (int32 count, then per tensor 6 shape dims, element size,
offset and region, all int32 LE) and ``vela_end_stream`` (empty).

:func:`parse_vela_stream` checks every byte it reads and raises :class:`VelaStreamError` (a ``ValueError``)
for anything malformed; it never reads out of range and raises nothing else for bad bytes.
"""

from __future__ import annotations

import operator
import os
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BLOCK_ALIGNMENT", "EXTERNAL_BLOCKS", "STREAM_FOOTER", "STREAM_HEADER", "VelaIO", "VelaStream",
    "VelaStreamError", "from_vela_npz", "pack_vela_stream", "parse_vela_stream",
]

STREAM_HEADER = "vela_bin_stream"
STREAM_FOOTER = "vela_end_stream"
BLOCK_ALIGNMENT = 16
#: Blocks that may be stored in the program's named data instead of inline (as ExecuTorch allows).
EXTERNAL_BLOCKS = ("cmd_data", "weight_data")
_BODY_BLOCKS = ("cmd_data", "weight_data", "scratch_size", "inputs", "outputs")
_ALL_BLOCKS = (STREAM_HEADER, *_BODY_BLOCKS, STREAM_FOOTER)

_HEADER = struct.Struct("<16sIB11s")
_IO = struct.Struct("<9i")
_COUNT = struct.Struct("<i")
_U32 = struct.Struct("<I")
_SHAPE_DIMS = 6
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_HINT = "regenerate the delegate blob by lowering the model to Ethos-U again"


class VelaStreamError(ValueError):
    """The bytes (or npz file) are not a well-formed Vela binary stream."""


def _int32(value: Any, what: str) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise VelaStreamError(f"{what} must be an int, got {type(value).__name__}") from None
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise VelaStreamError(f"{what} = {value} does not fit in int32")
    return value


@dataclass(frozen=True)
class VelaIO:
    """One input or output tensor of the compiled command stream: where it lives in which memory region."""

    shape: tuple[int, ...]
    elem_size: int
    offset: int
    region: int

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        if len(shape) != _SHAPE_DIMS:
            raise VelaStreamError(f"VelaIO shape must have {_SHAPE_DIMS} dims (Vela pads to 6-D), got {shape}")
        object.__setattr__(self, "shape", tuple(_int32(d, f"VelaIO shape[{i}]") for i, d in enumerate(shape)))
        for name in ("elem_size", "offset", "region"):
            object.__setattr__(self, name, _int32(getattr(self, name), f"VelaIO {name}"))


@dataclass(frozen=True)
class VelaStream:
    """The decoded blocks of a stream; ``external`` maps a block name to its named-data key.

    A block stored externally (only ``cmd_data`` / ``weight_data``) has empty bytes here: its payload lives in
    the program's named data under the key.
    """

    cmd_data: bytes
    weight_data: bytes
    scratch_size: int
    inputs: tuple[VelaIO, ...]
    outputs: tuple[VelaIO, ...]
    external: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("cmd_data", "weight_data"):
            value = getattr(self, name)
            if not isinstance(value, bytes | bytearray | memoryview):
                raise VelaStreamError(f"VelaStream.{name} must be bytes, got {type(value).__name__}")
            object.__setattr__(self, name, bytes(value))
        try:
            if isinstance(self.scratch_size, bool):
                raise TypeError
            scratch = operator.index(self.scratch_size)
        except TypeError:
            scratch = -1
        if not 0 <= scratch < (1 << 32):
            raise VelaStreamError(f"VelaStream.scratch_size must be an int in [0, 2**32), got {self.scratch_size!r}")
        object.__setattr__(self, "scratch_size", scratch)
        for name in ("inputs", "outputs"):
            ios = tuple(getattr(self, name))
            if not all(isinstance(io, VelaIO) for io in ios):
                raise VelaStreamError(f"VelaStream.{name} must hold VelaIO values")
            if len(ios) > _INT32_MAX:
                raise VelaStreamError(f"VelaStream.{name} has too many tensors")
            object.__setattr__(self, name, ios)
        if not isinstance(self.external, Mapping):
            raise VelaStreamError("VelaStream.external must map block names to named-data keys")
        external = dict(self.external)
        for name, key in external.items():
            if name not in EXTERNAL_BLOCKS:
                raise VelaStreamError(
                    f"block {name!r} cannot be stored externally; only {', '.join(EXTERNAL_BLOCKS)} can")
            _check_key(key, f"external key of {name!r}")
            if getattr(self, name):
                raise VelaStreamError(
                    f"block {name!r} is external (key {key!r}) but VelaStream.{name} is not empty; "
                    "keep the payload in the named data and leave the field b''")
        object.__setattr__(self, "external", external)


def _check_key(key: Any, what: str) -> None:
    if not isinstance(key, str) or not key:
        raise VelaStreamError(f"{what} must be a non-empty str")
    if not key.isascii() or not key.isprintable():
        raise VelaStreamError(f"{what} {key!r} is not printable ASCII")


def _pad(n: int) -> int:
    return -n % BLOCK_ALIGNMENT


def _pack_ios(ios: tuple[VelaIO, ...]) -> bytes:
    return _COUNT.pack(len(ios)) + b"".join(_IO.pack(*io.shape, io.elem_size, io.offset, io.region) for io in ios)


def pack_vela_stream(stream: VelaStream) -> bytes:
    """The stream's bytes, blocks in ExecuTorch's order (byte-identical to ExecuTorch's ``vela_compile``)."""
    if not isinstance(stream, VelaStream):
        raise TypeError(f"pack_vela_stream expects a VelaStream, got {type(stream).__name__}")
    payloads = {
        STREAM_HEADER: b"",
        "cmd_data": stream.cmd_data,
        "weight_data": stream.weight_data,
        "scratch_size": _U32.pack(stream.scratch_size),
        "inputs": _pack_ios(stream.inputs),
        "outputs": _pack_ios(stream.outputs),
        STREAM_FOOTER: b"",
    }
    parts: list[bytes] = []
    for name, data in payloads.items():
        flag = 0
        if name in stream.external:
            data, flag = stream.external[name].encode("ascii"), 1
        if len(data) >= (1 << 32):
            raise VelaStreamError(f"block {name!r} is {len(data)} bytes; the format allows at most 2**32 - 1")
        parts.append(_HEADER.pack(name.encode("utf-8"), len(data), flag, bytes(11)))
        parts.append(data)
        parts.append(bytes(_pad(len(data))))
    return b"".join(parts)


def _fail(name: str | None, offset: int, problem: str) -> VelaStreamError:
    where = f"block {name!r} at byte {offset}" if name else f"byte {offset}"
    return VelaStreamError(f"Vela stream: {where}: {problem}; {_HINT}")


def _parse_ios(data: bytes, name: str, offset: int) -> tuple[VelaIO, ...]:
    if len(data) < _COUNT.size:
        raise _fail(name, offset, f"{len(data)} data bytes cannot hold the int32 tensor count")
    (count,) = _COUNT.unpack_from(data, 0)
    if count < 0:
        raise _fail(name, offset, f"negative tensor count {count}")
    expected = _COUNT.size + count * _IO.size
    if len(data) != expected:
        raise _fail(name, offset, f"{count} tensors need {expected} data bytes, the block has {len(data)}")
    ios = []
    for i in range(count):
        *shape, elem_size, off, region = _IO.unpack_from(data, _COUNT.size + i * _IO.size)
        ios.append(VelaIO(tuple(shape), elem_size, off, region))
    return tuple(ios)


def parse_vela_stream(data: bytes | bytearray | memoryview) -> VelaStream:
    """Decode and validate a stream; raises :class:`VelaStreamError` saying what is wrong and where."""
    mv = memoryview(data)
    if mv.ndim != 1 or mv.itemsize != 1 or not mv.contiguous:
        mv = memoryview(mv.tobytes())
    total = len(mv)
    if total == 0:
        raise VelaStreamError(f"Vela stream is empty (0 bytes, expected a {STREAM_HEADER!r} block); {_HINT}")
    pos = 0
    raw: dict[str, bytes] = {}
    external: dict[str, str] = {}
    ios: dict[str, tuple[VelaIO, ...]] = {}
    order: list[str] = []
    while True:
        if total - pos < _HEADER.size:
            last = order[-1] if order else None
            where = f"after block {last!r}" if last else "at the start"
            raise VelaStreamError(
                f"Vela stream truncated {where}: {total - pos} bytes left at byte {pos}, a block header needs "
                f"{_HEADER.size} (stream must end with {STREAM_FOOTER!r}); {_HINT}")
        name_field, length, flag, reserved = _HEADER.unpack_from(mv, pos)
        nul = name_field.find(b"\0")
        if nul < 0:
            raise _fail(None, pos, "block name is not NUL-terminated within 16 bytes")
        if name_field[nul:] != bytes(16 - nul):
            raise _fail(None, pos, "block name has non-zero bytes after its NUL terminator")
        try:
            name = name_field[:nul].decode("utf-8")
        except UnicodeDecodeError:
            raise _fail(None, pos, f"block name {name_field[:nul]!r} is not UTF-8") from None
        if name not in _ALL_BLOCKS:
            raise _fail(name, pos, f"unknown block name (expected one of {', '.join(_ALL_BLOCKS)})")
        if name in raw:
            raise _fail(name, pos, "duplicated block")
        if not order and name != STREAM_HEADER:
            raise _fail(name, pos, f"stream must start with {STREAM_HEADER!r}")
        if reserved != bytes(11):
            raise _fail(name, pos, "the 11 reserved header bytes are not zero")
        if flag not in (0, 1):
            raise _fail(name, pos, f"external flag is {flag}, must be 0 (inline) or 1 (named-data key)")
        start = pos + _HEADER.size
        padded = length + _pad(length)
        if padded > total - start:
            raise _fail(name, pos, f"data length {length} (padded {padded}) runs past the end of the "
                                   f"{total}-byte stream (truncated?)")
        payload = bytes(mv[start:start + length])
        if any(mv[start + length:start + padded]):
            raise _fail(name, pos, "padding after the block data is not zero")
        if flag == 1:
            if name not in EXTERNAL_BLOCKS:
                raise _fail(name, pos, f"only {', '.join(EXTERNAL_BLOCKS)} may be external")
            try:
                key = payload.decode("ascii")
                _check_key(key, "named-data key")
            except (UnicodeDecodeError, VelaStreamError):
                raise _fail(name, pos, f"external named-data key {payload[:80]!r} is empty or not printable "
                                       "ASCII") from None
            external[name] = key
            payload = b""
        raw[name] = payload
        order.append(name)
        block_pos, pos = pos, start + padded
        if name in (STREAM_HEADER, STREAM_FOOTER) and length:
            raise _fail(name, block_pos, f"marker block must be empty, has {length} data bytes")
        if name == "scratch_size" and length != _U32.size:
            raise _fail(name, block_pos, f"must hold a 4-byte uint32, has {length} data bytes")
        if name in ("inputs", "outputs"):
            ios[name] = _parse_ios(payload, name, block_pos)
        if name == STREAM_FOOTER:
            break
    missing = [n for n in _BODY_BLOCKS if n not in raw]
    if missing:
        raise _fail(STREAM_FOOTER, block_pos, f"stream ends without block(s) {', '.join(missing)}")
    if pos != total:
        raise VelaStreamError(
            f"Vela stream: {total - pos} unexpected bytes after {STREAM_FOOTER!r} at byte {pos}; pass exactly the "
            "delegate's processed bytes")
    return VelaStream(
        cmd_data=raw["cmd_data"],
        weight_data=raw["weight_data"],
        scratch_size=_U32.unpack(raw["scratch_size"])[0],
        inputs=ios["inputs"],
        outputs=ios["outputs"],
        external=external,
    )


def _npz_array(npz: Any, key: str, path: str) -> Any:
    if key not in npz.files:
        raise VelaStreamError(f"Vela output {path} has no {key!r} array; was it written by Vela --output-format=raw?")
    try:
        return npz[key]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise VelaStreamError(f"Vela output {path}: cannot read {key!r} without pickle: {e}") from e


def _npz_ints(npz: Any, key: str, path: str, count: int | None, ndim: int = 1) -> list[Any]:
    import numpy as np

    arr = _npz_array(npz, key, path)
    if arr.ndim >= 1 and arr.shape[0] == 0 and count in (None, 0):
        return []
    if arr.dtype.kind not in "iu" or arr.ndim != ndim:
        raise VelaStreamError(f"Vela output {path}: {key!r} should be a {ndim}-D integer array, "
                              f"got {arr.dtype} with shape {arr.shape}")
    if count is not None and arr.shape[0] != count:
        raise VelaStreamError(f"Vela output {path}: {key!r} has {arr.shape[0]} entries, expected {count}")
    values = arr.astype(np.int64)  # uint64 wraps, e.g. 2**64 - 1 -> -1, as ExecuTorch reads it
    if values.size and (values.min() < _INT32_MIN or values.max() > _INT32_MAX):
        raise VelaStreamError(f"Vela output {path}: {key!r} has values outside int32")
    return values.tolist()


def _npz_ios(npz: Any, prefix: str, path: str) -> tuple[VelaIO, ...]:
    shapes = _npz_ints(npz, f"{prefix}_shape", path, None, ndim=2)
    if shapes and len(shapes[0]) != _SHAPE_DIMS:
        raise VelaStreamError(f"Vela output {path}: {prefix}_shape rows have {len(shapes[0])} dims, expected 6")
    n = len(shapes)
    elem = _npz_ints(npz, f"{prefix}_elem_size", path, n)
    offset = _npz_ints(npz, f"{prefix}_offset", path, n)
    region = _npz_ints(npz, f"{prefix}_region", path, n)
    return tuple(VelaIO(tuple(shapes[i]), elem[i], offset[i], region[i]) for i in range(n))


def _npz_bytes(npz: Any, key: str, path: str) -> bytes:
    arr = _npz_array(npz, key, path)
    if arr.dtype.kind not in "SuiV" or (arr.dtype.kind in "ui" and arr.dtype.itemsize != 1):
        raise VelaStreamError(f"Vela output {path}: {key!r} should be bytes, got {arr.dtype}")
    return arr.tobytes()


def from_vela_npz(npz_path: str | os.PathLike[str]) -> VelaStream:
    """Build the stream from Vela's raw output (``<name>_vela.npz``), reading only the arrays it needs."""
    import numpy as np

    path = os.fspath(npz_path)
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise VelaStreamError(f"cannot open Vela output {path}: {e}") from e
    if not hasattr(npz, "files"):
        raise VelaStreamError(f"Vela output {path} is a single array, not an .npz archive")
    with npz:
        cmd_data = _npz_bytes(npz, "cmd_data", path)
        weight_data = _npz_bytes(npz, "weight_data", path)
        scratch = _npz_array(npz, "scratch_shape", path)
        if scratch.dtype.kind not in "iu" or scratch.shape != (1,):
            raise VelaStreamError(f"Vela output {path}: 'scratch_shape' should be a 1-element integer array, "
                                  f"got {scratch.dtype} with shape {scratch.shape}")
        scratch_size = int(scratch[0])
        if not 0 <= scratch_size < (1 << 32):
            raise VelaStreamError(f"Vela output {path}: scratch size {scratch_size} does not fit in uint32")
        inputs = _npz_ios(npz, "input", path)
        outputs = _npz_ios(npz, "output", path)
    return VelaStream(cmd_data, weight_data, scratch_size, inputs, outputs)
