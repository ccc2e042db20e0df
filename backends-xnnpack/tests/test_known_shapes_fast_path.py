"""The executor's direct call for cached specializations and ``None`` out entries (``_known_shapes``) and the host
segments' reused intermediate arrays (``HostOp.scratch``): the same bits as the step-by-step general path and as a
fresh load's first call, across changing shapes (long calls, then repeated short ones), fresh outputs each call (no
result aliases another or a reused array), and the general path's errors for bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_dynamic_shapes import BOUND, _case, _eager, _edgeport, _single_delegate
from xnn_helpers import StepTracer, needs_xnnpack

import edgeport_xnnpack.runtime as runtime_module
from edgeport.errors import RuntimeExecutionError
from edgeport.runtime import Runtime
from edgeport.testing.architectures import assert_close_to_scale
from edgeport_xnnpack.runtime import XnnpackExecutor

pytestmark = [needs_xnnpack, pytest.mark.executorch]


def _set_tracer(method, tracer) -> None:
    for d in method._plan._delegates.items:
        d.executor.set_event_tracer(d.handle, tracer)


@pytest.mark.parametrize("name", ["attention", "slice_cat", "heads", "scores_transpose"])
def test_known_shapes_match_the_general_path_bit_for_bit(name, monkeypatch):
    """Host segments, native runtimes and a channel shuffle, through the program (the runtime passes ``None``
    out entries for dynamic outputs), against the same load run step by step (the general path) and eager."""
    model, _, _ = _case(name)
    width = _case(name)[2][BOUND][0].shape[-1]
    general_calls = []
    real = runtime_module.input_arrays
    monkeypatch.setattr(runtime_module, "input_arrays", lambda h, xs: general_calls.append(1) or real(h, xs))
    method = Runtime.get().load_program(_edgeport(name)[0]).load_method("forward")
    gen = torch.Generator().manual_seed(5)
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    seen: set[int] = set()
    for n in (9, 2, 2, 2, 3, 2, BOUND, 2, 9):  # changing shapes: a long call, short ones, other lengths between
        x = torch.randn(1, n, width, generator=gen)
        before = len(general_calls)
        fast = method.execute([x.numpy()])[0]
        if n in seen:  # a known shape: every delegate call took the direct call
            assert len(general_calls) == before, f"{name}, sequence {n}: general path ran"
        seen.add(n)
        _set_tracer(method, StepTracer())
        try:
            slow = method.execute([x.numpy()])[0]
        finally:
            _set_tracer(method, None)
        np.testing.assert_array_equal(fast, slow, err_msg=f"{name}, sequence {n}")
        fresh = Runtime.get().load_program(_edgeport(name)[0]).load_method("forward").execute([x.numpy()])[0]
        np.testing.assert_array_equal(fast, fresh, err_msg=f"{name}, sequence {n}: differs from a fresh load's "
                                      "first call (state left in the executor's reused buffers)")
        with torch.no_grad():
            assert_close_to_scale(fast, model(x).numpy(), f"{name}, sequence {n}")
        kept.append((fast, fast.copy()))
    for got, copy in kept:  # later calls never wrote into a result the caller kept
        np.testing.assert_array_equal(got, copy)


def test_known_shapes_refuse_what_the_general_path_refuses():
    ex = XnnpackExecutor(num_threads=1)
    handle = _single_delegate("linear", ex)
    try:
        x = np.random.default_rng(0).standard_normal((1, 3, 32)).astype(np.float32)
        (ref,) = ex.execute(handle, [x])  # specialization made; the next calls take the direct call
        with pytest.raises(RuntimeExecutionError, match=r"out\[0\] must be a writable C-contiguous float32 array"):
            ex.execute(handle, [x], [np.zeros((1, 3, 47), np.float32)])
        with pytest.raises(RuntimeExecutionError, match="input 0 must be float32"):
            ex.execute(handle, [x.astype(np.float64)], [None])
        strided = np.zeros((1, 3, 64), np.float32)[:, :, ::2]
        strided[...] = x
        np.testing.assert_array_equal(ex.execute(handle, [strided], [None])[0], ref)  # converted, same bits
        out = np.full((1, 3, 48), np.nan, np.float32)
        assert ex.execute(handle, [x], [out])[0] is out
        np.testing.assert_array_equal(out, ref)
        assert_close_to_scale(ref, _eager_of(x), "linear, sequence 3")
    finally:
        ex.destroy(handle)
    with pytest.raises(RuntimeExecutionError, match="live handle"):
        ex.execute(handle, [x], [None])


def _eager_of(x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return _case("linear")[0](torch.from_numpy(x)).numpy()


def test_declared_shapes_with_none_out_entries():
    ex = XnnpackExecutor(num_threads=1)
    handle = _single_delegate("linear", ex)
    try:
        x = _case("linear")[2][BOUND][0].numpy()
        a = ex.execute(handle, [x], [None])[0]
        b = ex.execute(handle, [x])[0]
        assert a is not b
        np.testing.assert_array_equal(a, b)
        assert_close_to_scale(a, _eager("linear", BOUND), "linear at the bound")
    finally:
        ex.destroy(handle)
