"""edgeport's thread pool (``edgeport_xnnpack._pool``) in place of Debian's libpthreadpool: it really is the one
libXNNPACK calls, each ``pthreadpool_parallelize_*`` entry point runs every item exactly once (against the API's
semantics computed here in Python), XNNPACK's results do not depend on the thread count, concurrent delegates and
nested calls work, and processes shut down cleanly. No timing here (bench/xnnpack.py --busy-core measures)."""

from __future__ import annotations

import ctypes
import itertools
import os
import subprocess
import sys
import textwrap
import threading
from ctypes import CFUNCTYPE, c_size_t, c_uint32, c_void_p

import numpy as np
import pytest

from edgeport_xnnpack import native

pytestmark = pytest.mark.skipif(not native.is_available()[0], reason="libXNNPACK not installed")

# name -> (dims, tiled dims: the last ones), as the pthreadpool API defines them
KINDS = {
    "1d": (1, 0), "1d_tile_1d": (1, 1), "2d": (2, 0), "2d_tile_1d": (2, 1), "2d_tile_2d": (2, 2), "3d": (3, 0),
    "3d_tile_2d": (3, 2), "4d": (4, 0), "4d_tile_2d": (4, 2), "5d": (5, 0), "5d_tile_2d": (5, 2),
    "6d_tile_2d": (6, 2),
}


def own() -> native.Library:
    lib = native.library()
    if not lib.own_pool:
        pytest.skip(f"edgeport's pool is not in use: {lib.pool_reason}")
    return lib


def expected_calls(ranges: tuple[int, ...], tiles: tuple[int, ...], tiled: int) -> list[tuple[int, ...]]:
    """The task calls the API promises: every start of the tile grid, then the extents of the tiled dims."""
    d = len(ranges)
    steps = [range(0, r, t) for r, t in zip(ranges, tiles, strict=True)]
    out = []
    for starts in itertools.product(*steps):
        extents = tuple(min(tiles[i], ranges[i] - starts[i]) for i in range(d - tiled, d))
        out.append(tuple(starts) + extents)
    return sorted(out)


def run_kind(lib: native.Library, pool: int | None, kind: str, ranges: tuple[int, ...], tiles: tuple[int, ...],
             flags: int = 0, probe=None) -> list[tuple[int, ...]]:
    d, tiled = KINDS[kind]
    seen: list[tuple[int, ...]] = []
    lock = threading.Lock()

    def task(_ctx, *args):
        if probe is not None:
            probe()
        with lock:
            seen.append(tuple(args))

    proto = CFUNCTYPE(None, c_void_p, *([c_size_t] * (d + tiled)))
    cb = proto(task)
    fn = getattr(lib.pool, f"pthreadpool_parallelize_{kind}")
    fn.restype = None
    tile_args = list(tiles[d - tiled:]) if tiled else []
    fn.argtypes = (c_void_p, proto, c_void_p, *([c_size_t] * (d + tiled)), c_uint32)
    fn(pool, cb, None, *ranges, *tile_args, flags)
    return sorted(seen)


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_item_exactly_once(kind, threads):
    lib = own()
    d, tiled = KINDS[kind]
    pool = native.ThreadPool(threads)
    try:
        rng = np.random.default_rng(hash((kind, threads)) % 2**32)
        shapes = [tuple([1] * d), tuple(int(v) for v in rng.integers(1, 6, d)), tuple([0] + [3] * (d - 1))]
        for ranges in shapes:
            tiles = tuple(1 if i < d - tiled else int(rng.integers(1, 4)) for i in range(d))
            if kind == "2d_tile_2d":  # both dims tiled
                tiles = (2, 3)
            got = run_kind(lib, pool.handle, kind, ranges, tiles)
            assert got == expected_calls(ranges, tiles, tiled), (kind, threads, ranges, tiles)
        # a larger grid: workers take part (items are handed out in chunks)
        big = tuple([7] * d) if d <= 3 else tuple([3] * d)
        tiles = tuple(1 if i < d - tiled else 2 for i in range(d))
        assert run_kind(lib, pool.handle, kind, big, tiles) == expected_calls(big, tiles, tiled)
        # no pool (NULL): the calling thread runs everything
        assert run_kind(lib, None, kind, big, tiles) == expected_calls(big, tiles, tiled)
    finally:
        pool.close()


@pytest.mark.parametrize("threads", [2, 3])
def test_policy_is_checked_and_every_policy_runs_every_item_once(threads):
    lib = own()
    pool = native.ThreadPool(threads)
    try:
        for bad in ((-1, 20), (2e6, 20), (50, 0.5), (50, 2000)):  # spin 0..1e6 us, back-off 0 or 1..1000 ms
            with pytest.raises(native.XnnpackError, match="bad pool policy"):
                pool.set_policy(*bad)
        # items split in per-thread shares (uneven counts: the first shares get one more), stolen when a thread is
        # done: each exactly once whatever the policy (workers parking at once, never running solo)
        for policy in ((0, 0), (50, 20), (1000, 0)):
            assert pool.set_policy(*policy)
            for n in (1, 2, threads + 1, 97, 1000):
                assert run_kind(lib, pool.handle, "1d", (n,), (1,)) == expected_calls((n,), (1,), 0)
            assert run_kind(lib, pool.handle, "2d_tile_2d", (13, 11), (2, 3)) == expected_calls((13, 11), (2, 3), 2)
    finally:
        pool.close()
    assert not native.ThreadPool(1).set_policy(50, 20)  # no pool to set


def test_threads_count():
    lib = own()
    fn = lib.pool.pthreadpool_get_threads_count
    assert fn(None) == 1
    for n in (2, 5):
        pool = native.ThreadPool(n)
        assert fn(pool.handle) == n
        pool.close()


def test_disable_denormals_flag_applies_inside_and_is_restored():
    """PTHREADPOOL_FLAG_DISABLE_DENORMALS (XNNPACK passes it on every operator): inside the tasks, on every thread,
    a denormal operand reads as zero; after the call the caller's floating-point state is back."""
    lib = own()
    tiny = np.float32(1e-39)  # a float32 denormal
    flushed: list[bool] = []

    def probe():
        flushed.append(float(np.multiply(tiny, np.float32(1.0))) == 0.0)

    pool = native.ThreadPool(2)
    try:
        run_kind(lib, pool.handle, "1d", (64,), (1,), flags=1, probe=probe)
        assert flushed and all(flushed)
        flushed.clear()
        run_kind(lib, pool.handle, "1d", (64,), (1,), flags=0, probe=probe)
        assert flushed and not any(flushed)
        assert float(np.multiply(tiny, np.float32(1.0))) != 0.0
    finally:
        pool.close()


def test_nested_call_from_a_task_runs_inline():
    """A task calling parallelize on the pool it runs on (the pool is busy): runs on that thread, no deadlock."""
    lib = own()
    pool = native.ThreadPool(2)
    inner: list[list[tuple[int, ...]]] = []
    try:
        def probe():
            inner.append(run_kind(lib, pool.handle, "1d_tile_1d", (10,), (3,)))

        outer = run_kind(lib, pool.handle, "1d", (4,), (1,), probe=probe)
        assert outer == expected_calls((4,), (1,), 0)
        assert len(inner) == 4 and all(x == expected_calls((10,), (3,), 1) for x in inner)
        assert pool.stats()["inline_busy"] >= 4
    finally:
        pool.close()


def test_libxnnpack_calls_this_pool():
    """Every pthreadpool_* reference of the loaded libXNNPACK resolves (GOT slot address) to edgeport's pool, and
    running an XNNPACK runtime goes through it."""
    lib = own()
    bad = ctypes.create_string_buffer(8192)
    bound = lib.pool.edgeport_pool_binding(lib.xnn._handle, bad, 8192)
    imported = _imported_pool_symbols()
    assert bound == len(imported) and bound >= 13 and bad.value == b""
    assert native.pool_status() == ("edgeport", "")


def _imported_pool_symbols() -> set[str]:
    out = subprocess.run(["nm", "-D", "--undefined-only", _libxnnpack_path()], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("nm is not available")
    return {line.split()[-1] for line in out.stdout.splitlines() if line.split()[-1].startswith("pthreadpool_")}


def _libxnnpack_path() -> str:
    with open(f"/proc/{os.getpid()}/maps") as f:
        for line in f:
            if "libXNNPACK" in line:
                return line.split()[-1]
    pytest.skip("libXNNPACK is not mapped")
    return ""


def fc_on(pool: native.ThreadPool, x: np.ndarray, w: np.ndarray, runs: int = 1) -> np.ndarray:
    """``x @ w.T`` by an XNNPACK fully-connected runtime on ``pool`` (torch-free), run ``runs`` times."""
    import math

    sg = native.Subgraph(2)
    xi = sg.define_tensor(1, list(x.shape), external_id=0, flags=native.FLAG_EXTERNAL_INPUT)
    wi = sg.define_tensor(1, list(w.shape), np.ascontiguousarray(w))
    yi = sg.define_tensor(1, [x.shape[0], w.shape[0]], external_id=1, flags=native.FLAG_EXTERNAL_OUTPUT)
    sg.define("fully_connected", -math.inf, math.inf, xi, wi, native.INVALID_VALUE_ID, yi, 0,
              inputs=[xi, wi], outputs=[yi])
    try:
        rt = native.Runtime(sg, pool)
    finally:
        sg.close()
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    padded = native.padded_empty(x.shape, np.float32)
    padded[...] = x
    for _ in range(runs):
        rt.run_list([padded, out])
    rt.close()
    return out


def fc_outputs(x: np.ndarray, w: np.ndarray, threads: int) -> np.ndarray:
    """``x @ w.T`` by an XNNPACK fully-connected runtime on a pool of ``threads``, run three times."""
    pool = native.ThreadPool(threads)
    try:
        return fc_on(pool, x, w, runs=3)
    finally:
        pool.close()


def _child(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


FC_CHILD = """
    import numpy as np
    from edgeport_xnnpack import native
    {pre}
    status = native.pool_status()
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)
    from test_own_thread_pool import fc_outputs
    outs = [fc_outputs(x, w, threads) for threads in (1, 2, 3)]
    assert all(np.array_equal(o, outs[0]) for o in outs), "thread counts disagree"
    np.testing.assert_allclose(outs[0], x @ w.T, rtol=1e-4, atol=1e-3)
    print(status[0], "|", status[1])
"""


@pytest.mark.parametrize("case", ["xnnpack-first", "env-system"])
def test_falls_back_to_the_system_pool_with_a_reason(case):
    """libXNNPACK loaded before edgeport (its references bound to Debian's pool), or EDGEPORT_XNNPACK_POOL=system:
    the system pool runs, pool_status says why, results are the same."""
    own()
    pre = "import ctypes; ctypes.CDLL('libXNNPACK.so.0')" if case == "xnnpack-first" else ""
    env = {"EDGEPORT_XNNPACK_POOL": "system"} if case == "env-system" else {}
    env["PYTHONPATH"] = os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", "")
    r = _child(FC_CHILD.format(pre=pre), env)
    assert r.returncode == 0, r.stderr[-2000:]
    kind, reason = r.stdout.strip().split(" | ", 1)
    assert kind == "system"
    assert ("resolve elsewhere" in reason and "libpthreadpool" in reason) if case == "xnnpack-first" \
        else "EDGEPORT_XNNPACK_POOL=system" in reason


def test_own_pool_child_same_results():
    own()
    env = {"PYTHONPATH": os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = _child(FC_CHILD.format(pre=""), env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().startswith("edgeport |")


def test_shutdown_fork_and_exit_without_release_are_clean():
    """Pools alive at interpreter exit, destroyed while workers spin, and used in a forked child: exit code 0."""
    own()
    code = """
        import os
        from edgeport_xnnpack import native
        from test_own_thread_pool import run_kind, expected_calls
        lib = native.library()
        keep = [native.ThreadPool(n) for n in (2, 3, 4)]
        for p in keep:
            assert run_kind(lib, p.handle, "2d_tile_1d", (5, 9), (1, 4)) == expected_calls((5, 9), (1, 4), 1)
        keep[0].close()  # right after a call: its worker is still spinning
        pid = os.fork()
        if pid == 0:  # the child has no worker threads: the caller runs everything
            ok = run_kind(lib, keep[1].handle, "1d", (50,), (1,)) == expected_calls((50,), (1,), 0)
            keep[1].close()
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0, status
        print("ok")
        # keep[1], keep[2] are left for interpreter shutdown
    """
    env = {"PYTHONPATH": os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = _child(code, env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
