"""The host kernel for transposed operands (``_kernels.transpose_scale``): a multiply by a scalar of a transposed
view (the attention's ``K^T * scale`` on the key cache) and a transposing copy run on it instead of numpy's strided
copy. The results must be numpy's bit for bit: checked on the kernel alone, on the host op, and on whole Hugging
Face decoders (prefill and decode steps) against the same program with the numpy path forced."""

from __future__ import annotations

import numpy as np
import pytest
from xnn_helpers import greedy_decode

from edgeport_xnnpack import _host
from edgeport_xnnpack.schema.graph import XNode

kernels = pytest.importorskip("edgeport_xnnpack._kernels")
if not hasattr(kernels, "transpose_scale"):
    pytest.skip("the _kernels extension predates transpose_scale (rebuild it)", allow_module_level=True)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def _awkward(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Normal values with infinities, NaNs, signed zeros, subnormals and huge values mixed in."""
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-40, -3e-39, 3e38, -3e38], np.float32)
    pick = rng.integers(0, flat.size, size=min(flat.size, 64))
    flat[pick] = specials[rng.integers(0, specials.size, size=pick.size)]
    return x


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 3, 5), (2, 17, 33), (8, 128, 64), (3, 16, 16), (1, 1, 300),
                                   (4, 250, 1)])
@pytest.mark.parametrize("scale", [None, 0.35355339, -3.0, float("inf")])
def test_kernel_equals_numpy_bit_for_bit(shape, scale):
    rng = np.random.default_rng(sum(shape))
    src = _awkward(shape, rng)
    out = np.full((shape[0], shape[2], shape[1]), 7.0, np.float32)
    s = None if scale is None else float(np.float32(scale))
    assert kernels.transpose_scale(src, out, *shape, s) is True
    want = src.transpose(0, 2, 1) if scale is None else np.multiply(src.transpose(0, 2, 1), np.float32(scale))
    np.testing.assert_array_equal(_bits(out), _bits(want))


def test_kernel_refuses_bad_buffers_and_leaves_overlap_to_numpy():
    src = np.zeros((2, 4, 8), np.float32)
    with pytest.raises(ValueError, match="float32"):
        kernels.transpose_scale(src.astype(np.float64), np.zeros((2, 8, 4), np.float32), 2, 4, 8)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.transpose_scale(src.transpose(0, 2, 1), np.zeros((2, 8, 4), np.float32), 2, 8, 4)
    with pytest.raises(ValueError, match="writable"):
        kernels.transpose_scale(src, np.frombuffer(bytes(256), np.float32), 2, 4, 8)
    with pytest.raises(ValueError, match="bytes"):
        kernels.transpose_scale(src, np.zeros((2, 8, 5), np.float32), 2, 4, 8)
    with pytest.raises(ValueError, match="bad sizes"):
        kernels.transpose_scale(src, np.zeros((2, 8, 4), np.float32), -2, 4, 8)
    with pytest.raises(TypeError):
        kernels.transpose_scale(src, np.zeros((2, 8, 4), np.float32), 2, 4, 8, "half")
    buf = np.arange(64, dtype=np.float32)
    assert kernels.transpose_scale(buf, buf, 2, 4, 8) is False  # in place: not done, numpy does it
    np.testing.assert_array_equal(buf, np.arange(64, dtype=np.float32))


def _mul_node(scalar_first: bool) -> XNode:
    a, b = (6, 5) if scalar_first else (5, 6)
    return XNode("XNNMultiply", {"input1_id": a, "input2_id": b, "output_id": 7, "flags": 0})


@pytest.mark.parametrize("scalar_first", [False, True])
def test_host_multiply_of_a_transposed_view_is_numpy_s(monkeypatch, scalar_first):
    rng = np.random.default_rng(1)
    cache = _awkward((1, 2, 4, 128, 64), rng)
    scale = np.array([0.35355339], np.float32)
    view = cache.reshape(8, 128, 64).transpose(0, 2, 1).reshape(1, 8, 64, 128)  # what the segment's views give
    shapes = [(1,), (1, 8, 64, 128)] if scalar_first else [(1, 8, 64, 128), (1,)]
    op = _host.make_host_op(_mul_node(scalar_first), shapes, (1, 8, 64, 128))
    xs = [scale, view] if scalar_first else [view, scale]
    calls = []
    real = _host._kernels

    class Counting:
        def transpose_scale(self, *args):
            calls.append(args[2:])
            return real.transpose_scale(*args)

    monkeypatch.setattr(_host, "_kernels", Counting())
    out = np.empty((1, 8, 64, 128), np.float32)
    op.into(xs, out)
    assert calls == [(8, 128, 64, float(scale[0]))]
    np.testing.assert_array_equal(_bits(out), _bits(np.multiply(view, scale)))
    # a C-contiguous operand, another dtype, or no kernel: numpy, same bits
    monkeypatch.setattr(_host, "_kernels", None)
    out2 = np.empty_like(out)
    op.into(xs, out2)
    np.testing.assert_array_equal(_bits(out2), _bits(out))


def test_host_transpose_materialized_is_numpy_s():
    node = XNode("XNNStaticTranspose", {"num_dims": 3, "perm": [0, 2, 1], "input_id": 1, "output_id": 2,
                                        "flags": 0})
    op = _host.make_host_op(node, [(3, 64, 40)], (3, 40, 64))
    x = _awkward((3, 64, 40), np.random.default_rng(2))
    out = np.empty((3, 40, 64), np.float32)
    op.into([x], out)
    np.testing.assert_array_equal(_bits(out), _bits(x.transpose(0, 2, 1)))
    xi = np.arange(3 * 64 * 40, dtype=np.int8).reshape(3, 64, 40)  # int8 (an int8 transpose): numpy's copy
    outi = np.empty((3, 40, 64), np.int8)
    op.into([xi], outi)
    np.testing.assert_array_equal(outi, xi.transpose(0, 2, 1))


def _decode_outputs(pte: bytes, steps: int) -> list[list[np.ndarray]]:
    from edgeport.runtime import Runtime

    method = Runtime.get().load_program(pte).load_method(backend_options={"XnnpackBackend": {"num_threads": 1}})
    return greedy_decode(method, steps, every_output=True)


@pytest.mark.parametrize("name, size", [("llama", "small"), pytest.param("gpt2", "small", marks=pytest.mark.slow),
                                        pytest.param("qwen2", "small", marks=pytest.mark.slow),
                                        pytest.param("llama", "medium", marks=pytest.mark.slow)])
def test_decoder_steps_bit_identical_to_the_numpy_path(monkeypatch, name, size):
    """The C paths (whole data-moving segments as copy runs; transposed operands of a multiply or a copy where
    the planning puts them on the host) against the numpy program, on prefill and decode steps of a Hugging Face
    decoder."""
    pytest.importorskip("transformers")
    from edgeport.llm import export_decoder
    from edgeport.testing.decoders import DECODERS
    from edgeport_xnnpack import _copies

    seq, context = (16, 32) if size == "small" else (32, 128)  # medium: bench/llm.py's program
    pte = export_decoder(DECODERS[name](size=size), max_seq_len=seq, max_context_len=context).manager.buffer
    real, real_runs = _host._kernels, _copies._run
    calls, runs = [], []

    class Counting:
        def __getattr__(self, attr):
            return getattr(real, attr)

        def transpose_scale(self, *args):
            calls.append(args[2:5])
            return real.transpose_scale(*args)

    def counting_runs(*args):
        done = real_runs(*args)
        runs.append(done)
        return done

    monkeypatch.setattr(_host, "_kernels", Counting())
    monkeypatch.setattr(_copies, "_run", counting_runs)
    fast = _decode_outputs(pte, 8)
    assert runs and all(runs), "no data-moving segment ran as copy runs (or the kernel declined)"
    monkeypatch.setattr(_host, "_transposed_into", lambda *a: False)  # numpy's strided copies (the old path)
    monkeypatch.setattr(_host, "plan_copies", lambda *a: None)  # numpy's program per node
    slow = _decode_outputs(pte, 8)
    assert len(fast) == len(slow) == 9
    for f, s in zip(fast, slow, strict=True):
        for a, b in zip(f, s, strict=True):
            np.testing.assert_array_equal(_bits(a), _bits(b))


def _segment(nodes, shapes, materialize):
    ops = [_host.make_host_op(n, [shapes[i] for i in n.inputs()], shapes[n.outputs()[0]]) for n in nodes]
    return _host.HostSegment(nodes, ops, set(materialize), shapes.__getitem__)


def _moves():
    """Head split, rotary halves, a transposed output, a concatenation of a slice and an input, a reshape."""
    nodes = [
        XNode("XNNStaticTranspose", {"num_dims": 4, "perm": [0, 2, 1, 3], "input_id": 1, "output_id": 2, "flags": 0}),
        XNode("XNNStaticSlice", {"num_dims": 4, "offsets": [0, 0, 0, 2], "sizes": [2, 8, 3, 3], "input_id": 2,
                                 "output_id": 3, "flags": 0}),
        XNode("XNNStaticReshape", {"num_dims": 3, "new_shape": [2, 8, 9], "input_id": 3, "output_id": 4,
                                   "flags": 0}),
        XNode("XNNConcatenate2", {"axis": 2, "input1_id": 4, "input2_id": 5, "output_id": 6, "flags": 0}),
        XNode("XNNStaticReshape", {"num_dims": 2, "new_shape": [16, 18], "input_id": 6, "output_id": 7,
                                   "flags": 0}),
        XNode("XNNStaticSlice", {"num_dims": 4, "offsets": [1, 0, 0, 0], "sizes": [1, 3, 8, 6], "input_id": 1,
                                 "output_id": 8, "flags": 0}),
    ]
    shapes = {1: (2, 3, 8, 6), 2: (2, 8, 3, 6), 3: (2, 8, 3, 3), 4: (2, 8, 9), 5: (2, 8, 9), 6: (2, 8, 18),
              7: (16, 18), 8: (1, 3, 8, 6)}
    return nodes, shapes


def test_a_data_moving_segment_runs_as_copy_runs_with_numpy_s_bits():
    nodes, shapes = _moves()
    seg = _segment(nodes, shapes, {2, 7, 8})
    assert seg.copies is not None and seg.io == ([1, 5], [2, 7, 8])
    ref = _segment(nodes, shapes, {2, 7, 8})
    ref.copies = None  # the numpy program
    rng = np.random.default_rng(3)
    for _ in range(3):
        env = {1: _awkward(shapes[1], rng), 5: _awkward(shapes[5], rng)}
        got = {**env, **{v: np.full(shapes[v], 9.0, np.float32) for v in (2, 7, 8)}}
        want = {**env, **{v: np.full(shapes[v], 9.0, np.float32) for v in (2, 7, 8)}}
        seg.run(got)
        ref.run(want)
        for v in (2, 7, 8):
            np.testing.assert_array_equal(_bits(got[v]), _bits(want[v]))
    np.testing.assert_array_equal(got[2], env[1].transpose(0, 2, 1, 3))  # and numpy is right


def test_copy_runs_declines_what_it_cannot_do_and_numpy_does_it():
    nodes, shapes = _moves()
    seg = _segment(nodes, shapes, {2, 7, 8})
    x = np.random.default_rng(4).standard_normal(shapes[1]).astype(np.float32)
    y = np.ones(shapes[5], np.float32)
    outs = [np.zeros(shapes[v], np.float32) for v in (2, 7, 8)]
    assert seg.copies.run([x, y, *outs]) is True
    assert seg.copies.run([x.astype(np.float64), y, *outs]) is False  # another item size
    assert seg.copies.run([np.asfortranarray(x), y, *outs]) is False  # not C-contiguous
    assert seg.copies.run([x[:1], y, *outs]) is False  # smaller than planned
    ro = np.zeros(shapes[2], np.float32)
    ro.setflags(write=False)
    assert seg.copies.run([x, y, ro, *outs[1:]]) is False  # a read-only destination
    assert seg.copies.run([x, y, outs[0], outs[1], outs[1]]) is False  # two destinations in one array
    flat = np.zeros(x.size * 2, np.float32)  # a destination overlapping a source
    assert seg.copies.run([flat[: x.size].reshape(shapes[1]), y, flat[x.size:].reshape(shapes[2]), *outs[1:]]) \
        is True  # adjacent, not overlapping
    assert seg.copies.run([flat[: x.size].reshape(shapes[1]), y, flat[:x.size].reshape(shapes[2]), *outs[1:]]) \
        is False
    with pytest.raises(ValueError, match="bad row"):
        kernels.copy_runs([x, outs[0]], 1, np.array([[0, 0, 0, 0, 1, 1, 0]], np.int64), 4)  # dst slot is a source
    with pytest.raises(ValueError, match="rows of 7"):
        kernels.copy_runs([x, outs[0]], 1, np.zeros(6, np.int64), 4)


def test_segments_that_compute_keep_their_numpy_program():
    node = XNode("XNNMultiply", {"input1_id": 1, "input2_id": 2, "output_id": 3, "flags": 0})
    seg = _segment([node], {1: (4, 4), 2: (1,), 3: (4, 4)}, {3})
    assert seg.copies is None
