"""The specializer's memo of the last plan its lookup found for the executor's known-shapes call
(``Specializer.last``, read by ``Specializer.known``): repeated calls of one shape skip the cache lookup, yet give
the same bits as the step-by-step general path, keep the cache's least-recently-used order exact (no needless
re-specialization), never run an evicted (closed) plan, and refuse what the general path refuses."""

from __future__ import annotations

import numpy as np
import pytest
from test_dynamic_shapes import BOUND, _single_delegate
from xnn_helpers import StepTracer, greedy_decode, needs_xnnpack

from edgeport.errors import RuntimeExecutionError
from edgeport_xnnpack.runtime import XnnpackExecutor

pytestmark = [needs_xnnpack, pytest.mark.executorch]


def _x(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, n, 32)).astype(np.float32)


def _general(ex: XnnpackExecutor, handle, x: np.ndarray) -> np.ndarray:
    ex.set_event_tracer(handle, StepTracer())
    try:
        return ex.execute(handle, [x], [None])[0]
    finally:
        ex.set_event_tracer(handle, None)


def test_memo_hits_give_the_general_paths_bits_and_fresh_outputs():
    ex = XnnpackExecutor(num_threads=1)
    handle = _single_delegate("linear", ex)
    try:
        ex.execute(handle, [_x(3, 9)], [None])  # the general path makes the specialization
        results = []
        for seed in range(4):
            x = _x(3, seed)
            fast = ex.execute(handle, [x], [None])[0]
            assert handle.specializer.last is not None and handle.specializer.last[0] == ((1, 3, 32),)
            np.testing.assert_array_equal(fast, _general(ex, handle, x))
            again = ex.execute(handle, [x])[0]  # out=None: the memo too
            assert again is not fast
            np.testing.assert_array_equal(again, fast)
            results.append((fast, fast.copy()))
        for got, copy in results:  # no later call wrote into an earlier result
            np.testing.assert_array_equal(got, copy)
        assert handle.specializer.built == 1
    finally:
        ex.destroy(handle)
    assert handle.specializer.last is None


def test_memo_keeps_the_lru_order_and_never_runs_an_evicted_plan():
    ex = XnnpackExecutor(num_threads=1, max_specializations=2)
    handle = _single_delegate("linear", ex)
    try:
        a, b, c = _x(3, 0), _x(5, 1), _x(7, 2)
        ref = {n: _general(ex, handle, x) for n, x in ((3, a), (5, b), (7, c))}  # three made, two kept (5, 7)
        built = handle.specializer.built
        assert built == 3
        np.testing.assert_array_equal(ex.execute(handle, [b], [None])[0], ref[5])  # memo: 5
        _general(ex, handle, c)  # the general path moves 7 to the end; the memo (5) is no longer last
        np.testing.assert_array_equal(ex.execute(handle, [b], [None])[0], ref[5])  # memo hit: 5 becomes last
        np.testing.assert_array_equal(ex.execute(handle, [a], [None])[0], ref[3])  # 3 made again, evicts 7
        assert handle.specializer.built == built + 1
        assert list(handle.specializer.cache) == [((1, 5, 32),), ((1, 3, 32),)]
        np.testing.assert_array_equal(ex.execute(handle, [a], [None])[0], ref[3])  # the memo: 3
        assert handle.specializer.last is not None and handle.specializer.last[0] == ((1, 3, 32),)
        memo_plan = handle.specializer.last[1]
        # the memo (3) is evicted by two other shapes made on the general path; its plan is closed
        _general(ex, handle, b)
        _general(ex, handle, c)
        assert ((1, 3, 32),) not in handle.specializer.cache
        assert memo_plan.direct is None
        np.testing.assert_array_equal(ex.execute(handle, [a], [None])[0], ref[3])  # made again, not the closed one
        np.testing.assert_array_equal(ex.execute(handle, [a], [None])[0], ref[3])  # the memo: the new plan
        last = handle.specializer.last
        assert last is not None and last[1] is handle.specializer.cache[((1, 3, 32),)]
    finally:
        ex.destroy(handle)



def test_memo_is_not_trusted_for_a_plan_the_cache_no_longer_holds():
    """A plan dropped from the cache without being closed (never done today) is not run from the memo."""
    ex = XnnpackExecutor(num_threads=1)
    handle = _single_delegate("linear", ex)
    try:
        x = _x(3, 0)
        ref = ex.execute(handle, [x], [None])[0]
        ex.execute(handle, [x], [None])  # the memo is set
        dropped = handle.specializer.last[1]
        handle.specializer.cache.clear()  # (kept alive: closed with the handle below)
        np.testing.assert_array_equal(ex.execute(handle, [x], [None])[0], ref)  # made again on the general path
        np.testing.assert_array_equal(ex.execute(handle, [x], [None])[0], ref)
        assert handle.specializer.last[1] is handle.specializer.cache[((1, 3, 32),)] is not dropped
        dropped.close()
    finally:
        ex.destroy(handle)


def test_memo_hits_refuse_what_the_general_path_refuses():
    ex = XnnpackExecutor(num_threads=1)
    handle = _single_delegate("linear", ex)
    try:
        x = _x(3, 0)
        ref = ex.execute(handle, [x], [None])[0]
        ex.execute(handle, [x], [None])  # the memo is set
        with pytest.raises(RuntimeExecutionError, match=r"out has 2 entries, the delegate has 1 outputs"):
            ex.execute(handle, [x], [None, None])
        with pytest.raises(RuntimeExecutionError, match=r"out\[0\] must be a writable C-contiguous float32 array"):
            ex.execute(handle, [x], [np.zeros((1, 3, 47), np.float32)])
        with pytest.raises(RuntimeExecutionError, match="input 0 must be float32"):
            ex.execute(handle, [x.astype(np.float64)], [None])
        with pytest.raises(RuntimeExecutionError, match="exceeds the upper bound|smaller in a dynamic dim"):
            ex.execute(handle, [_x(BOUND + 1, 0)], [None])
        strided = np.zeros((1, 3, 64), np.float32)[:, :, ::2]
        strided[...] = x
        np.testing.assert_array_equal(ex.execute(handle, [strided], [None])[0], ref)  # converted, same bits
        out = np.full((1, 3, 48), np.nan, np.float32)
        assert ex.execute(handle, [x], [out])[0] is out
        np.testing.assert_array_equal(out, ref)
    finally:
        ex.destroy(handle)
    with pytest.raises(RuntimeExecutionError, match="live handle"):
        ex.execute(handle, [x], [None])


def _decode(pte: bytes, traced: bool) -> list[np.ndarray]:
    """Logits of a prefill and six decode steps, every delegate call on the general path when ``traced``."""
    from edgeport.runtime import Runtime

    method = Runtime.get().load_program(pte).load_method(backend_options={"XnnpackBackend": {"num_threads": 1}})
    delegates = method._plan._delegates.items
    if traced:
        for d in delegates:
            d.executor.set_event_tracer(d.handle, StepTracer())
    outs = greedy_decode(method, 6)
    if not traced:  # the decode calls took the memo
        assert any(d.handle.specializer.last is not None for d in delegates)
    return outs


@pytest.mark.parametrize("scheme", [None, "8da4w"])
def test_decoder_steps_match_the_general_path_bit_for_bit(scheme):
    pytest.importorskip("transformers")
    if scheme:
        pytest.importorskip("torchao")
    from edgeport.llm import export_decoder
    from edgeport.testing.decoders import DECODERS

    pte = export_decoder(DECODERS["llama"](size="small"), max_seq_len=16, max_context_len=32,
                         quantize=scheme).manager.buffer
    for k, (fast, slow) in enumerate(zip(_decode(pte, False), _decode(pte, True), strict=True)):
        np.testing.assert_array_equal(fast, slow, err_msg=f"{scheme}, call {k}")
