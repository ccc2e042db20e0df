"""``describe_blob`` of the Arm backends: what a TOSA graph or a Vela stream holds (for ``edgeport inspect``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from edgeport.errors import ProgramError
from edgeport_arm.keys import estimates_key
from edgeport_arm.schema.tosa_reader import read_tosa
from edgeport_arm.schema.vela_stream import VelaStreamError, parse_vela_stream


def describe_tosa_blob(processed: bytes | memoryview) -> dict[str, Any]:
    try:
        info = read_tosa(processed, "TOSABackend blob")
    except ProgramError as exc:
        raise ValueError(str(exc)) from None
    major, minor, patch, draft = info.version
    return {
        "format": "TOSA flatbuffer",
        "tosa_version": f"{major}.{minor}.{patch}" + ("d" if draft else ""),
        "inputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype_name} for t in info.inputs],
        "outputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype_name} for t in info.outputs],
        "operators": {k: v for k, v in sorted(info.op_counts.items()) if k not in ("CONST", "CONST_SHAPE")},
        "constant_bytes": info.constant_bytes,
        "tensors": info.num_tensors,
    }


def describe_ethos_u_blob(processed: bytes | memoryview, named_data: Callable[[str], Any] | None = None
                          ) -> dict[str, Any]:
    """The stream's blocks; with the program's named data, Vela's estimates kept beside the blob too."""
    try:
        stream = parse_vela_stream(processed)
    except VelaStreamError as exc:
        raise ValueError(str(exc)) from None
    estimates = _estimates(processed, named_data)
    out = {
        "format": "Vela command stream (ExecuTorch's vela_bin_stream)",
        "command_stream_bytes": len(stream.cmd_data),
        "weight_bytes": len(stream.weight_data),
        "external_blocks": dict(stream.external),
        "scratch_bytes": stream.scratch_size,
        "inputs": [{"shape": list(io.shape), "element_size": io.elem_size} for io in stream.inputs],
        "outputs": [{"shape": list(io.shape), "element_size": io.elem_size} for io in stream.outputs],
        "estimates": estimates,
    }
    if isinstance(estimates, dict):
        out["summary"] = (f"Vela {estimates.get('target', '?')}: {estimates['cycles_npu']:,.0f} NPU cycles "
                          f"({estimates['inference_time_s'] * 1e3:.3f} ms), SRAM {estimates['sram_used_kib']:.1f} KiB, "
                          f"flash {estimates['off_chip_flash_used_kib']:.1f} KiB, {estimates['macs']:,} MACs, "
                          f"{estimates['npu_ops']} NPU / {estimates['cpu_ops']} CPU ops")
    return out


def _estimates(processed: bytes | memoryview, named_data: Callable[[str], Any] | None) -> Any:
    key = estimates_key(processed)
    if named_data is None:
        return f"in the program's named data ({key})"
    try:
        return json.loads(bytes(named_data(key)).decode("utf-8"))
    except (KeyError, ProgramError):
        return "none kept (lowered by another tool)"
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"unreadable ({exc})"
