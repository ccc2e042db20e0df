"""The C glue (``edgeport_xnnpack._glue``) under concurrent use and closing, and its 8-bit channel shuffle.

Several threads on the SAME runtime / operator: each call gives the numpy oracle's result or raises "already
running"; closing while another thread runs is refused, then the runner gets a clear "deleted" error. These run in
a subprocess (a crash fails the test instead of killing pytest). Also the 8-bit channel shuffle
(``element_size=1``) on a real ``xnn_create_channel_shuffle_nc_x8`` operator, against a numpy transpose,
and the glue's element-size checks.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from ctypes import POINTER, c_int, c_size_t, c_uint32, c_void_p
from typing import Any

import numpy as np
import pytest
from glue_fuzz_helpers import BUSY, GLUE_MARKS, fc_ref, fc_runtime, page_end_bytes, run_isolated

from edgeport_xnnpack import native
from edgeport_xnnpack._native_run import _fn_address, _raise_status

pytestmark = GLUE_MARKS


# --------------------------------------------------------------------------------------------------------------
# (b) several threads on the SAME runtime / operator, (c) closing it under them
# --------------------------------------------------------------------------------------------------------------

def concurrent_runs(n_threads: int, iters: int, threads_in_pool: int) -> None:
    """Threads calling ``run_list`` on one runtime at once (own arrays, staged inputs, generators that run Python
    code inside the call): each call gives the right numbers or raises "already running"."""
    sys.setswitchinterval(1e-6)
    pool = native.ThreadPool(threads_in_pool) if threads_in_pool > 1 else None
    rt, w, b = fc_runtime(batch=16, k=128, n=96, pool=pool, seed=5)
    op = native.ChannelShuffle(2, 8, 64, pool)
    start = threading.Barrier(n_threads)
    counts = {"ok": 0, "busy": 0}
    errors: list[str] = []
    lock = threading.Lock()

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        start.wait()
        for i in range(iters):
            style = (t + i) % 4
            if style == 3:  # the channel shuffle
                x = rng.standard_normal((2, 8, 64), dtype=np.float32)
                out = np.full((2, 64, 8), np.nan, np.float32)
                want = x.transpose(0, 2, 1)
            else:
                x = (page_end_bytes(16 * 128 * 4).view(np.float32).reshape(16, 128) if style == 1
                     else np.empty((16, 128), np.float32))
                x[...] = rng.standard_normal((16, 128), dtype=np.float32)
                out = np.full((16, 96), np.nan, np.float32)
                want = fc_ref(x, w, b)
            try:
                if style == 3:
                    op.run(x, out)
                else:  # style 2: a generator, so Python code (and thread switches) runs inside the call
                    rt.run_list((a for a in (x, out)) if style == 2 else [x, out])
            except RuntimeError as exc:
                if BUSY not in str(exc):
                    errors.append(f"thread {t}: {type(exc).__name__}: {exc}")
                with lock:
                    counts["busy"] += 1
                continue
            if not np.allclose(out, want, rtol=1e-4, atol=1e-3):
                errors.append(f"thread {t} call {i} style {style}: wrong numbers")
            with lock:
                counts["ok"] += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:5]
    assert counts["ok"] > 0, counts
    x = np.ones((16, 128), np.float32)
    out = np.empty((16, 96), np.float32)
    rt.run_list([x, out])  # still usable
    np.testing.assert_allclose(out, fc_ref(x, w, b), rtol=1e-4, atol=1e-3)
    rt.close()
    op.close()
    if pool is not None:
        pool.close()
    print(counts["ok"], counts["busy"])


def close_while_running(what: str) -> None:
    """One thread runs the runtime (or shuffle) in a loop; the main thread closes it meanwhile. Closing is
    refused while a call runs; once closed, the runner gets a clear "deleted" error; results before are right."""
    sys.setswitchinterval(1e-6)
    rt, w, b = fc_runtime(batch=32, k=128, n=128, seed=6)
    op = native.ChannelShuffle(4, 16, 128)
    target = rt if what == "runtime" else op
    state = {"ok": 0, "end": None, "wrong": 0}
    started = threading.Event()

    def runner() -> None:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((32, 128), dtype=np.float32)
        xs = rng.standard_normal((4, 16, 128), dtype=np.float32)
        while True:
            if what == "runtime":
                out = np.full((32, 128), np.nan, np.float32)
                want = fc_ref(x, w, b)
            else:
                out = np.full((4, 128, 16), np.nan, np.float32)
                want = xs.transpose(0, 2, 1)
            try:
                if what == "runtime":
                    rt.run_list([x, out])
                else:
                    op.run(xs, out)
            except RuntimeError as exc:
                if BUSY in str(exc):
                    continue
                state["end"] = f"{type(exc).__name__}: {exc}"
                return
            finally:
                started.set()
            state["ok"] += 1
            state["wrong"] += not np.allclose(out, want, rtol=1e-4, atol=1e-3)

    th = threading.Thread(target=runner)
    th.start()
    started.wait()
    time.sleep(0.02)
    refused = 0
    deadline = time.monotonic() + 10
    while True:
        try:
            target.close()
            break
        except RuntimeError as exc:
            assert "while it runs" in str(exc), exc
            refused += 1
            assert time.monotonic() < deadline, "close() refused for 10 s"
    th.join(10)
    assert not th.is_alive()
    assert state["end"] is not None and "deleted" in state["end"], state
    assert state["ok"] > 0 and state["wrong"] == 0, state
    for t in (rt, op):
        t.close()
    print(state["ok"], refused)


def call_from_another_thread_while_arguments_are_iterated() -> None:
    """A call whose arguments come from a generator runs Python code (and lets other threads run) before its
    buffers are bound; another thread's call on the same runtime meanwhile must be refused, not run on the shared
    binding state (before the fix it did: two setups / invokes interleaved, views released twice)."""
    rt, w, b = fc_runtime(batch=128, k=1024, n=1024, seed=9)  # an invoke of a few milliseconds
    rng = np.random.default_rng(9)
    xa, xb = (rng.standard_normal((128, 1024), dtype=np.float32) for _ in range(2))
    out_a, out_b = np.full((128, 1024), np.nan, np.float32), np.full((128, 1024), np.nan, np.float32)
    result: dict[str, Any] = {}

    def other() -> None:
        try:
            rt.run_list([xb, out_b])
            result["b"] = "ran"
        except RuntimeError as exc:
            result["b"] = str(exc)

    th = threading.Thread(target=other)

    def arguments():
        yield xa
        th.start()
        time.sleep(0.0005)  # the other thread's call starts now (and, unrefused, is still in XNNPACK after)
        yield out_a

    for _ in range(3):
        out_a[...] = np.nan
        rt.run_list(arguments())
        th.join()
        np.testing.assert_allclose(out_a, fc_ref(xa, w, b), rtol=1e-4, atol=1e-3)
        if result["b"] == "ran":  # acceptable only with the right numbers (it was refused in every run seen)
            assert np.allclose(out_b, fc_ref(xb, w, b), rtol=1e-4, atol=1e-3), \
                f"the other thread's call gave wrong numbers ({np.isnan(out_b).sum()} NaN)"
        else:
            assert BUSY in result["b"], result
        th = threading.Thread(target=other)
    assert sys.getrefcount(xa) == sys.getrefcount(xb)  # no buffer released twice (nor leaked)
    rt.close()
    print(result["b"])


def test_call_from_another_thread_while_arguments_are_iterated():
    assert BUSY in run_isolated(call_from_another_thread_while_arguments_are_iterated)


@pytest.mark.parametrize("n_threads, iters, pool", [(4, 150, 1), (3, 100, 2)])
def test_concurrent_runs_on_one_runtime(n_threads, iters, pool):
    ok, busy = map(int, run_isolated(concurrent_runs, n_threads, iters, pool).split())
    assert ok + busy == n_threads * iters


@pytest.mark.parametrize("what", ["runtime", "shuffle"])
def test_close_while_another_thread_runs(what):
    run_isolated(close_while_running, what)


# --------------------------------------------------------------------------------------------------------------
# (d) the 8-bit channel shuffle (element_size=1) on a real xnn_create_channel_shuffle_nc_x8 operator
# --------------------------------------------------------------------------------------------------------------

_CREATE_X8 = ctypes.CFUNCTYPE(c_int, c_size_t, c_size_t, c_size_t, c_size_t, c_uint32, POINTER(c_void_p))
_SETUP_X8 = ctypes.CFUNCTYPE(c_int, c_void_p, c_size_t, c_void_p, c_void_p, c_void_p)


class Shuffle8:
    """An ``xnn_create_channel_shuffle_nc_x8`` operator bound by the glue with ``element_size=1``."""

    def __init__(self, batch: int, groups: int, group_channels: int, pool: Any = None) -> None:
        from edgeport_xnnpack import _glue

        lib = native.library()
        if not all(hasattr(lib.xnn, f"xnn_{s}_channel_shuffle_nc_x8") for s in ("create", "setup")):
            pytest.skip("this libXNNPACK has no channel_shuffle_nc_x8")
        create = _CREATE_X8(("xnn_create_channel_shuffle_nc_x8", lib.xnn))
        self.setup = _SETUP_X8(("xnn_setup_channel_shuffle_nc_x8", lib.xnn))
        c = groups * group_channels
        h = c_void_p()
        lib.check(create(groups, group_channels, c, c, 0, ctypes.byref(h)), "xnn_create_channel_shuffle_nc_x8")
        self.lib, self.handle, self.shape = lib, h.value, (batch, groups, group_channels)
        self.glue = _glue.Binding(_glue.KIND_SHUFFLE, self.handle, _fn_address(self.setup),
                                  _fn_address(lib.xnn.xnn_run_operator), [0, 1], [batch * c] * 2, [False, True],
                                  native.EXTRA_BYTES, 4096, _raise_status, pool.handle if pool else None, batch,
                                  element_size=1)

    def close(self) -> None:
        self.glue.close()
        if self.handle:
            self.lib.xnn.xnn_delete_operator(self.handle)
        self.handle = None


@pytest.mark.parametrize("threads", [1, 2])
def test_x8_channel_shuffle_matches_numpy(threads):
    pool = native.ThreadPool(threads) if threads > 1 else None
    rng = np.random.default_rng(8)
    try:
        for batch, groups, gc_ in [(1, 2, 1), (2, 3, 5), (3, 4, 7), (1, 16, 33), (2, 2, 64)]:
            op = Shuffle8(batch, groups, gc_, pool)
            n = batch * groups * gc_
            try:
                x = rng.integers(-128, 128, (batch, groups, gc_), dtype=np.int8)
                out = np.zeros((batch, gc_, groups), np.int8)
                assert op.glue.run([x, out]) is True
                np.testing.assert_array_equal(out, x.transpose(0, 2, 1))
                assert op.glue.run([x, out]) is False and op.glue.setups == 1  # same pointers: no setup
                staged = page_end_bytes(n).view(np.int8).reshape(x.shape)  # input ending at a page end
                staged[...] = x[::-1]
                u8_out = bytearray(n)
                op.glue.run([staged, u8_out])
                np.testing.assert_array_equal(np.frombuffer(u8_out, np.int8).reshape(out.shape),
                                              staged.transpose(0, 2, 1))
                op.glue.run([x.view(np.uint8).tobytes(), memoryview(out).cast("B")])  # any 1-byte buffers
                np.testing.assert_array_equal(out, x.transpose(0, 2, 1))
                for src, dst, message in [
                    (x.astype(np.int32), out, "bytes"),                                   # wrong size
                    (x, out.view(np.uint8)[..., ::-1], "C-contiguous"),
                    (x, bytes(n), "read-only"),
                    (x, x, "overlap"),
                    (None, out, "C-contiguous"),
                ]:
                    with pytest.raises(ValueError, match=message):
                        op.glue.run([src, dst])
                if n % 4 == 0:
                    with pytest.raises(ValueError, match="channel shuffle moves 8-bit elements"):
                        op.glue.run([np.zeros(n // 4, np.float32), out])
                op.glue.run([x, out])  # still usable after the refusals
                np.testing.assert_array_equal(out, x.transpose(0, 2, 1))
            finally:
                op.close()
            with pytest.raises(RuntimeError, match="deleted"):
                op.glue.run([x, out])
    finally:
        if pool is not None:
            pool.close()


def test_x32_shuffle_message_unchanged_and_element_size_checked():
    from edgeport_xnnpack import _glue

    op = native.ChannelShuffle(1, 2, 2)
    try:
        with pytest.raises(native.XnnpackError, match="channel shuffle moves 32-bit elements"):
            op.run(np.zeros(16, np.uint8), np.zeros((1, 2, 2), np.float32))
    finally:
        op.close()
    good = dict(kind=1, handle=1, setup=1, run=1, ids=[0, 1], nbytes=[8, 8], outputs=[False, True], extra=16,
                page=4096, check=_raise_status, batch=1)
    _glue.Binding(**good, element_size=1).close()
    _glue.Binding(**good, element_size=4).close()
    for bad in [dict(element_size=2), dict(element_size=0), dict(element_size=-4), dict(element_size=8),
                dict(kind=0, element_size=1), dict(nbytes=[8, 4]), dict(nbytes=[6, 6]),
                dict(outputs=[False, False]), dict(outputs=[True, True]), dict(outputs=[True, False]),
                dict(extra=2**40), dict(handle="1"), dict(setup=1.0)]:
        with pytest.raises((ValueError, TypeError)):
            _glue.Binding(**{**good, **bad})
    with pytest.raises(TypeError):  # keyword-only
        _glue.Binding(1, 1, 1, 1, [0, 1], [8, 8], [False, True], 16, 4096, _raise_status, None, 1, 1)
