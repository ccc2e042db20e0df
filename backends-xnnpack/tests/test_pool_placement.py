"""A pool worker that finds itself on its caller's CPU when a job comes moves itself to another CPU the process may
use (taking turns with the caller on one CPU helps nobody): it sets its affinity to its CPUs without that one (the
kernel migrates a running thread at once) and then back to the whole set. Checked in child processes (they pin
threads): the move itself on the calling thread (``edgeport_pool_move_off``, the function the workers call) --
moved, on another CPU, affinity whole again; nothing to do when that CPU is the only one allowed or the thread is
elsewhere -- and a pool whose worker is woken while the caller is pinned and another CPU is kept busy: every item
once, the worker's affinity whole again, its moves counted (how often the kernel wakes it on the caller's CPU is
the kernel's choice, so that count is reported, not required). No timing here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgeport_xnnpack import native

pytestmark = [
    pytest.mark.skipif(not native.is_available()[0], reason="libXNNPACK not installed"),
    pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not {0, 1} <= os.sched_getaffinity(0),
                       reason="needs CPUs 0 and 1"),
]

MOVE = textwrap.dedent("""
    import ctypes, os
    from edgeport_xnnpack import native

    getcpu = ctypes.CDLL(None).sched_getcpu
    lib = native.library()
    assert lib.own_pool, lib.pool_reason
    move_off = lib.pool.edgeport_pool_move_off
    whole = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})  # now on CPU 0
    os.sched_setaffinity(0, whole)  # still on CPU 0: a running thread stays where it is allowed
    print(getcpu(), move_off(0), getcpu(), sorted(os.sched_getaffinity(0)) == sorted(whole))
    print(move_off(0))  # not on CPU 0 any more: nothing to do
    os.sched_setaffinity(0, {0})
    print(move_off(0), getcpu(), sorted(os.sched_getaffinity(0)))  # the only CPU allowed: stays
""")

POOL = textwrap.dedent("""
    import os, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from test_own_thread_pool import expected_calls, own, run_kind
    from edgeport_xnnpack import native

    lib = own()
    before = set(os.listdir("/proc/self/task"))
    pool = native.ThreadPool(2)
    worker = int((set(os.listdir("/proc/self/task")) - before).pop())
    whole = os.sched_getaffinity(worker)
    assert pool.set_load_gauge(0) and pool.set_policy(50, 0)  # no load gauge, no back-off: always wake the worker
    spinner = subprocess.Popen([sys.executable, "-c", "import os\\nos.sched_setaffinity(0, {1})\\nwhile True: pass"])
    try:
        time.sleep(0.2)
        os.sched_setaffinity(0, {0})
        for _ in range(20):
            os.sched_setaffinity(worker, {0})
            time.sleep(0.01)  # it parks on CPU 0
            os.sched_setaffinity(worker, whole)
            assert run_kind(lib, pool.handle, "1d", (64,), (1,)) == expected_calls((64,), (1,), 0)
            time.sleep(0.01)
        print(sorted(os.sched_getaffinity(worker)) == sorted(whole), pool.stats())
    finally:
        spinner.kill()
        pool.close()
""")


def _child(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_a_thread_on_the_cpu_to_leave_moves_and_keeps_its_affinity():
    first, again, alone = _child(MOVE)
    cpu, moved, cpu_after, restored = first.split()
    assert (cpu, moved, restored) == ("0", "1", "True") and cpu_after != "0"
    assert again == "0"
    assert alone == "0 0 [0]"


def test_a_pool_woken_from_a_pinned_caller_runs_every_item_and_restores_the_worker():
    (line,) = _child(POOL)
    restored, stats = line.split(" ", 1)
    assert restored == "True", stats
    assert "'moved':" in stats, stats
