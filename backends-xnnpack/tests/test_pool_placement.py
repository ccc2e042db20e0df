"""A woken pool worker that the kernel left on its caller's CPU moves itself to another CPU the process may use
(taking turns with the caller on one CPU helps nobody). The test makes that placement certain -- the caller pinned
to CPU 0, the worker parked on CPU 0 and then allowed every CPU, while another process keeps CPU 1 busy so the
kernel finds no idle CPU to wake it on -- and checks the move is counted, the worker's affinity is its whole set
again afterwards, and every item ran once. Runs in a child process (it pins threads). No timing here."""

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

CHILD = textwrap.dedent("""
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
        moved = 0
        for _ in range(20):
            os.sched_setaffinity(worker, {0})
            time.sleep(0.01)  # it parks on CPU 0
            os.sched_setaffinity(worker, whole)
            m0 = pool.stats()["moved"]
            assert run_kind(lib, pool.handle, "1d", (64,), (1,)) == expected_calls((64,), (1,), 0)
            time.sleep(0.01)  # the worker runs on CPU 0 once the caller sleeps, if not before
            moved += pool.stats()["moved"] - m0
        print(moved, sorted(os.sched_getaffinity(worker)) == sorted(whole), pool.stats())
    finally:
        spinner.kill()
        pool.close()
""")


def test_a_worker_woken_on_its_callers_cpu_moves_off_it():
    out = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    moved, restored, stats = out.stdout.split(" ", 2)
    assert int(moved) >= 1, stats
    assert restored == "True", stats
