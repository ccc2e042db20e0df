"""What a lowered graph node is, in the TOSA graph being built: :class:`Value` (a tensor) or :class:`Const`.

A :class:`Value` keeps its physical layout (4-D tensors may live in NHWC inside the graph; ``shape`` is the
physical shape) and, in integer graphs, what its integers mean: an int8 tensor with quantization parameters
``q`` (real = (v - zp) * scale), or an int32 accumulator with ``acc_scale`` (real = v * scale, per channel of the
last axis when it is an array). A pending activation (``bounds``, in real units) is applied when the value is
requantized to int8, where clamping is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

NHWC_TO_NCHW = (0, 3, 1, 2)
NCHW_TO_NHWC = (0, 2, 3, 1)


@dataclass(frozen=True)
class QParams:
    """Per-tensor affine quantization: int8, or int16 (``bits=16``, the a16w8 activations)."""

    scale: float
    zero_point: int
    bits: int = 8

    @property
    def range(self) -> tuple[int, int]:
        return (-(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1)


@dataclass(frozen=True)
class Value:
    name: str
    shape: tuple[int, ...]
    dtype: Any
    nhwc: bool = False
    q: QParams | None = None
    acc_scale: np.ndarray | None = None
    bounds: tuple[float | None, float | None] | None = None

    @property
    def logical_shape(self) -> tuple[int, ...]:
        """The shape in torch's (NCHW) order."""
        return tuple(self.shape[i] for i in NHWC_TO_NCHW) if self.nhwc else self.shape

    def with_(self, **changes: Any) -> Value:
        return replace(self, **changes)


@dataclass(frozen=True)
class Const:
    """A compile-time tensor: float data, or int8 data with per-tensor or per-channel (``axis``) parameters."""

    data: np.ndarray
    scales: np.ndarray | None = None
    zero_points: np.ndarray | None = None
    axis: int | None = None

    @property
    def quantized(self) -> bool:
        return self.scales is not None

    def real(self) -> np.ndarray:
        """The float values this constant stands for."""
        if self.scales is None:
            return self.data.astype(np.float32)
        shape = [1] * self.data.ndim
        if self.axis is not None:
            shape[self.axis] = -1
        scales = np.asarray(self.scales, np.float64).reshape(shape if self.axis is not None else [])
        zps = np.asarray(self.zero_points, np.float64).reshape(shape if self.axis is not None else [])
        return ((self.data.astype(np.float64) - zps) * scales).astype(np.float32)
