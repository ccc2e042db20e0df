"""Host segments bound to the direct call's arrays (``edgeport_xnnpack._replay``): once the same arrays come twice
in a row, the segment's views are made once and only its kernels run. The results must be the unbound program's
bit for bit -- on single segments (a product on transposed views, a transposing copy, values changed in place
between calls, other arrays, programs that cannot be bound) and on Hugging Face small configs against the same
program with binding turned off, and close to eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from xnn_helpers import RTOL, eager, needs_xnnpack, rel_err

from edgeport_xnnpack import _host, _replay, _steps
from edgeport_xnnpack.schema.graph import XNode


def _attention_segment() -> tuple[_host.HostSegment, list[int]]:
    """q [4, 8, 16] @ k^T (k [4, 8, 16] transposed as a view) into [1, 4, 8, 8], and v [4, 8, 16] transposed
    copied out into [4, 16, 8]: what a small config's attention segment does."""
    nodes = [
        XNode("XNNStaticTranspose", {"num_dims": 3, "perm": [0, 2, 1], "input_id": 2, "output_id": 4, "flags": 0}),
        XNode("XNNBatchMatrixMultiply", {"input1_id": 1, "input2_id": 4, "output_id": 5, "flags": 0}),
        XNode("XNNStaticReshape", {"num_dims": 4, "new_shape": [1, 4, 8, 8], "input_id": 5, "output_id": 6,
                                   "flags": 0}),
        XNode("XNNStaticTranspose", {"num_dims": 3, "perm": [0, 2, 1], "input_id": 3, "output_id": 7, "flags": 0}),
    ]
    shapes = {1: (4, 8, 16), 2: (4, 8, 16), 3: (4, 8, 16), 4: (4, 16, 8), 5: (4, 8, 8), 6: (1, 4, 8, 8),
              7: (4, 16, 8)}
    ops = [_host.make_host_op(n, [shapes[i] for i in n.inputs()], shapes[n.outputs()[0]]) for n in nodes]
    seg = _host.HostSegment(nodes, ops, {6, 7}, shapes.__getitem__)
    assert seg.io == ([1, 2, 3], [6, 7])
    return seg, [1, 2, 3, 6, 7]


def _arrays(rng: np.random.Generator) -> list[np.ndarray]:
    ins = [rng.standard_normal((4, 8, 16)).astype(np.float32) for _ in range(3)]
    return [*ins, np.full((1, 4, 8, 8), np.nan, np.float32), np.full((4, 16, 8), np.nan, np.float32)]


def _unbound(seg: _host.HostSegment, vids: list[int], arrays: list[np.ndarray]) -> list[np.ndarray]:
    outs = [np.empty_like(arrays[3]), np.empty_like(arrays[4])]
    seg.run(dict(zip(vids, [*arrays[:3], *outs], strict=True)))
    return outs


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_a_bound_segment_gives_the_program_s_bits_and_reads_values_changed_in_place(monkeypatch):
    seg, vids = _attention_segment()
    binding = _replay.SegmentBinding(seg, vids)
    rng = np.random.default_rng(0)
    arrays = _arrays(rng)
    calls: list[str] = []
    monkeypatch.setattr(_replay, "partial", _counting_partial(calls))
    for k in range(4):
        for a in arrays[:3]:  # new values in the same arrays
            a[...] = rng.standard_normal(a.shape).astype(np.float32)
        arrays[2].reshape(-1)[k] = [np.inf, -0.0, np.nan, 1e-40][k]
        binding.run(tuple(arrays))
        assert (binding._bound is not None) == (k >= 1)  # bound on the second call with the same arrays
        want = _unbound(seg, vids, arrays)
        _same_bits(arrays[3], want[0])
        _same_bits(arrays[4], want[1])
    np.testing.assert_allclose(arrays[3].reshape(4, 8, 8), arrays[0] @ arrays[1].transpose(0, 2, 1), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(arrays[4], arrays[2].transpose(0, 2, 1))
    assert calls == ["setitem"]  # the transposing copy bound to one dst[...] = view (float32 both)


def _counting_partial(calls: list[str]):
    from functools import partial

    def counting(fn, *args, **kwargs):  # noqa: ANN001, ANN202
        if fn is np.copyto:
            calls.append("copyto")
        elif getattr(fn, "__name__", "") == "__setitem__" and isinstance(getattr(fn, "__self__", None), np.ndarray):
            calls.append("setitem")
        return partial(fn, *args, **kwargs)
    return counting


def test_other_arrays_run_the_program_and_are_bound_in_turn():
    seg, vids = _attention_segment()
    binding = _replay.SegmentBinding(seg, vids)
    rng = np.random.default_rng(1)
    first, second = _arrays(rng), _arrays(rng)
    for arrays in (first, first, first, second, second, first, second):
        for a in arrays[3:]:
            a[...] = np.nan
        binding.run(tuple(arrays))
        want = _unbound(seg, vids, arrays)
        _same_bits(arrays[3], want[0])
        _same_bits(arrays[4], want[1])
    assert binding._bound is None or binding._bound[0][0] is second[0]
    # a binding with replay off never binds
    off = _replay.SegmentBinding(seg, vids, replay=False)
    for _ in range(3):
        off.run(tuple(first))
    assert off._bound is None


def test_a_program_that_computes_fresh_arrays_is_not_bound():
    """A tanh between two views computes a fresh array on every call: the program runs as it is."""
    nodes = [
        XNode("XNNStaticTranspose", {"num_dims": 2, "perm": [1, 0], "input_id": 1, "output_id": 2, "flags": 0}),
        XNode("XNNTanh", {"input_id": 2, "output_id": 3, "flags": 0}),
        XNode("XNNStaticTranspose", {"num_dims": 2, "perm": [1, 0], "input_id": 3, "output_id": 4, "flags": 0}),
    ]
    shapes = {1: (6, 10), 2: (10, 6), 3: (10, 6), 4: (6, 10)}
    ops = [_host.make_host_op(n, [shapes[i] for i in n.inputs()], shapes[n.outputs()[0]]) for n in nodes]
    seg = _host.HostSegment(nodes, ops, {4}, shapes.__getitem__)
    assert _replay.bind_program(seg, {1: np.zeros((6, 10), np.float32), 4: np.zeros((6, 10), np.float32)}) is None
    binding = _replay.SegmentBinding(seg, [1, 4])
    x, out = np.random.default_rng(2).standard_normal((6, 10)).astype(np.float32), np.empty((6, 10), np.float32)
    for k in range(3):
        x += 1.0
        binding.run((x, out))
        np.testing.assert_array_equal(out, np.tanh(x))
    assert binding._bound is None and binding.replay is False


def test_a_reshape_numpy_must_copy_is_not_bound_as_a_view():
    """A reshape of a transposed view is a copy in numpy: binding it would read stale values, so it is refused."""
    nodes = [
        XNode("XNNStaticTranspose", {"num_dims": 2, "perm": [1, 0], "input_id": 1, "output_id": 2, "flags": 0}),
        XNode("XNNStaticReshape", {"num_dims": 1, "new_shape": [60], "input_id": 2, "output_id": 3, "flags": 0}),
        XNode("XNNStaticReshape", {"num_dims": 2, "new_shape": [5, 12], "input_id": 3, "output_id": 4, "flags": 0}),
        XNode("XNNTanh", {"input_id": 4, "output_id": 5, "flags": 0}),
    ]
    shapes = {1: (6, 10), 2: (10, 6), 3: (60,), 4: (5, 12), 5: (5, 12)}
    ops = [_host.make_host_op(n, [shapes[i] for i in n.inputs()], shapes[n.outputs()[0]]) for n in nodes]
    seg = _host.HostSegment(nodes, ops, {5}, shapes.__getitem__)
    binding = _replay.SegmentBinding(seg, seg.io[0] + seg.io[1])
    x, out = np.zeros((6, 10), np.float32), np.empty((5, 12), np.float32)
    for k in range(3):
        x[...] = np.random.default_rng(k).standard_normal((6, 10))
        binding.run((x, out))
        np.testing.assert_array_equal(out, np.tanh(x.T.reshape(5, 12)))


HF_SMALL = ["bert", "vit", "llama", "t5_encoder"]


@needs_xnnpack
@pytest.mark.parametrize("name", HF_SMALL)
def test_small_configs_give_the_unbound_bits_and_eager_s_values(monkeypatch, name):
    from edgeport.runtime import Runtime
    from edgeport.testing.architectures import ARCHITECTURES
    from xnn_helpers import lower_edgeport

    arch = ARCHITECTURES[name](seed=0, size="small")
    _, pte, _ = lower_edgeport(arch.model, tuple(arch.example_inputs))
    opts = {"XnnpackBackend": {"num_threads": 1}}
    made: dict[bool, list[_replay.SegmentBinding]] = {True: [], False: []}

    def recording(replay: bool):  # noqa: ANN202
        def make(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            made[replay].append(_replay.SegmentBinding(*args, replay=replay, **kwargs))
            return made[replay][-1]
        return make
    monkeypatch.setattr(_steps, "SegmentBinding", recording(True))
    bound = Runtime.get().load_program(pte).load_method("forward", backend_options=opts)
    monkeypatch.setattr(_steps, "SegmentBinding", recording(False))
    unbound = Runtime.get().load_program(pte).load_method("forward", backend_options=opts)
    monkeypatch.undo()
    gen = torch.Generator().manual_seed(5)
    for k in range(4):
        if arch.kind == "text":
            x = torch.randint(0, arch.vocab, tuple(arch.example_inputs[0].shape), generator=gen)
        else:
            x = torch.randn(tuple(arch.example_inputs[0].shape), generator=gen)
        got = bound.execute([x.numpy()])
        want = unbound.execute([x.numpy()])
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same_bits(np.asarray(g), np.asarray(w))
        assert rel_err(got[0], eager(arch.model, (x,))) < RTOL
    assert made[True] and any(b._bound is not None for b in made[True])
    assert all(b._bound is None for b in made[False])


@needs_xnnpack
def test_bound_arrays_are_released_by_other_arrays_and_by_destroy():
    """The one exception to "no reference to the caller's arrays is kept": arrays that came twice in a row, held
    until a call with other arrays or ``destroy``; the results stay the reference's."""
    import gc
    import weakref

    from test_executor_plan import D, S, attention_blob, attention_reference

    from edgeport_xnnpack.runtime import XnnpackExecutor

    blob, c = attention_blob()
    ex = XnnpackExecutor(num_threads=1)
    h = ex.init(memoryview(blob), [])
    try:
        def call_twice() -> list[weakref.ref]:
            x = np.random.default_rng(6).standard_normal((1, S, D), dtype=np.float32)
            outs = [np.empty((S, 1, D), np.float32), np.empty((1, S, S), np.float32)]
            for _ in range(2):
                got = ex.execute(h, [x], out=outs)
                for g, w in zip(got, attention_reference(x, c), strict=True):
                    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
            return [weakref.ref(a) for a in (x, *outs)]

        refs = call_twice()
        gc.collect()
        assert any(r() is not None for r in refs)  # a host segment of the blob bound them
        x = np.ones((1, S, D), np.float32)
        for g, w in zip(ex.execute(h, [x]), attention_reference(x, c), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
        gc.collect()
        assert all(r() is None for r in refs)  # released by the call with other arrays
        refs = call_twice()
        gc.collect()
        assert any(r() is not None for r in refs)
    finally:
        ex.destroy(h)
    gc.collect()
    assert all(r() is None for r in refs)
