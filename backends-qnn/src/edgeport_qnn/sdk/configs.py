"""Device and graph configuration lists of the QNN C API (our own ctypes declarations of the public ABI).

Both are NULL-terminated arrays of pointers to ``{uint32 option; union {void *customConfig; ...}}`` records
(``option`` 0 = backend-specific custom config). The HTP custom records are ``{uint32 option; union {...}}`` with
the union 8-byte aligned (it holds 64-bit members), so the value starts at byte offset 8 (checked on the HTP
backend: the SoC read at offset 4 is refused as ``socModel 0``).
"""

from __future__ import annotations

import ctypes as C
import enum
from typing import Any

from edgeport_qnn.sdk.tensors import Keep

CONFIG_OPTION_CUSTOM = 0


class HtpDeviceOption(enum.IntEnum):
    SOC = 0
    ARCH = 1


class HtpGraphOption(enum.IntEnum):
    OPTIMIZATION = 1
    PRECISION = 2
    VTCM_SIZE_IN_MB = 3


class Precision(enum.IntEnum):
    FLOAT32 = 0
    FLOAT16 = 1


class HtpOptimization(enum.IntEnum):
    """``OPTIMIZATION`` record types; ``FINALIZE_OPTIMIZATION_FLAG`` takes a float level (1..3)."""

    FINALIZE_OPTIMIZATION_FLAG = 3


class _Config(C.Structure):
    """``QnnDevice_Config_t`` / ``QnnGraph_Config_t`` used with a custom record."""

    _fields_ = [("option", C.c_uint32), ("custom", C.c_void_p), ("_rest", C.c_uint64 * 2)]


class _HtpRecord(C.Structure):
    """An HTP custom record: ``option`` then an 8-byte aligned union (room for its largest members)."""

    _fields_ = [("option", C.c_uint32), ("_pad", C.c_uint32), ("u32", C.c_uint32 * 2), ("_rest", C.c_uint64 * 3)]


def _record(option: int, values: tuple[int | float, ...], keep: Keep) -> _HtpRecord:
    rec = keep(_HtpRecord())
    rec.option = int(option)
    for i, v in enumerate(values):
        rec.u32[i] = int(v) if isinstance(v, int) else C.c_uint32.from_buffer(C.c_float(v)).value
    return rec


def config_list(records: list[_HtpRecord], keep: Keep) -> Any:
    """A NULL-terminated ``const Config_t **`` of custom configs wrapping ``records`` (``None`` when empty)."""
    if not records:
        return None
    configs = [keep(_Config(CONFIG_OPTION_CUSTOM, C.cast(C.pointer(r), C.c_void_p))) for r in records]
    array = keep((C.POINTER(_Config) * (len(configs) + 1))(*[C.pointer(c) for c in configs], None))
    return C.cast(array, C.POINTER(C.c_void_p))


def htp_device_records(soc_model: int | None, keep: Keep) -> list[_HtpRecord]:
    """The HTP device records for a SoC (QNN's ``socModel`` id; the backend derives the HTP architecture)."""
    return [] if soc_model is None else [_record(HtpDeviceOption.SOC, (int(soc_model),), keep)]


def htp_graph_records(*, fp16: bool = False, optimization_level: int | None = None, vtcm_mb: int | None = None,
                      keep: Keep) -> list[_HtpRecord]:
    """HTP graph records: fp16 precision for float graphs, the finalize optimization level, the VTCM size."""
    records = []
    if fp16:
        records.append(_record(HtpGraphOption.PRECISION, (int(Precision.FLOAT16),), keep))
    if optimization_level is not None:
        records.append(_record(HtpGraphOption.OPTIMIZATION, (int(HtpOptimization.FINALIZE_OPTIMIZATION_FLAG),
                                                             float(optimization_level)), keep))
    if vtcm_mb is not None:
        records.append(_record(HtpGraphOption.VTCM_SIZE_IN_MB, (int(vtcm_mb),), keep))
    return records
