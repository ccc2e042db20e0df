"""Runtime checks of a lowered program: :func:`compare_outputs` against eager PyTorch, and corrupted delegate
blobs (:func:`corrupt_blob`, :func:`patch_program`) that the backend's runtime must reject."""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from edgeport.testing.conformance.cases import stable_seed


def compare_outputs(
    got: Sequence[Any], expected: Sequence[Any], tolerances: Mapping[str, tuple[float, float]], where: str
) -> None:
    """Assert the runtime's outputs match eager's: count, dtype, shape, values within the dtype's tolerance."""
    assert len(got) == len(expected), f"{where}: {len(got)} outputs, eager PyTorch gives {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if not isinstance(e, torch.Tensor):
            assert g == e, f"{where}: output {i} is {g!r}, eager PyTorch gives {e!r}"
            continue
        dtype = str(e.dtype).removeprefix("torch.")
        want = e.detach().cpu()
        want_np = want.float().numpy() if e.dtype == torch.bfloat16 else want.numpy()
        g = np.asarray(g)
        if e.dtype != torch.bfloat16:
            assert g.dtype == want_np.dtype, f"{where}: output {i} has dtype {g.dtype}, eager PyTorch gives {dtype}"
        assert g.shape == want_np.shape, (
            f"{where}: output {i} has shape {list(g.shape)}, eager PyTorch gives {list(want_np.shape)}"
        )
        if e.dtype.is_floating_point:
            atol, rtol = tolerances.get(dtype, (1e-5, 1e-5))
            np.testing.assert_allclose(
                g.astype(np.float64), want_np.astype(np.float64), atol=atol, rtol=rtol, equal_nan=True,
                err_msg=f"{where}: output {i} ({dtype}) differs from eager PyTorch beyond atol={atol}, rtol={rtol}",
            )
        else:
            np.testing.assert_array_equal(g, want_np, err_msg=f"{where}: output {i} ({dtype}) differs from eager")


CORRUPTIONS = ("empty", "truncated_header", "truncated_half", "bad_magic", "version_mismatch", "garbage")
"""Default kinds of blob corruption; the same-length ones are also patched into a whole program."""

SAME_LENGTH = frozenset({"bad_magic", "version_mismatch", "garbage"})


def corrupt_blob(kind: str, blob: bytes, version_offset: int = 4, version_format: str = "<I") -> bytes | None:
    """A corrupted copy of ``blob`` (``None`` when ``kind`` does not apply to it).

    ``version_mismatch`` adds 1 to the format version stored at ``version_offset`` (DESIGN.md's header: magic,
    then format version as a little-endian uint32); ``bad_magic`` inverts the first four bytes; ``garbage`` is
    random bytes of the same length.
    """
    if kind == "empty":
        return b""
    if kind == "truncated_header":
        return blob[: min(len(blob) - 1, 6)] if len(blob) > 1 else None
    if kind == "truncated_half":
        return blob[: len(blob) // 2] if len(blob) > 1 else None
    if kind == "bad_magic":
        if len(blob) < 4:
            return None
        return bytes(b ^ 0xFF for b in blob[:4]) + blob[4:]
    if kind == "version_mismatch":
        size = struct.calcsize(version_format)
        if len(blob) < version_offset + size:
            return None
        (version,) = struct.unpack_from(version_format, blob, version_offset)
        bumped = struct.pack(version_format, (version + 1) % (1 << (8 * size)))
        return blob[:version_offset] + bumped + blob[version_offset + size:]
    if kind == "garbage":
        rng = np.random.default_rng(stable_seed(f"garbage-{len(blob)}"))
        return rng.integers(0, 256, len(blob), dtype=np.uint8).tobytes()
    raise ValueError(f"unknown corruption {kind!r}; known: {CORRUPTIONS}")


def patch_program(pte: bytes, blob: bytes, replacement: bytes) -> bytes:
    """``pte`` with the (unique) copy of delegate ``blob`` replaced by a same-length ``replacement``."""
    if len(replacement) != len(blob):
        raise ValueError("patch_program needs a replacement of the same length")
    where = pte.find(blob)
    if where < 0:
        raise ValueError("the delegate blob is not stored verbatim in the program")
    return pte[:where] + replacement + pte[where + len(blob):]


def check_describe_blob(backend_spec: Any, blob: bytes, corrupted: list[bytes]) -> None:
    """A declared ``describe_blob`` returns a JSON-able dict for a real blob, raises ``ValueError`` on garbage, and
    on a corrupted blob either describes it or raises ``ValueError`` -- never anything else."""
    import json

    import pytest

    describe = backend_spec.describe_blob
    if describe is None:
        pytest.skip(f"{backend_spec.backend_id} declares no describe_blob")
    info = describe(memoryview(blob))
    assert isinstance(info, dict) and info, "describe_blob must return a non-empty dict"
    json.dumps(info, default=str)
    for garbage in (b"", b"\x00" * 64, bytes(range(256))):
        with pytest.raises(ValueError):
            describe(garbage)
    for bad in corrupted:
        try:
            assert isinstance(describe(bad), dict)
        except ValueError:
            pass
