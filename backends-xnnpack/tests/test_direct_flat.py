"""The direct call's flat list (``edgeport_xnnpack._direct``): a call with the same input and output arrays as the
two before it runs every step as one call of no arguments, host segments spliced in as their checks and kernels.
Checked on the attention blob of test_executor_plan (native steps, host segments with delegate outputs): the bits
of calls on fresh arrays, values changed in place between calls, other arrays afterwards, and arrays that became
unacceptable in place (the general path's error, as without the list)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from test_executor_plan import D, S, attention_blob, attention_reference
from xnn_helpers import needs_xnnpack

from edgeport.errors import RuntimeExecutionError
from edgeport_xnnpack import _direct
from edgeport_xnnpack.runtime import XnnpackExecutor

pytestmark = [needs_xnnpack, pytest.mark.skipif(_direct._Chain is None, reason="the C glue is not built")]


def _flat_of(handle):  # noqa: ANN001, ANN202 - the handle's chain (``_glue.Chain``) or None
    cells = dict(zip(handle.direct.__code__.co_freevars, (c.cell_contents for c in handle.direct.__closure__),
                     strict=True))
    return cells["state"][0]


@pytest.fixture
def executor_handle():
    blob, c = attention_blob()
    ex = XnnpackExecutor(num_threads=1)
    h = ex.init(memoryview(blob), [])
    assert h.direct is not None
    yield ex, h, c
    ex.destroy(h)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def test_same_arrays_run_the_flat_list_and_give_fresh_calls_bits(executor_handle):
    ex, h, c = executor_handle
    rng = np.random.default_rng(3)
    x = np.empty((1, S, D), np.float32)
    outs = [np.empty((S, 1, D), np.float32), np.empty((1, S, S), np.float32)]
    for k in range(5):
        x[...] = rng.standard_normal((1, S, D))  # new values, same array
        got = ex.execute(h, [x], out=outs)
        assert got is outs
        assert (_flat_of(h) is not None) == (k >= 1)  # made at the second call with the same arrays
        fresh = ex.execute(h, [x.copy()])  # other arrays: the steps one by one (releases the list)
        assert _flat_of(h) is None
        for g, f, w in zip(got, fresh, attention_reference(x, c), strict=True):
            np.testing.assert_array_equal(_bits(g), _bits(f))
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
        ex.execute(h, [x], out=outs)  # the next call with these arrays makes the list again
    ex.execute(h, [x], out=outs)
    chain = _flat_of(h)
    assert chain is not None
    entries, bound = chain.counts
    assert entries > len(h.steps)  # host segments spliced in as their calls
    # each one a bound step of the C chain (3 native runtimes, 2 products, a view copy) but the host multiply, which
    # stays numpy's call
    assert (entries, bound) == (7, 6)


def _called_three_times(ex, h) -> tuple[np.ndarray, list[np.ndarray]]:
    """An input and out arrays passed to three calls in a row (the flat list made at the second, run at the third)."""
    x = np.ones((1, S, D), np.float32)
    outs = [np.empty((S, 1, D), np.float32), np.empty((1, S, S), np.float32)]
    for _ in range(3):
        ex.execute(h, [x], out=outs)
    return x, outs


def test_the_list_is_released_by_other_arrays_and_by_destroy(executor_handle):
    ex, h, c = executor_handle
    x, outs = _called_three_times(ex, h)
    refs = [weakref.ref(a) for a in (x, *outs)]
    del x, outs
    gc.collect()
    assert all(r() is not None for r in refs)  # held by the list
    y = np.full((1, S, D), 0.5, np.float32)
    for g, w in zip(ex.execute(h, [y]), attention_reference(y, c), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    gc.collect()
    assert all(r() is None for r in refs)


def test_arrays_changed_in_place_go_to_the_general_path(executor_handle):
    ex, h, c = executor_handle
    x, outs = _called_three_times(ex, h)
    assert _flat_of(h) is not None
    outs[1].flags.writeable = False  # a host segment's output (the scores)
    with pytest.raises(RuntimeExecutionError):
        ex.execute(h, [x], out=outs)
    outs[1].flags.writeable = True
    outs[0].shape = (1, S, D)  # the same memory seen in other dims: not the declared output
    with pytest.raises(RuntimeExecutionError):
        ex.execute(h, [x], out=outs)
    outs[0].shape = (S, 1, D)
    x[...] = 2.0
    got = ex.execute(h, [x], out=outs)
    for g, w in zip(got, attention_reference(x, c), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_direct_execute_runs_the_direct_call_and_declines_what_execute_would_not_take(executor_handle):
    """``XnnpackExecutor.direct_execute``: the core's per-call shortcut gives execute's bits on the same arrays, and
    returns False (nothing written) for a wrong input count, arrays the direct call refuses, and a destroyed
    handle -- execute then gives its answer or its error."""
    ex, h, c = executor_handle
    run = ex.direct_execute(h)
    assert run is not None
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, S, D)).astype(np.float32)
    outs = [np.empty((S, 1, D), np.float32), np.empty((1, S, S), np.float32)]
    for _ in range(4):  # the third call on these arrays runs the chain
        assert run([x], outs) is True
        for g, f, w in zip(outs, ex.execute(h, [x.copy()]), attention_reference(x, c), strict=True):
            np.testing.assert_array_equal(_bits(g), _bits(f))
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    marker = [np.full((S, 1, D), 7, np.float32), np.full((1, S, S), 7, np.float32)]
    assert run([x, x], marker) is False
    assert run([x.astype(np.float64)], marker) is False  # the direct call refuses it; execute converts
    assert all((m == 7).all() for m in marker)
    ex.destroy(h)
    assert run([x], marker) is False
    with pytest.raises(RuntimeExecutionError, match="live handle"):
        ex.execute(h, [x], out=marker)
    assert ex.direct_execute(XnnpackExecutor()) is None  # not a handle
