"""Host op of a dynamically quantized fully connected (``qd8 x qc8w`` / ``qd8 x qb4w``) on the ``_qd8`` C kernel.

:func:`~edgeport_xnnpack._dynamic_quant.host_dynamic_products` marks the nodes (``fields[QD8]``); this module
makes their host ops. The kernel reads the float input, quantizes each row as XNNPACK's ``f32 -> qd8`` convert
does, and multiplies with the int8 / packed int4 filter in exact int32 arithmetic per group (see ``_qd8.c``), so
the filter stays as small as in the program (no float32 copy) and a decode step reads 1 (int8) or 0.5 (int4)
bytes per weight instead of 4; a 4-bit filter is repacked once, at load, for the kernel's column-vector loops
(:func:`packed_filter`). Without the extension (no C compiler at install) the executor keeps the float32
path of :mod:`~edgeport_xnnpack._dynamic_quant`.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgeport_xnnpack._dynamic_quant import QD8, Qd8Weights
from edgeport_xnnpack._host import HostOp
from edgeport_xnnpack.schema.graph import XNode

try:
    from edgeport_xnnpack import _qd8
except ImportError:  # pragma: no cover - built without a C compiler
    _qd8 = None

__all__ = ["MIN_PARALLEL_MACS", "kernel_available", "packed_filter", "qd8_op"]

#: products smaller than this run on the calling thread: a pool call waits for every worker to check in, which on
#: a busy CPU (a worker not scheduled) cost ~16 ms per call here for a 0.3 ms decode step of 2048 x 2048
MIN_PARALLEL_MACS = 1 << 24


def kernel_available() -> bool:
    """The ``_qd8`` extension is built."""
    return _qd8 is not None


def packed_filter(q: Qd8Weights) -> np.ndarray:
    """The 4-bit filter of ``q`` in the kernel's packed layout (``_qd8.pack4``), made once and kept on ``q``;
    64-byte aligned."""
    if _qd8 is None:
        raise ValueError("the _qd8 extension is not built")
    if q.packed is None:
        size = _qd8.packed4_bytes(q.n, q.k, q.group)
        buf = np.empty(size + 64, np.uint8)
        start = -buf.ctypes.data % 64
        packed = buf[start:start + size]
        _qd8.pack4(q.w, q.scales, q.n, q.k, q.group, packed)
        q.packed = packed
    return q.packed


def qd8_op(n: XNode, in_shape: tuple[int, ...], out_shape: tuple[int, ...], pool: Any) -> HostOp:
    """The host op of a fully connected node marked with ``fields[QD8]`` (input ``[..., k]`` -> ``[..., n]``);
    ``pool``: the delegate's ``native.ThreadPool`` or ``None``."""
    if _qd8 is None:
        raise ValueError("the _qd8 extension is not built")
    q: Qd8Weights = n.fields[QD8]
    rows = math.prod(in_shape) // q.k
    if not in_shape or in_shape[-1] != q.k or math.prod(out_shape) != rows * q.n:
        raise ValueError(f"dynamically quantized fully connected of {list(in_shape)} into {list(out_shape)} with a "
                         f"[{q.n}, {q.k}] filter")
    lo, hi = n.output_min_max or (-math.inf, math.inf)
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"bad output range ({lo}, {hi})")
    handle = (getattr(pool, "handle", None) or 0) if rows * q.k * q.n >= MIN_PARALLEL_MACS else 0
    parallelize = ctypes.cast(pool.lib.pool.pthreadpool_parallelize_1d, ctypes.c_void_p).value if handle else 0
    if q.bits == 4:
        packed, fc4 = packed_filter(q), _qd8.fc4

        def into(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
            x = xs[0] if xs[0].flags.c_contiguous and xs[0].dtype == np.float32 else \
                np.ascontiguousarray(xs[0], np.float32)
            fc4(x, packed, q.bias, out, rows, q.k, q.n, q.group, lo, hi, parallelize or 0, handle)
    else:
        fc = _qd8.fc

        def into(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
            x = xs[0] if xs[0].flags.c_contiguous and xs[0].dtype == np.float32 else \
                np.ascontiguousarray(xs[0], np.float32)
            fc(x, q.w, q.scales, q.bias, out, rows, q.k, q.n, q.group, q.bits, lo, hi, parallelize or 0, handle)

    def compute(xs: Sequence[np.ndarray]) -> np.ndarray:
        out = np.empty(out_shape, np.float32)
        into(xs, out)
        return out
    return HostOp(compute, into, view=False, reads=1, scratch=(tuple(out_shape), np.float32))
