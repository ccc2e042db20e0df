"""Robustness of the C glue (``edgeport_xnnpack._glue``) under bad, odd and re-entrant arguments.

Every call either raises a clear exception (``native.XnnpackError`` for a refused argument, ``RuntimeError``
"already running" / "deleted" for overlapping or closed use) or gives the numpy oracle's result, and the runtime
stays usable afterwards. The parts that could crash the interpreter if the glue regressed (re-entrant calls, lists
mutated during a call, a long seeded fuzz) run in a subprocess: a crash fails the test instead of killing pytest.
Threads and closing under a call: ``test_glue_threads``.
"""

from __future__ import annotations

import gc
import random
import weakref
from typing import Any

import numpy as np
import pytest
from glue_fuzz_helpers import (
    BUSY,
    GLUE_MARKS,
    GOOD_KINDS,
    KINDS,
    assert_fc,
    fc_runtime,
    final_good_calls,
    run_isolated,
    runtime_call,
    shuffle_call,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeport_xnnpack import native
from edgeport_xnnpack._native_run import _fn_address, _raise_status

pytestmark = GLUE_MARKS


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
