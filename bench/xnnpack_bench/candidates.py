"""Candidate fixes, measured and never applied to the package: the input transpose on XNNPACK, one shared pool."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def transpose_candidate(reps: int = 300) -> dict[str, tuple[float, float]]:
    """The NCHW -> NHWC input transpose of a 1x3x224x224 image, as edgeport's host step does it (numpy) and as
    the 2022 libXNNPACK can do it natively: ``channel_shuffle_nc_x32`` with groups = C, group_channels = H*W is
    exactly that transpose (its zip micro-kernels). Single thread; (median, min) ms."""
    import ctypes
    from ctypes import POINTER, c_int, c_size_t, c_uint32, c_void_p

    import numpy as np

    from edgeport_xnnpack import native

    xnn = native.library().xnn
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    out = np.empty((1, 224, 224, 3), np.float32)
    perm = (0, 2, 3, 1)

    def timeit(fn: Callable[[], Any]) -> tuple[float, float]:
        fn()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e3, min(ts) * 1e3

    res = {"numpy copyto(out, x.transpose(0, 2, 3, 1)) (host step)": timeit(lambda: np.copyto(out, x.transpose(perm)))}
    create = xnn.xnn_create_channel_shuffle_nc_x32
    create.restype, create.argtypes = c_int, [c_size_t, c_size_t, c_size_t, c_size_t, c_uint32, POINTER(c_void_p)]
    setup = xnn.xnn_setup_channel_shuffle_nc_x32
    setup.restype, setup.argtypes = c_int, [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p]
    run, delete = xnn.xnn_run_operator, xnn.xnn_delete_operator
    run.restype, run.argtypes = c_int, [c_void_p, c_void_p]
    delete.restype, delete.argtypes = c_int, [c_void_p]
    op = c_void_p()
    hw = 224 * 224
    if create(3, hw, 3 * hw, 3 * hw, 0, ctypes.byref(op)) != 0:
        return res
    try:
        if setup(op, 1, x.ctypes.data, out.ctypes.data, None) != 0:
            return res
        out[...] = 0
        run(op, None)
        if np.array_equal(out, x.transpose(perm)):
            res["xnn channel_shuffle_nc_x32 (groups 3, group_channels 50176)"] = timeit(lambda: run(op, None))
    finally:
        delete(op)
    return res


def load_with_shared_pool(pte: bytes) -> tuple[Any, Any]:
    """Load ``pte`` with edgeport's runtime such that all its XNNPACK delegates share one pthreadpool (a candidate
    fix: the executor makes one pool per delegate). Only this bench process is patched, only while loading."""
    from edgeport.runtime import Runtime
    from edgeport_xnnpack import native

    real = native.ThreadPool
    pools: dict[Any, Any] = {}

    class _Shared:  # what the executor sees: the pool's handle and size; closing it is left to the bench
        def __init__(self, pool: Any) -> None:
            self.pool, self.handle, self.num_threads = pool, pool.handle, pool.num_threads

        def close(self) -> None:
            pass

    def shared_pool(num_threads: int | None = None) -> Any:
        if num_threads not in pools:
            pools[num_threads] = _Shared(real(num_threads))
        return pools[num_threads]

    native.ThreadPool = shared_pool  # type: ignore[assignment,misc]
    try:
        method = Runtime.get().load_program(pte).load_method("forward")
    finally:
        native.ThreadPool = real  # type: ignore[misc]
    if len(pools) != 1:
        raise RuntimeError(f"expected the delegates to ask for one pool size, got {sorted(map(str, pools))}")
    return method, next(iter(pools.values())).pool
