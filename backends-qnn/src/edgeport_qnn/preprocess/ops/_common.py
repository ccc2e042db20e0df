"""Helpers shared by the op lowerings."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_qnn.preprocess.lowering import NCHW_TO_NHWC, Lowering, QConst, Val, fake, static_shape

__all__ = ["NCHW_TO_NHWC", "Val", "broadcast_const", "is_float", "operand", "out_shape", "pair", "u32"]


def u32(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.uint32)


def pair(v: Any) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in v] * (2 if len(v) == 1 else 1)


def out_shape(node: torch.fx.Node) -> tuple[int, ...]:
    return static_shape(node)


def broadcast_const(data: np.ndarray, rank: int, nhwc: bool) -> np.ndarray:
    """A constant operand of an elementwise op, brought to ``rank`` (leading 1s) and to NHWC when needed."""
    data = np.asarray(data, np.float32)
    if data.ndim > rank:
        raise LoweringError(f"constant of rank {data.ndim} broadcast to rank {rank}")
    data = data.reshape((1,) * (rank - data.ndim) + data.shape)
    return np.ascontiguousarray(data.transpose(NCHW_TO_NHWC)) if nhwc else data


def operand(lw: Lowering, a: Any, rank: int, nhwc: bool) -> str:
    """The QNN tensor name of an elementwise operand in the wanted layout (constants are laid out to match)."""
    if lw.qmode is not None and isinstance(a, (int, float)):
        return lw.qscalar(float(a), rank)
    qc = lw.values.get(a) if isinstance(a, torch.fx.Node) else None
    if lw.qmode is not None and isinstance(qc, QConst) and qc.axis is None:
        from edgeport_qnn.sdk import QuantParams

        raw = np.asarray(qc.raw)
        if raw.ndim > rank:
            raise LoweringError(f"constant of rank {raw.ndim} broadcast to rank {rank}")
        raw = raw.reshape((1,) * (rank - raw.ndim) + raw.shape)
        raw = np.ascontiguousarray(raw.transpose(NCHW_TO_NHWC)) if nhwc else raw
        name = lw.fresh("qconst")
        lw.g.add_static(name, raw, QuantParams(qc.scales[0], qc.zero_points[0]))
        return name
    c = lw.const(a)
    if c is not None:
        return lw.static(broadcast_const(c, rank, nhwc))
    if isinstance(a, (int, float)):
        return lw.static(np.full((1,) * rank, float(a), np.float32))
    v = lw.value(a)
    if nhwc:
        return lw.nhwc(v).name
    v = lw.nchw(v)
    if len(v.shape) < rank:  # QNN broadcasting wants equal ranks
        return lw.node("Reshape", [v.name], (1,) * (rank - len(v.shape)) + v.shape, like=v).name
    return v.name


def is_float(node: Any) -> bool:
    return fake(node).dtype == torch.float32

