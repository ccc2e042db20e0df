"""The ctypes binding: what this libXNNPACK has, a real subgraph run, and argument checks before any C call."""

from __future__ import annotations

import math

import numpy as np
import pytest
from xnn_helpers import needs_xnnpack

from edgeport_xnnpack import native

pytestmark = needs_xnnpack


def test_library_loads_and_reports_missing_definers():
    lib = native.library()
    assert lib.has("convolution_2d") and lib.has("fully_connected") and lib.has("static_reshape")
    # the 2022 snapshot Debian ships: no data-movement or batch-matmul nodes (the executor runs them on the host)
    for name in ("static_transpose", "concatenate2", "static_slice", "batch_matrix_multiply", "copy"):
        assert name in lib.missing or lib.has(name)
    assert native.is_available() == (True, "")


def _fc_runtime(pool):
    sg = native.Subgraph(2)
    x = sg.define_tensor(1, [2, 4], external_id=0, flags=native.FLAG_EXTERNAL_INPUT)
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones(3, np.float32)
    wi, bi = sg.define_tensor(1, [3, 4], w), sg.define_tensor(1, [3], b)
    y = sg.define_tensor(1, [2, 3], external_id=1, flags=native.FLAG_EXTERNAL_OUTPUT)
    sg.define("fully_connected", -math.inf, math.inf, x, wi, bi, y, 0, inputs=[x, wi, bi], outputs=[y])
    try:
        return native.Runtime(sg, pool), w, b
    finally:
        sg.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_fully_connected_runs_and_releases_packed_weights(threads):
    pool = native.ThreadPool(threads) if threads > 1 else None
    rt, w, b = _fc_runtime(pool)
    assert rt.keep == {}  # filter and bias were packed at creation; nothing points at them any more
    x = np.random.default_rng(0).random((2, 4), dtype=np.float32)
    out = np.empty((2, 3), np.float32)
    rt.run({0: x, 1: out})
    np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-6)
    rt.close()
    rt.close()  # idempotent
    if pool:
        pool.close()


def test_input_near_a_page_end_is_staged():
    rt, w, b = _fc_runtime(None)
    page = np.zeros(8192, np.uint8)
    base = (-page.ctypes.data) % 4096  # offset of the next page boundary
    x = page[base + 4096 - 32: base + 4096].view(np.float32).reshape(2, 4)  # ends exactly at a page end
    x[:] = 1.0
    out = np.empty((2, 3), np.float32)
    rt.run({0: x, 1: out})
    np.testing.assert_allclose(out, np.ones((2, 4), np.float32) @ w.T + b)
    assert rt._scratch  # copied to a padded buffer rather than letting XNNPACK read past the page


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda sg: sg.define_tensor(1, [1] * 7), "at most 6"),
        (lambda sg: sg.define_tensor(1, [-1]), "invalid dimensions"),
        (lambda sg: sg.define_tensor(99, [1]), "unknown XNNPACK datatype"),
        (lambda sg: sg.define_tensor(1, [4, 4], np.zeros(3, np.float32)), "needs 64"),
        (lambda sg: sg.define_tensor(1, [2], external_id=5, flags=1), "out of range"),
        (lambda sg: sg.define_tensor(1, [2], flags=1), "needs an external id"),
        (lambda sg: sg.define("clamp", 0.0, 1.0, 7, 8, 0, inputs=[7], outputs=[8]), "not defined"),
        (lambda sg: sg.define("static_transpose_nope"), "no xnn_define_"),
    ],
)
def test_arguments_are_checked_before_c(call, message):
    sg = native.Subgraph(1)
    with pytest.raises(native.XnnpackError, match=message):
        call(sg)
    sg.close()


def test_library_status_errors_are_raised_not_crashed():
    sg = native.Subgraph(0)
    a = sg.define_tensor(1, [2, 3])
    b = sg.define_tensor(1, [5, 7])
    with pytest.raises(native.XnnpackError, match="invalid_parameter|failed"):
        # mismatched shapes: XNNPACK itself refuses
        sg.define("fully_connected", 0.0, 1.0, a, b, native.INVALID_VALUE_ID, b, 0, inputs=[a, b], outputs=[b])
    sg.close()


def test_run_checks_buffers():
    rt, _, _ = _fc_runtime(None)
    with pytest.raises(native.XnnpackError, match="expected"):
        rt.run({0: np.zeros((2, 4), np.float32)})
    with pytest.raises(native.XnnpackError, match="C-contiguous array of 32 bytes"):
        rt.run({0: np.zeros((2, 3), np.float32), 1: np.zeros((2, 3), np.float32)})
    ro = np.zeros((2, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(native.XnnpackError, match="read-only"):
        rt.run({0: np.zeros((2, 4), np.float32), 1: ro})
    rt.close()
    with pytest.raises(native.XnnpackError, match="deleted"):
        rt.run({})


def test_thread_pool_arguments():
    with pytest.raises(native.XnnpackError):
        native.ThreadPool(0)
    pool = native.ThreadPool(2)
    assert pool.handle and pool.num_threads == 2
    pool.close()
    assert native.default_num_threads() >= 1


def test_bindings_follow_views_owners_and_staging_across_calls():
    """Addresses are remembered per slot for views only; every mix of views, owning arrays and a staged input
    binds the right memory (results against numpy), and setup runs only when an address changed."""
    rt, w, b = _fc_runtime(None)
    rng = np.random.default_rng(1)
    base_in = rng.random((4, 2, 4), dtype=np.float32)
    views_in = [base_in[0], base_in[1]]            # do not own their memory
    owned_in = rng.random((2, 4), dtype=np.float32)
    page = np.zeros(8192, np.uint8)
    off = (-page.ctypes.data) % 4096
    staged = page[off + 4096 - 32: off + 4096].view(np.float32).reshape(2, 4)  # a view ending at a page end
    staged[:] = 2.0
    base_out = np.zeros((3, 2, 3), np.float32)
    outs = [base_out[0], base_out[1], np.empty((2, 3), np.float32)]
    plan = [(views_in[0], outs[0]), (views_in[1], outs[1]), (views_in[0], outs[0]), (owned_in, outs[2]),
            (staged, outs[1]), (views_in[0], outs[0]), (staged, outs[1]), (views_in[1], outs[2])]
    for k, (x, out) in enumerate(plan):
        if k == 6:
            staged[:] = 3.0  # same view, new contents: the staging copy is refreshed
        out[...] = np.nan
        rt.run_list([x, out])
        np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-6, err_msg=f"call {k}")
    setups = rt.setups
    rt.run_list([views_in[1], outs[2]])
    assert rt.setups == setups  # same addresses as the last call
    rt.close()


def test_array_addresses_read_from_the_array_object_match_numpy():
    from edgeport_xnnpack import _native_run

    base = np.arange(4096, dtype=np.float32).reshape(64, 64)
    ro = base.copy()
    ro.flags.writeable = False
    arrays = [base, base[5], base[3:9], ro, ro[7:], np.frombuffer(bytearray(256), np.float32)[3:],
              np.empty(0, np.float32), np.zeros((2, 3), np.float64)]
    for a in arrays:
        assert _native_run._address(a, a.flags.writeable) == a.ctypes.data
    grown = np.zeros(16, np.float32)
    grown.resize(1 << 20, refcheck=False)  # an owning array can be re-pointed: its address is read afresh
    assert _native_run._address(grown, True) == grown.ctypes.data
