"""The thread pool's load gauge: a pool reads the machine's CPU time (the ``cpu`` line of ``/proc/stat``; a file
the test advances here stands in for it), subtracts its own process's, and uses only the threads the other programs
leave free -- on the caller alone when they fill every other CPU, on every thread again when they stop. Every item
still runs exactly once and XNNPACK's results are the same bits. No timing here (bench/xnnpack.py --busy-core
measures the effect)."""

from __future__ import annotations

import threading
import time
from ctypes import CFUNCTYPE, c_size_t, c_uint32, c_void_p
from pathlib import Path

import numpy as np
import pytest
from test_own_thread_pool import expected_calls, fc_on, own, run_kind

from edgeport_xnnpack import native

pytestmark = pytest.mark.skipif(not native.is_available()[0], reason="libXNNPACK not installed")


class FakeStat:
    """A ``/proc/stat`` stand-in whose counters advance by one window per :meth:`tick`, ``busy`` of ``cpus`` CPUs
    busy in it (the test process's own CPU time is real and small: the gauge subtracts it)."""

    def __init__(self, path: Path, busy: float, cpus: int = 2) -> None:
        self.path, self.busy, self.cpus = path, busy, cpus
        self.used = self.idle = 0
        self.tick()

    def tick(self, ticks: int = 100) -> None:
        used = round(ticks * self.busy)
        self.used += used
        self.idle += ticks * self.cpus - used
        # user nice system idle iowait irq softirq steal guest guest_nice, then the per-CPU lines
        self.path.write_text(f"cpu  {self.used} 0 0 {self.idle} 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")


def threads_of_calls(lib: native.Library, pool: native.ThreadPool, n: int = 64) -> set[int]:
    """The threads that ran the items of one 1-d call of ``n`` items (each item waits a little, so that a woken
    worker has the time to join)."""
    seen: set[int] = set()
    lock = threading.Lock()

    def task(_ctx, _i):
        time.sleep(0.0002)
        with lock:
            seen.add(threading.get_ident())

    proto = CFUNCTYPE(None, c_void_p, c_size_t)
    cb = proto(task)
    fn = lib.pool.pthreadpool_parallelize_1d
    fn.restype = None
    fn.argtypes = (c_void_p, proto, c_void_p, c_size_t, c_uint32)
    fn(pool.handle, cb, None, n, 0)
    return seen


def settle(lib: native.Library, pool: native.ThreadPool, want: int, fake: FakeStat) -> dict:
    """Calls (each after the gauge's period, the fake file a window further) until the gauge offers ``want``
    threads; its stats then."""
    for _ in range(200):
        fake.tick()
        run_kind(lib, pool.handle, "1d", (8,), (1,))
        stats = pool.load_stats()
        if stats["threads"] == want:
            return stats
        time.sleep(0.002)
    raise AssertionError(f"the gauge never offered {want} threads: {pool.load_stats()}")


def test_busy_machine_runs_on_the_caller_alone_then_on_every_thread_again(tmp_path):
    lib = own()
    fake = FakeStat(tmp_path / "stat", busy=2.0)  # both CPUs busy, this process a small part of it
    pool = native.ThreadPool(2)
    try:
        assert pool.set_load_gauge(0.5, str(fake.path), online=2)
        stats = settle(lib, pool, 1, fake)
        assert stats["others"] > 0.5 and stats["reads"] >= 1  # 2 CPUs - others + 0.5 < 2: one thread
        solo_before = stats["solo"]
        caller = threading.get_ident()
        for n in (2, 7, 64):
            assert threads_of_calls(lib, pool, n) == {caller}  # no worker took an item
        assert run_kind(lib, pool.handle, "2d_tile_2d", (13, 11), (2, 3)) == expected_calls((13, 11), (2, 3), 2)
        assert pool.load_stats()["solo"] >= solo_before + 4
        fake.busy = 0.0  # the machine is free again (this process's time is more than the file's: no others)
        stats = settle(lib, pool, 2, fake)
        assert stats["others"] <= 0.5
        for n in (1, 5, 97):
            assert run_kind(lib, pool.handle, "1d", (n,), (1,)) == expected_calls((n,), (1,), 0)
    finally:
        pool.close()


def test_partly_busy_machine_limits_the_threads_and_runs_every_item_once(tmp_path):
    lib = own()
    fake = FakeStat(tmp_path / "stat", busy=5.0, cpus=8)  # 5 of 8 CPUs busy, this process under 1 of them
    pool = native.ThreadPool(8)
    try:
        assert pool.set_load_gauge(0.5, str(fake.path), online=8)
        for _ in range(50):
            fake.tick()
            run_kind(lib, pool.handle, "1d", (16,), (1,))
            time.sleep(0.001)
        stats = pool.load_stats()
        assert 1 <= stats["threads"] <= 4, stats  # at most 8 CPUs - 4 others (5 busy minus this process's < 1)
        assert stats["limited"] + stats["solo"] >= 1
        for kind, ranges, tiles, tiled in (("1d", (1000,), (1,), 0), ("2d_tile_2d", (13, 11), (2, 3), 2),
                                           ("4d_tile_2d", (3, 2, 5, 7), (1, 1, 2, 3), 2)):
            assert run_kind(lib, pool.handle, kind, ranges, tiles) == expected_calls(ranges, tiles, tiled)
    finally:
        pool.close()


@pytest.mark.parametrize("text", ["", "garbage\n", "cpu\n", "cpu  1 2 x 4\n", "cpu0 1 2 3 4 5\n",
                                  "intr 1 2 3 4 5\n", "cpu  -1 0 0 5\n", "1.00 0.50 0.25 9/321 4242\n"])
def test_unreadable_load_keeps_every_thread(tmp_path, text):
    lib = own()
    fake = tmp_path / "stat"
    fake.write_text(text)
    pool = native.ThreadPool(2)
    try:
        assert pool.set_load_gauge(0.5, str(fake), online=2)
        for _ in range(5):
            assert run_kind(lib, pool.handle, "1d", (9,), (1,)) == expected_calls((9,), (1,), 0)
            time.sleep(0.001)
        stats = pool.load_stats()
        assert stats["threads"] == 2 and stats["solo"] == 0 and stats["reads"] >= 1
    finally:
        pool.close()


def test_gauge_settings_are_checked(tmp_path):
    own()
    pool = native.ThreadPool(2)
    try:
        for period, path, online in ((-1, None, 0), (0.01, None, 0), (2e4, None, 0), (1, None, -1),
                                     (1, str(tmp_path / "missing"), 0)):
            with pytest.raises(native.XnnpackError, match="bad load gauge"):
                pool.set_load_gauge(period, path, online)
        assert pool.set_load_gauge(0)  # off: every call may use every thread, the file is never read
        before = pool.load_stats()
        run_kind(own(), pool.handle, "1d", (50,), (1,))
        assert pool.load_stats()["reads"] == before["reads"] and pool.load_stats()["threads"] == 2
        assert pool.set_load_gauge(10)  # back on, on /proc/stat
    finally:
        pool.close()
    assert not native.ThreadPool(1).set_load_gauge(10)  # no pool to set
    assert native.ThreadPool(1).load_stats() is None


def test_xnnpack_results_do_not_depend_on_the_load(tmp_path):
    lib = own()
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)
    outs = []
    for busy in (0.0, 2.0):
        fake = FakeStat(tmp_path / "stat", busy)
        pool = native.ThreadPool(2)
        try:
            assert pool.set_load_gauge(0.5, str(fake.path), online=2)
            settle(lib, pool, 2 if busy == 0 else 1, fake)
            outs.append(fc_on(pool, x, w))
        finally:
            pool.close()
    assert np.array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], x @ w.T, rtol=1e-4, atol=1e-3)
