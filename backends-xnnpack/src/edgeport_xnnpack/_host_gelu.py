"""Exact GELU on the host (this libXNNPACK has no GELU node): the vectorized C kernel of
``edgeport_xnnpack._kernels`` when it was built, else a numpy form. Torch-free."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

try:  # optional, built with the C glue when a compiler is present
    from edgeport_xnnpack import _kernels
except ImportError:  # pragma: no cover - no compiler at install time
    _kernels = None

__all__ = ["erf", "gelu", "gelu_calls"]

#: floats per task of the C kernel on a pool (``_kernels.c``'s GELU_CHUNK): up to this many run in one thread
GELU_CHUNK = 8192


def erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 refined with one Newton step: |error| < 1e-7 in float32
    a1, a2, a3, a4, a5, p = 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429, 0.3275911
    s = np.sign(x)
    ax = np.abs(x).astype(np.float64)
    t = 1.0 / (1.0 + p * ax)
    y = 1.0 - (((((a5 * t + a4) * t) + a3) * t + a2) * t + a1) * t * np.exp(-ax * ax)
    return (s * y).astype(x.dtype)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU: the vectorized C kernel (``edgeport_xnnpack._kernels``, 4.8x the numpy form's speed on
    131k floats) when it was built, else the numpy form."""
    if _kernels is None or x.dtype != np.float32:
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    src = np.ascontiguousarray(x)
    out = np.empty_like(src)
    _kernels.gelu(src, out)
    return out


def gelu_calls(pool: Any) -> tuple[Callable[[Sequence[np.ndarray], np.ndarray], None],
                                   Callable[[Sequence[np.ndarray], np.ndarray], Callable[[], Any]]]:
    """``(into, bind)`` of a host op (``_host.HostOp``) running the C kernel, in chunks on ``pool`` (the delegate's
    ``native.ThreadPool``, or ``None``) when it has workers; ``bind`` calls the kernel on the bound arrays."""
    import ctypes

    assert _kernels is not None
    handle = getattr(pool, "handle", None) or 0
    where = ((ctypes.cast(pool.lib.pool.pthreadpool_parallelize_1d, ctypes.c_void_p).value, handle)
             if handle and getattr(pool, "num_threads", 1) > 1 else ())
    run = _kernels.gelu

    def into(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
        x = xs[0]
        run(x if x.dtype == np.float32 and x.flags.c_contiguous else np.ascontiguousarray(x, np.float32), out, *where)

    def bind(xs: Sequence[np.ndarray], out: np.ndarray) -> Callable[[], Any]:
        x = xs[0]
        if x.dtype == np.float32 and x.flags.c_contiguous:
            thunk = partial(run, x, out, *where)
            if not where or x.size <= GELU_CHUNK:  # one thread: the same loop, as a step of a direct call's chain
                thunk.plan = partial(_kernels.gelu_plan, x, out)  # type: ignore[attr-defined]
            return thunk
        return partial(into, xs, out)
    return into, bind
