"""Persistent expands of KV caches (``edgeport.runtime._kvexpand``): the grouped-query ``expand_copy`` of a Hugging
Face GQA decoder lowered to XNNPACK keeps its result across runs and copies only the rows the cache writes
changed. Checked against the same program loaded without the rewrite (bit-identical logits over prefill, decode
steps, out-of-order positions and a prefill after decoding) and against eager PyTorch (greedy tokens); the
tracker and the refresh on their own against ``expand_copy`` run in full."""

from __future__ import annotations

import numpy as np
import pytest

import edgeport.runtime._compile as compile_module
import edgeport.runtime._method as method_module
from edgeport.runtime._kvexpand import ExpandTracker, PersistentExpand, expand_op, tracked_index_put
from edgeport.runtime.portable.shape import expand_copy_out, index_put_inplace

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("edgeport_xnnpack.runtime")

from edgeport.runtime import Runtime  # noqa: E402


@pytest.fixture(scope="module", params=[None, "8da4w"])
def decoder(request):
    from edgeport.llm import export_decoder
    from edgeport.testing.decoders import DECODERS

    model = DECODERS["llama"](seed=0, size="small")  # 4 heads over 2 KV heads
    return model, request.param, export_decoder(model, max_seq_len=8, max_context_len=32,
                                                quantize=request.param).manager.buffer


def _load(pte: bytes, on: bool, monkeypatch, views: bool = True, bind: bool = True):
    with monkeypatch.context() as m:
        if not on:
            m.setattr(method_module, "persistent_expands", lambda *a, **k: {})
        if not bind:
            m.setattr(compile_module, "bindable_outputs", lambda *a, **k: set())
        if not views:
            m.setattr(method_module, "reshape_delegates", lambda *a, **k: {})
        return Runtime.get().load_program(pte).load_method("forward")


def _step(method, token: int, pos: int) -> np.ndarray:
    return method.execute([np.array([[token]], dtype=np.int64), np.array([pos], dtype=np.int64)])[0]


def _prefill(method, prompt: list[int]) -> np.ndarray:
    return method.execute([np.array([prompt], dtype=np.int64), np.arange(len(prompt), dtype=np.int64)])[0]


@pytest.mark.parametrize("what", ["expands", "bound outputs"])
def test_persistent_expands_bit_identical_across_runs_and_as_eager(decoder, monkeypatch, what):
    """Also the dynamic delegate outputs bound as the executor's arrays (``runtime._views.bindable_outputs``)."""
    from edgeport.testing.decoders import greedy_reference

    model, scheme, pte = decoder
    on = _load(pte, True, monkeypatch)
    if what == "expands":
        off = _load(pte, False, monkeypatch)
        assert on.profile.persistent_expands >= 4  # K and V of both layers
        assert off.profile.persistent_expands == 0
    else:
        off = _load(pte, True, monkeypatch, bind=False)
        found = []
        with monkeypatch.context() as m:
            m.setattr(compile_module, "bindable_outputs",
                      lambda *a, f=compile_module.bindable_outputs: found.append(f(*a)) or found[-1])
            on = _load(pte, True, monkeypatch)
        assert len(found[0]) >= 8  # the projections' and attention's dynamic outputs
        _prefill(on, [1, 2, 3])
        vals, arenas = on._runner._pool[0].vals, on._runner._pool[0].arenas
        for o in found[0]:  # the executor's own arrays, outside planned memory
            assert not any(np.shares_memory(vals[o], a) for a in arenas if a.size)
    prompt = [5, 17, 3, 99, 42]
    seen = []
    for m in (on, off):
        logits = [_prefill(m, prompt)]
        tokens = []
        for i in range(10):
            tokens.append(int(np.argmax(logits[-1].reshape(-1, logits[-1].shape[-1])[-1])))
            logits.append(_step(m, tokens[-1], len(prompt) + i))
        # positions out of order (a rewound cache), then a prefill after decoding, then decoding again
        logits += [_step(m, 7, 3), _step(m, 8, 20), _step(m, 9, 4)]
        logits.append(_prefill(m, prompt[:3]))
        logits += [_step(m, 11, 3), _step(m, 12, 4)]
        seen.append((tokens, logits))
    (got, a), (ref, b) = seen
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert got == ref
    if scheme is None:
        assert got == greedy_reference(model, prompt, 10, max_context_len=32)


def test_not_applied_when_a_delegate_writes_the_expand_input(decoder, monkeypatch):
    """Without the reshape views, the expand's input is a delegate's output: not a cache only ``index_put_``
    writes, so nothing persists."""
    _, _, pte = decoder
    method = _load(pte, True, monkeypatch, views=False)
    assert method.profile.persistent_expands == 0
    ref = _load(pte, False, monkeypatch, views=False)
    np.testing.assert_array_equal(_prefill(method, [1, 2, 3]), _prefill(ref, [1, 2, 3]))


def _setup():
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((1, 2, 16, 4)).astype(np.float32)
    view = cache.reshape(1, 2, 1, 16, 4)
    pe = PersistentExpand(source=0, view=1, out=2, dims={1: 1, 2: 3, 3: 4}, writers=((0, 0),))
    return rng, cache, view, pe, np.zeros((1, 2, 3, 16, 4), np.float32), ExpandTracker()


def test_refresh_copies_the_written_rows_like_a_full_expand():
    rng, cache, view, pe, out, tracker = _setup()
    op = expand_op(pe, expand_copy_out)
    size = (1, 2, 3, 16, 4)
    assert op(view, size, False, out, tracker) is out and tracker.valid
    for pos in ([3], [15], [0, 1, 2], [-1]):
        values = rng.standard_normal((1, 2, len(pos), 4)).astype(np.float32)
        idx = [None, None, np.array(pos, dtype=np.int64)]
        tracked_index_put(cache, idx, values, False, tracker)
        assert tracker.valid and tracker.dirty
        op(view, size, False, out, tracker)
        np.testing.assert_array_equal(out, np.broadcast_to(view, size))
        assert tracker.dirty == []


def test_writes_it_cannot_describe_force_a_full_copy():
    rng, cache, view, pe, out, tracker = _setup()
    op = expand_op(pe, expand_copy_out)
    size = (1, 2, 3, 16, 4)
    op(view, size, False, out, tracker)
    ref = cache.copy()
    cases = [
        ([None, None, np.array([5, 2], dtype=np.int64)], False, False),  # not ascending: fancy indexing
        ([None, None, np.array([4], dtype=np.int64)], True, False),  # accumulate
        ([np.array([0], dtype=np.int64), None, None], False, True),  # a size-1 dim: recorded, refreshed in full
    ]
    for idx, acc, recorded in cases:
        shape = np.broadcast_to(cache, cache.shape)[tuple(slice(None) if i is None else i for i in idx)].shape
        values = rng.standard_normal(shape).astype(np.float32)
        tracked_index_put(cache, idx, values, acc, tracker)
        index_put_inplace(ref, idx, values, acc)
        np.testing.assert_array_equal(cache, ref)
        assert tracker.valid is recorded
        op(view, size, False, out, tracker)
        assert tracker.valid and tracker.dirty == []
        np.testing.assert_array_equal(out, np.broadcast_to(view, size))


def test_too_many_rows_between_refreshes_force_a_full_copy():
    rng, cache, view, pe, out, tracker = _setup()
    op = expand_op(pe, expand_copy_out)
    size = (1, 2, 3, 16, 4)
    op(view, size, False, out, tracker)
    for k in range(40):
        values = rng.standard_normal((1, 2, 1, 4)).astype(np.float32)
        tracked_index_put(cache, [None, None, np.array([k % 16], dtype=np.int64)], values, False, tracker)
    assert not tracker.valid
    op(view, size, False, out, tracker)
    np.testing.assert_array_equal(out, np.broadcast_to(view, size))
