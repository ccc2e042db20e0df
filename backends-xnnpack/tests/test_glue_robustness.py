"""Robustness of the C glue (``edgeport_xnnpack._glue``) under bad, odd, re-entrant and concurrent use.

Every call either raises a clear exception (``native.XnnpackError`` for a refused argument, ``RuntimeError``
"already running" / "deleted" for overlapping or closed use) or gives the numpy oracle's result, and the runtime
stays usable afterwards. The parts that could crash the interpreter if the glue regressed (threads, re-entrant
calls, closing under a call, lists mutated during a call) run in a subprocess: a crash fails the test instead of
killing pytest. Also the 8-bit channel shuffle (``element_size=1``) on a real ``xnn_create_channel_shuffle_nc_x8``
operator, against a numpy transpose.
"""

from __future__ import annotations

import ctypes
import gc
import math
import random
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from ctypes import POINTER, c_int, c_size_t, c_uint32, c_void_p
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeport_xnnpack import native
from edgeport_xnnpack._native_run import _fn_address, _raise_status, glue_status, padded_empty

HERE = Path(__file__).parent
GLUE_BUILT = glue_status()[0] == "c"
pytestmark = [pytest.mark.skipif(not native.is_available()[0], reason=native.is_available()[1]),
              pytest.mark.skipif(not GLUE_BUILT, reason=glue_status()[1])]
BUSY = "already running"


def run_isolated(func: Callable[..., Any], *args: Any, timeout: float = 60) -> str:
    """Run ``func(*args)`` (a function of this module) in a fresh interpreter; a crash (signal) or an exception
    fails the calling test with the child's output."""
    code = f"import {Path(__file__).stem} as t; t.{func.__name__}(*{args!r})"
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], cwd=HERE, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, (f"{func.__name__}{args} exited with {r.returncode} (negative: killed by a signal)\n"
                               f"--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}")
    return r.stdout


# --------------------------------------------------------------------------------------------------------------
# Small real runtimes and operators
# --------------------------------------------------------------------------------------------------------------

def fc_runtime(batch: int = 2, k: int = 4, n: int = 3, pool: Any = None,
               seed: int = 0) -> tuple[native.Runtime, np.ndarray, np.ndarray]:
    """``y[batch, n] = x[batch, k] @ w.T + b`` as an XNNPACK runtime (C glue path), with its w and b."""
    rng = np.random.default_rng(seed)
    sg = native.Subgraph(2)
    x = sg.define_tensor(1, [batch, k], external_id=0, flags=native.FLAG_EXTERNAL_INPUT)
    w = rng.standard_normal((n, k), dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    wi, bi = sg.define_tensor(1, [n, k], w), sg.define_tensor(1, [n], b)
    y = sg.define_tensor(1, [batch, n], external_id=1, flags=native.FLAG_EXTERNAL_OUTPUT)
    sg.define("fully_connected", -math.inf, math.inf, x, wi, bi, y, 0, inputs=[x, wi, bi], outputs=[y])
    try:
        rt = native.Runtime(sg, pool)
    finally:
        sg.close()
    assert rt.glue is not None
    return rt, w, b


def fc_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (x.astype(np.float64) @ w.T.astype(np.float64) + b).astype(np.float32)


def assert_fc(out: np.ndarray, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> None:
    ref = fc_ref(x, w, b)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


def page_end_bytes(nbytes: int) -> np.ndarray:
    """A uint8 view of ``nbytes`` ending exactly at a page end (an input bound there is staged)."""
    raw = np.zeros(nbytes + 2 * 4096, np.uint8)
    end = (-raw.ctypes.data) % 4096 + 4096 * (nbytes // 4096 + 1)
    return raw[end - nbytes: end]


# --------------------------------------------------------------------------------------------------------------
# (a) good and bad arguments, against an oracle of what the glue must accept
# --------------------------------------------------------------------------------------------------------------

def _data(rng: np.random.Generator, nbytes: int) -> np.ndarray:
    return rng.standard_normal(nbytes // 4, dtype=np.float32)


# kind -> maker(rng, shape, dtype_of_elements, is_output) -> the object passed at one slot
MAKERS: dict[str, Callable[[np.random.Generator, tuple[int, ...], bool], Any]] = {
    "array": lambda r, s, o: _data(r, 4 * math.prod(s)).reshape(s),
    "flat": lambda r, s, o: _data(r, 4 * math.prod(s)),
    "int32_view": lambda r, s, o: _data(r, 4 * math.prod(s)).view(np.int32).reshape(s),
    "uint8_view": lambda r, s, o: _data(r, 4 * math.prod(s)).view(np.uint8),
    "page_end": lambda r, s, o: _fill(page_end_bytes(4 * math.prod(s)).view(np.float32).reshape(s), r),
    "padded": lambda r, s, o: _fill(padded_empty(s), r),
    "slice_of_bigger": lambda r, s, o: _data(r, 12 * math.prod(s)).reshape(3, *s)[1],
    "readonly_array": lambda r, s, o: _readonly(_data(r, 4 * math.prod(s)).reshape(s)),
    "bytes": lambda r, s, o: _data(r, 4 * math.prod(s)).tobytes(),
    "bytearray": lambda r, s, o: bytearray(_data(r, 4 * math.prod(s)).tobytes()),
    "memoryview_bytearray": lambda r, s, o: memoryview(bytearray(_data(r, 4 * math.prod(s)).tobytes())),
    "memoryview_bytes": lambda r, s, o: memoryview(_data(r, 4 * math.prod(s)).tobytes()),
    "too_big": lambda r, s, o: _data(r, 4 * math.prod(s) + 4),
    "too_small": lambda r, s, o: _data(r, 4 * math.prod(s) - 4),
    "float64": lambda r, s, o: _data(r, 8 * math.prod(s)).astype(np.float64)[: math.prod(s)].reshape(s),
    "empty": lambda r, s, o: np.zeros(0, np.float32),
    "transposed": lambda r, s, o: _data(r, 4 * math.prod(s)).reshape(s[::-1]).T,
    "strided": lambda r, s, o: _data(r, 8 * math.prod(s))[::2],
    "reversed": lambda r, s, o: _data(r, 4 * math.prod(s))[::-1],
    "strided_memoryview": lambda r, s, o: memoryview(bytearray(8 * math.prod(s)))[::2],
    "released_memoryview": lambda r, s, o: _released(memoryview(bytearray(4 * math.prod(s)))),
    "none": lambda r, s, o: None,
    "int": lambda r, s, o: 4 * math.prod(s),
    "float": lambda r, s, o: 1.5,
    "str": lambda r, s, o: "x" * (4 * math.prod(s)),
    "list": lambda r, s, o: [0.0] * math.prod(s),
    "object": lambda r, s, o: object(),
}
KINDS = sorted(MAKERS)
GOOD_KINDS = ["array", "flat", "page_end", "padded", "slice_of_bigger", "bytearray", "memoryview_bytearray"]


def _fill(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    a[...] = rng.standard_normal(a.shape, dtype=np.float32)
    return a


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _released(m: memoryview) -> memoryview:
    m.release()
    return m


def acceptable(obj: Any, nbytes: int, output: bool, itemsize: int | None = None) -> bool:
    """Whether the glue must bind ``obj`` at a slot of ``nbytes`` (the buffer protocol's view of it)."""
    try:
        m = memoryview(obj)
    except (TypeError, ValueError):  # no buffer, or a released memoryview
        return False
    with m:
        return (m.c_contiguous and m.nbytes == nbytes and not (output and m.readonly)
                and (itemsize is None or m.itemsize == itemsize))


def as_bytes(obj: Any) -> bytes:
    with memoryview(obj) as m:
        return m.tobytes()


def poison(obj: Any) -> None:
    """Fill a writable output with NaN bytes, so an output XNNPACK did not write is caught."""
    with memoryview(obj) as m, m.cast("B") as flat:
        flat[:] = np.full(m.nbytes // 4, np.nan, np.float32).tobytes()


def runtime_call(rt: native.Runtime, w: np.ndarray, b: np.ndarray, in_kind: str, out_kind: str,
                 rng: np.random.Generator, extra_arg: int = 0) -> bool:
    """One ``run_list`` with objects of these kinds: refused with XnnpackError exactly when the oracle says so,
    else the FC result. ``extra_arg`` != 0 adds or drops an argument. Returns whether the call ran."""
    x = MAKERS[in_kind](rng, (2, 4), False)
    out = x if out_kind == "alias" else MAKERS[out_kind](rng, (2, 3), True)
    args = [x, out][: 2 + extra_arg] if extra_arg < 0 else [x, out] + [out] * extra_arg
    ok = extra_arg == 0 and acceptable(x, 32, False) and acceptable(out, 24, True)
    if ok:
        poison(out)
    if not ok:
        with pytest.raises(native.XnnpackError):
            rt.run_list(args)
        return False
    rt.run_list(args)
    xs = np.frombuffer(as_bytes(x), np.float32).reshape(2, 4)
    assert_fc(np.frombuffer(as_bytes(out), np.float32).reshape(2, 3), xs, w, b)
    return True


def shuffle_call(op: native.ChannelShuffle, in_kind: str, out_kind: str, rng: np.random.Generator) -> bool:
    """One ``ChannelShuffle.run``: refused exactly when the oracle says so (32-bit elements, no overlap), else
    the transposed input bit for bit."""
    nb, g, gc_ = op.batch, op.groups, op.group_channels
    x = MAKERS[in_kind](rng, (nb, g, gc_), False)
    out = x if out_kind == "alias" else MAKERS[out_kind](rng, (nb, gc_, g), True)
    nbytes = nb * g * gc_ * 4
    ok = out_kind != "alias" and acceptable(x, nbytes, False, 4) and acceptable(out, nbytes, True, 4)
    if not ok:
        with pytest.raises(native.XnnpackError):
            op.run(x, out)
        return False
    poison(out)
    op.run(x, out)
    want = np.frombuffer(as_bytes(x), np.uint32).reshape(nb, g, gc_).transpose(0, 2, 1)
    np.testing.assert_array_equal(np.frombuffer(as_bytes(out), np.uint32).reshape(nb, gc_, g), want)
    return True


def final_good_calls(rt: native.Runtime, w: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> None:
    """The runtime is still usable: fresh arrays, a staged input, and the same arrays twice."""
    for kinds in [("array", "array"), ("page_end", "padded")]:
        assert runtime_call(rt, w, b, *kinds, rng)
    x, out = MAKERS["array"](rng, (2, 4), False), np.empty((2, 3), np.float32)
    for _ in range(2):
        out[...] = np.nan
        rt.run_list([x, out])
        assert_fc(out, x, w, b)


CALL = st.tuples(st.sampled_from(KINDS), st.sampled_from([*KINDS, "alias"]), st.sampled_from([0, 0, 0, -1, -2, 1]),
                 st.integers(0, 2**32 - 1))


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(CALL, min_size=1, max_size=8))
def test_runtime_random_good_and_bad_arguments(calls):
    rt, w, b = fc_runtime()
    try:
        for in_kind, out_kind, extra, seed in calls:
            runtime_call(rt, w, b, in_kind, out_kind, np.random.default_rng(seed), extra)
        final_good_calls(rt, w, b, np.random.default_rng(0))
    finally:
        rt.close()


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from([*KINDS, "alias"]),
                                st.integers(0, 2**32 - 1)), min_size=1, max_size=6),
       dims=st.tuples(st.integers(1, 3), st.integers(2, 5), st.integers(1, 6)))
def test_channel_shuffle_random_good_and_bad_arguments(calls, dims):
    op = native.ChannelShuffle(*dims)
    assert op.glue is not None
    try:
        for in_kind, out_kind, seed in calls:
            shuffle_call(op, in_kind, out_kind, np.random.default_rng(seed))
        rng = np.random.default_rng(1)
        assert shuffle_call(op, "array", "array", rng) and shuffle_call(op, "page_end", "int32_view", rng)
    finally:
        op.close()


def fuzz_seeded(seed: int, steps: int) -> None:
    """Seeded-random runtime and shuffle calls (run in a subprocess: a crash fails the test, not pytest)."""
    r = random.Random(seed)
    rt, w, b = fc_runtime(seed=seed)
    op = native.ChannelShuffle(2, 3, 4)
    ran = 0
    for _ in range(steps):
        rng = np.random.default_rng(r.getrandbits(32))
        good = r.random() < 0.4
        pick = (lambda: r.choice(GOOD_KINDS)) if good else (lambda: r.choice(KINDS))
        ran += runtime_call(rt, w, b, pick(), r.choice([pick(), "alias"]), rng, r.choice([0] * 8 + [-1, 1]))
        ran += shuffle_call(op, pick(), pick(), rng)
    final_good_calls(rt, w, b, np.random.default_rng(seed))
    rt.close()
    op.close()
    print("ran", ran, "of", 2 * steps)


def test_seeded_fuzz_in_a_subprocess():
    out = run_isolated(fuzz_seeded, 7, 300)
    assert int(out.split()[1]) > 50  # the good arguments did run


def test_zero_size_runtime_binds_empty_buffers():
    rt, w, b = fc_runtime(batch=0)
    try:
        for x, out in [(np.zeros((0, 4), np.float32), np.zeros((0, 3), np.float32)), (b"", bytearray()),
                       (np.zeros(0, np.uint8), memoryview(bytearray())), (memoryview(b""), np.empty(0, np.int8))]:
            rt.run_list([x, out])
        for x, out, message in [(np.zeros(1, np.float32), bytearray(), "0 bytes"),
                                (b"", b"", "read-only"), (None, bytearray(), "C-contiguous")]:
            with pytest.raises(native.XnnpackError, match=message):
                rt.run_list([x, out])
        rt.run_list([b"", bytearray()])
    finally:
        rt.close()


def test_arrays_argument_that_is_not_a_sequence_raises_cleanly():
    rt, w, b = fc_runtime()
    try:
        for bad in [None, 3, object()]:
            with pytest.raises(TypeError, match="sequence"):
                rt.run_list(bad)
        for bad in ["ab", b"ab", {0: 1, 1: 2}]:  # iterables of the right length, of non-buffers
            with pytest.raises((native.XnnpackError, TypeError)):
                rt.run_list(bad)
        x = np.ones((2, 4), np.float32)
        out = np.empty((2, 3), np.float32)
        rt.run_list(iter([x, out]))  # any iterable of the buffers
        assert_fc(out, x, w, b)
        final_good_calls(rt, w, b, np.random.default_rng(2))
    finally:
        rt.close()


# --------------------------------------------------------------------------------------------------------------
# Re-entrant use and sequences that mutate (subprocess: these crashed the interpreter before the glue's fixes)
# --------------------------------------------------------------------------------------------------------------

def reentrant_calls() -> None:
    rt, w, b = fc_runtime()
    x, out = np.ones((2, 4), np.float32), np.empty((2, 3), np.float32)
    rt.run_list([x, out])
    seen = []

    def close_midway():  # Runtime.close() while the glue iterates the arguments: refused, nothing deleted
        yield x
        with pytest.raises(RuntimeError, match="while it runs"):
            rt.close()
        seen.append("close refused")
        yield out

    def nested_run():
        yield x
        with pytest.raises(RuntimeError, match=BUSY):
            rt.run_list([x, out])
        with pytest.raises(RuntimeError, match="while it runs"):
            rt.glue.expect(0, "f", [2, 4])
        seen.append("nested refused")
        yield out

    for gen in (close_midway, nested_run):
        out[...] = np.nan
        rt.run_list(gen())
        assert_fc(out, x, w, b)
    assert seen == ["close refused", "nested refused"]

    # the argument list mutated (cleared, refilled with other objects) while the glue iterates / converts
    args = [x, out]

    def mutating():
        yield args[0]
        args.clear()
        args.extend([None] * 100)
        yield out

    rt.run_list(mutating())
    assert_fc(out, x, w, b)

    class Shrinks(list):
        def __iter__(self):
            it = super().__iter__()
            self.clear()
            return it

    with pytest.raises(native.XnnpackError, match="expected 2 buffers, got 0"):
        rt.run_list(Shrinks([x, out]))  # a list subclass is iterated (and empties itself meanwhile)
    final_good_calls(rt, w, b, np.random.default_rng(3))

    # a generator that raises midway: the error propagates, the runtime stays usable
    def failing():
        yield x
        raise KeyError("boom")

    with pytest.raises(KeyError):
        rt.run_list(failing())
    final_good_calls(rt, w, b, np.random.default_rng(4))
    rt.close()
    with pytest.raises(native.XnnpackError, match="deleted"):
        rt.run_list([x, out])
    print("ok")


def binding_init_with_mutating_sequences() -> None:
    from edgeport_xnnpack import _glue

    rt, w, b = fc_runtime()
    xnn = native.library().xnn
    setup, invoke = _fn_address(xnn.xnn_setup_runtime), _fn_address(xnn.xnn_invoke_runtime)

    def make(ids, nbytes, outputs, binding=None):
        b_ = binding if binding is not None else _glue.Binding.__new__(_glue.Binding)
        b_.__init__(0, rt.handle, setup, invoke, ids, nbytes, outputs, 16, 4096, _raise_status)
        return b_

    ids, nbs = [0, 1], [32, 24]

    class Clears:  # __bool__ of an outputs item empties and refills the other lists
        def __bool__(self):
            ids.clear()
            nbs.clear()
            ids.extend(range(1000))
            nbs.extend([-1] * 1000)
            return True

    binding = make(ids, nbs, [False, Clears()])
    x, out = np.ones((2, 4), np.float32), np.empty((2, 3), np.float32)
    binding.run([x, out])  # it bound what it was given before the mutation
    assert_fc(out, x, w, b)
    binding.close()

    blank = _glue.Binding.__new__(_glue.Binding)

    class UsesTheBindingMidInit:
        def __bool__(self):
            with pytest.raises(RuntimeError, match="not initialized"):
                blank.run([x, out])
            with pytest.raises(RuntimeError, match="not initialized"):
                blank.expect(0, "f", [2, 4])
            return True

    make([0, 1], [32, 24], [False, UsesTheBindingMidInit()], blank)
    blank.run([x, out])
    assert_fc(out, x, w, b)
    with pytest.raises(RuntimeError, match="already initialized"):
        make([0, 1], [32, 24], [False, True], blank)

    class InitsItMidInit:
        def __bool__(self):
            make([0, 1], [32, 24], [False, True], other)
            return True

    other = _glue.Binding.__new__(_glue.Binding)
    with pytest.raises(RuntimeError, match="already initialized"):
        make([0, 1], [32, 24], [False, InitsItMidInit()], other)
    other.run([x, out])  # the inner initialization stands
    assert_fc(out, x, w, b)
    for bd in (blank, other):
        bd.close()
    rt.close()
    print("ok")


def test_reentrant_calls_are_refused_cleanly():
    assert run_isolated(reentrant_calls).strip() == "ok"


def test_binding_init_survives_mutating_sequences():
    assert run_isolated(binding_init_with_mutating_sequences).strip() == "ok"


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


def test_binding_is_collected_in_a_reference_cycle():
    from edgeport_xnnpack import _glue

    class Sentinel:
        pass

    def make_cycle() -> weakref.ref:
        s = Sentinel()
        holder: list[Any] = [s]
        b = _glue.Binding(0, 1, 1, 1, [0], [4], [True], 16, 4096, lambda call, status: holder)
        holder.append(b)  # holder -> binding -> its check -> holder
        assert gc.is_tracked(b)
        return weakref.ref(s)

    ref = make_cycle()
    gc.collect()
    assert ref() is None
