"""Shared builders and oracles of the C-glue robustness tests (test_glue_robustness, test_glue_threads).

``run_isolated`` runs a test module's function in a fresh interpreter (a crash fails the test, not pytest);
``fc_runtime`` / ``fc_ref`` / ``assert_fc`` are a small fully-connected runtime and its numpy oracle; ``MAKERS``
builds good and bad argument objects by kind, and ``acceptable`` says which of them the glue must bind.
"""

from __future__ import annotations

import inspect
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeport_xnnpack import native
from edgeport_xnnpack._native_run import glue_status, padded_empty

HERE = Path(__file__).parent
GLUE_BUILT = glue_status()[0] == "c"
GLUE_MARKS = [pytest.mark.skipif(not native.is_available()[0], reason=native.is_available()[1]),
              pytest.mark.skipif(not GLUE_BUILT, reason=glue_status()[1])]
BUSY = "already running"


def run_isolated(func: Callable[..., Any], *args: Any, timeout: float = 60) -> str:
    """Run ``func(*args)`` (a module-level function of a module in this folder) in a fresh interpreter; a crash
    (signal) or an exception fails the calling test with the child's output. The child imports the module by its
    file name (pytest's importlib mode gives test modules other ``__module__`` names) from this folder."""
    module = Path(inspect.getfile(func))
    assert module.resolve().parent == HERE.resolve(), f"run_isolated needs a module in {HERE}, not {module}"
    code = f"import {module.stem} as t; t.{func.__name__}(*{args!r})"
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

