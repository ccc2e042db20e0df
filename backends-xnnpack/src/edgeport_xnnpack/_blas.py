"""Run numpy's matrix multiplies single-threaded for the span of a host segment (torch-free).

The executor's XNNPACK thread pool (Debian's 2021 pthreadpool) keeps its workers spinning for ~30 ms after each
parallel call, and OpenBLAS's workers spin too after a multi-threaded GEMM: on a machine with as many cores as
threads the two pools then take turns waiting for each other's descheduled workers, and a host segment's small
batch matmuls (or the next XNNPACK runtime) get many times slower. ``single_threaded_blas()`` sets numpy's
OpenBLAS to one thread and restores the caller's setting on exit (two cheap C calls; nothing else of the
process changes, and only for the duration of the block). Without an OpenBLAS in the process it does nothing.
``cblas_address`` finds its CBLAS ``sgemm`` / ``sgemv`` for the host matrix products (``_host_gemm``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_SYMBOLS = [(f"{p}openblas_get_num_threads{s}", f"{p}openblas_set_num_threads{s}")
            for p in ("scipy_", "") for s in ("64_", "")]
_fns: tuple[Any, Any] | None | bool = False  # False: not looked up yet; None: no OpenBLAS
# CBLAS function name patterns, with whether their integers are 64-bit (numpy's scipy-openblas64 is ILP64)
_CBLAS = [("scipy_cblas_{}64_", True), ("cblas_{}64_", True), ("scipy_cblas_{}", False), ("cblas_{}", False)]
_cblas: dict[str, tuple[int, bool] | None] = {}


def _libraries() -> list[Any]:
    """numpy's OpenBLAS libraries loaded in this process (Linux: from /proc/self/maps)."""
    import numpy  # noqa: F401 - its OpenBLAS must be loaded before we look for it

    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.rsplit("/", 1)[-1].lower()})
    except OSError:  # pragma: no cover - not Linux
        return []
    libs = []
    for path in paths:
        try:
            libs.append(ctypes.CDLL(path))
        except OSError:  # pragma: no cover
            continue
    return libs


def _find() -> tuple[Any, Any] | None:
    for lib in _libraries():
        for get_name, set_name in _SYMBOLS:
            get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                return get, set_
    return None


def cblas_address(name: str) -> tuple[int, bool] | None:
    """``(address, ilp64)`` of numpy's OpenBLAS CBLAS function ``name`` (``"sgemm"``, ``"sgemv"``), or ``None``."""
    if name not in _cblas:
        found = None
        for lib in _libraries():
            for pattern, ilp64 in _CBLAS:
                fn = getattr(lib, pattern.format(name), None)
                if fn is not None:
                    found = (ctypes.cast(fn, ctypes.c_void_p).value or 0, ilp64)
                    break
            if found:
                break
        _cblas[name] = found
    return _cblas[name]


def blas_threads() -> tuple[Any, Any] | None:
    """``(get_num_threads, set_num_threads)`` of numpy's OpenBLAS, or ``None``."""
    global _fns
    if _fns is False:
        _fns = _find()
    return _fns  # type: ignore[return-value]


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    fns = blas_threads()
    if fns is None:
        yield
        return
    get, set_ = fns
    n = get()
    if n == 1:
        yield
        return
    set_(1)
    try:
        yield
    finally:
        set_(n)
