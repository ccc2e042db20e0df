"""Vela stand-ins for the tests of isolation and graceful degradation (importable by the isolated worker).

Each one inspects the TOSA graph it is given: a graph holding a ``DEPTHWISE_CONV2D`` makes it crash the process
(SIGSEGV, by reading address 0) or refuse with a message naming no node; any other graph goes to the real Vela.
"""

from __future__ import annotations

import ctypes
from typing import Any

from edgeport_arm import vela
from edgeport_arm.schema.tosa_reader import read_tosa

PLANTED_OP = "DEPTHWISE_CONV2D"


def _has_planted_op(data: bytes) -> bool:
    return PLANTED_OP in read_tosa(data, "planted compiler").op_counts


def crash_on_depthwise(data: bytes, **kwargs: Any) -> vela.VelaResult:
    if _has_planted_op(data):
        ctypes.string_at(0)  # SIGSEGV, as Vela's native core does on some graphs
    return vela.compile_tosa(data, **kwargs)


def refuse_depthwise(data: bytes, **kwargs: Any) -> vela.VelaResult:
    if _has_planted_op(data):
        raise vela.VelaError("Error: Non-passthrough operation could not run on NPU (planted refusal)")
    return vela.compile_tosa(data, **kwargs)
