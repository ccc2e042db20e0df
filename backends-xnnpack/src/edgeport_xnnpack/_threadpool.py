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
import math
import os
from pathlib import Path

__all__ = ["ENV", "LOAD_ENV", "MODE", "binding_problem", "cpu_quota", "open_own"]

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
    if hasattr(lib, "edgeport_pool_moved"):
        lib.edgeport_pool_moved.restype = ctypes.c_uint64
        lib.edgeport_pool_moved.argtypes = (ctypes.c_void_p,)
        lib.edgeport_pool_move_off.restype = ctypes.c_int
        lib.edgeport_pool_move_off.argtypes = (ctypes.c_int,)
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



def cpu_quota(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """The CPUs this process's cgroups let it use (a container's ``--cpus``): the quota over the period, rounded
    up, the smallest along the cgroup's path (cgroup v2 ``cpu.max``; v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``); ``None`` when no quota is set or the files cannot be read. A pool sized by the affinity
    mask alone would start 64 threads in a 2-CPU container on a 64-core host."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":  # v2: the unified hierarchy (or its hybrid mount)
            bases = [Path(root), Path(root) / "unified"]
            limits += _walk(bases, path, _v2_limit)
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own mount
            bases = [Path(root) / controllers, Path(root) / "cpu", Path(root) / "cpu,cpuacct"]
            limits += _walk(bases, path, _v1_limit)
    return max(1, math.ceil(min(limits) - 1e-9)) if limits else None


def _walk(bases: list[Path], path: str, read) -> list[float]:
    """The limits ``read`` finds in the cgroup ``path`` and its ancestors below the first base that exists (in a
    container the cgroup's own directory is the mount's root, so the root always counts)."""
    for base in bases:
        if not base.is_dir():
            continue
        parts = [p for p in path.strip("/").split("/") if p]
        dirs = [base.joinpath(*parts[:k]) for k in range(len(parts), -1, -1)]
        return [v for d in dirs if d.is_dir() for v in [read(d)] if v is not None]
    return []


def _v2_limit(d: Path) -> float | None:
    try:
        quota, period = (d / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else _ratio(int(quota), int(period))
    except (OSError, ValueError):
        return None


def _v1_limit(d: Path) -> float | None:
    try:
        quota = int((d / "cpu.cfs_quota_us").read_text())
        period = int((d / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota < 0 else _ratio(quota, period)


def _ratio(quota: int, period: int) -> float | None:
    return quota / period if quota > 0 and period > 0 else None
