"""Which pthreadpool libXNNPACK runs on: edgeport's own (``edgeport_xnnpack._pool``, C) or the system's.

Debian's ``libpthreadpool0`` (2021) makes its workers spin ~30 ms after every parallel operator and waits at every
operator for each worker, woken or not; on a CPU that other processes share, a two-thread delegate then runs
slower than a one-thread one. edgeport's pool (``_pool.c``: the caller always works, items handed out in small
chunks, bounded spin then a futex, contention back-off) implements the pthreadpool C ABI that the 2022
libXNNPACK imports. It is built with the soname ``libpthreadpool.so.0`` and opened (locally, not into the global
symbol scope) *before* libXNNPACK, so the loader satisfies libXNNPACK's dependency with it; afterwards
:func:`binding_problem` reads libXNNPACK's resolved GOT slots and confirms every ``pthreadpool_*`` reference points
at it. When it cannot (the extension was not built, libXNNPACK was loaded earlier in this process, or
``EDGEPORT_XNNPACK_POOL=system`` asks for the system pool, a diagnostic for benchmarks) the system pool is used
and :func:`edgeport_xnnpack.native.pool_status` says why.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os

__all__ = ["ENV", "LOAD_ENV", "MODE", "binding_problem", "open_own"]

ENV = "EDGEPORT_XNNPACK_POOL"
#: ``off`` turns the pool's load gauge off (a diagnostic for benchmarks): every call may then use every thread
LOAD_ENV = "EDGEPORT_XNNPACK_LOAD_GAUGE"
#: how both libraries are opened: RTLD_NOW resolves libXNNPACK's references at load (its GOT can be checked),
#: RTLD_LOCAL keeps edgeport's pthreadpool_* out of the global scope (torch has its own)
MODE = getattr(os, "RTLD_NOW", 2) | getattr(os, "RTLD_LOCAL", 0)
_BAD_LEN = 8192


def open_own() -> tuple[ctypes.CDLL | None, str]:
    """Load edgeport's pool library (to be called before libXNNPACK is loaded); ``(cdll, "")`` or
    ``(None, reason)``."""
    choice = os.environ.get(ENV, "").strip().lower()
    if choice == "system":
        return None, f"{ENV}=system asks for the system libpthreadpool"
    if choice not in ("", "edgeport"):
        return None, f"{ENV}={choice!r} is not 'edgeport' or 'system'; using the system libpthreadpool"
    try:
        spec = importlib.util.find_spec("edgeport_xnnpack._pool")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return None, ("edgeport_xnnpack._pool is not built (no C compiler when the package was installed; "
                      "rebuild: cd backends-xnnpack && python setup.py build_ext --inplace)")
    try:
        lib = ctypes.CDLL(spec.origin, mode=MODE)
    except OSError as exc:
        return None, f"cannot load edgeport_xnnpack._pool: {exc}"
    lib.edgeport_pool_binding.restype = ctypes.c_int
    lib.edgeport_pool_binding.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
    lib.edgeport_pool_stats.restype = None
    lib.edgeport_pool_stats.argtypes = (ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64))
    if hasattr(lib, "edgeport_pool_set_policy"):  # absent from a build older than this module
        lib.edgeport_pool_set_policy.restype = ctypes.c_int
        lib.edgeport_pool_set_policy.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
    if hasattr(lib, "edgeport_pool_set_load_gauge"):
        lib.edgeport_pool_set_load_gauge.restype = ctypes.c_int
        lib.edgeport_pool_set_load_gauge.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int)
        lib.edgeport_pool_load_stats.restype = None
        lib.edgeport_pool_load_stats.argtypes = (ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64))
    return lib, ""


def binding_problem(own: ctypes.CDLL, xnn: ctypes.CDLL) -> str:
    """``""`` when every ``pthreadpool_*`` reference of the loaded libXNNPACK resolves to ``own``, else why not."""
    bad = ctypes.create_string_buffer(_BAD_LEN)
    ours = own.edgeport_pool_binding(xnn._handle, bad, _BAD_LEN)
    if ours < 0:
        return "cannot read libXNNPACK's relocation tables (dlinfo failed or not a 64-bit ELF library)"
    if bad.value:
        return (f"libXNNPACK's pthreadpool references resolve elsewhere (was libXNNPACK loaded before "
                f"edgeport_xnnpack?): {bad.value.decode(errors='replace')}")
    if ours == 0:
        return "libXNNPACK imports no pthreadpool functions"
    return ""

