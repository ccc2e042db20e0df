"""The interleaved timing loop, worker-thread spinning after a call, and the output error measure."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def interleaved(fns: dict[str, Callable[[], Any]], reps: int, gap_s: float, warmup: int = 5,
                budget_s: float = 0.0, min_reps: int = 20, calls: int = 2) -> dict[str, list[list[float]]]:
    """Seconds per call: ``times[name][j]`` lists the ``j``-th of ``calls`` back-to-back calls of each repetition.

    Every repetition visits each function once, in an order rotated per repetition: sleep ``gap_s``, then call it
    ``calls`` times in a row. Call 0 is the first call after the idle gap ("cold": the worker threads have
    parked); call 1 follows it at once ("warm": steady state, as in a loop). A value with a ``calls(n)`` method
    (a contender in a child process) runs ``n`` calls and returns their seconds itself. With ``budget_s``, stops after
    ``min_reps`` repetitions once the loop has run that long."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            f = fns[n]
            f.calls(1) if hasattr(f, "calls") else f()
    times: dict[str, list[list[float]]] = {n: [[] for _ in range(calls)] for n in names}
    clock = time.perf_counter
    start = clock()
    for r in range(reps):
        if budget_s and r >= min_reps and clock() - start > budget_s:
            break
        k = r % len(names)
        for n in names[k:] + names[:k]:
            if gap_s:
                time.sleep(gap_s)
            fn, out = fns[n], times[n]
            if hasattr(fn, "calls"):  # a contender in another process: it times its own calls
                for j, v in enumerate(fn.calls(calls)):
                    out[j].append(v)
                continue
            for j in range(calls):
                t = clock()
                fn()
                out[j].append(clock() - t)
    return times


def _thread_cpu_s(clock_ids: list[int]) -> float:
    """The summed CPU time (s) of these per-thread clocks (threads that ended count 0)."""
    total = 0.0
    for cid in clock_ids:
        try:
            total += time.clock_gettime(cid)
        except OSError:
            pass
    return total


def spin_after(fn: Callable[[], Any], window_s: float = 0.1, tries: int = 5) -> float:
    """CPU ms this process burns while its main thread sleeps ``window_s`` right after ``fn()`` returns: worker
    threads spinning after the run (median of ``tries``).

    Linux: summed over the process's threads' own CPU clocks (clock id ``(~tid << 3) | 6``), which include the
    time a thread has run on another CPU since its last accounting update. ``time.process_time`` does not for
    threads other than the caller's: a worker that ran the whole call without a context switch had its call time
    counted in the window after it (MobileNetV2: ~2 ms "after the call" at any spin; with the thread clocks 0.11 ms
    at a 50 us spin, 0.25 ms at 200 us, 1.05 ms at 1 ms). Elsewhere ``time.process_time``."""
    res = []
    task_dir = "/proc/self/task"
    for _ in range(tries):
        fn()
        ids = [((~int(t)) << 3) | 6 for t in os.listdir(task_dir)] if os.path.isdir(task_dir) else None
        c0 = time.process_time() if ids is None else _thread_cpu_s(ids)
        time.sleep(window_s)
        res.append((time.process_time() if ids is None else _thread_cpu_s(ids)) - c0)
    return statistics.median(res) * 1e3


def rel_err(a: Any, ref: Any) -> float:
    """max |a - ref| / max |ref| (inf when the shapes differ)."""
    import numpy as np

    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    if a.shape != ref.shape:
        return float("inf")
    scale = float(np.abs(ref).max()) or 1.0
    return float(np.abs(a - ref).max()) / scale
