"""XnnpackExecutor planning and calling: host segments on views, channel-shuffle transposes, setup caching,
destination passing (``out=``) and the scoped single-threaded BLAS; every result against a numpy oracle."""

from __future__ import annotations

import numpy as np
import pytest
from xnn_helpers import corrupted_blobs, needs_xnnpack

from edgeport.errors import RuntimeExecutionError
from edgeport_xnnpack import _fc_ops, native
from edgeport_xnnpack._blas import blas_threads
from edgeport_xnnpack._fc_ops import FullyConnectedStep
from edgeport_xnnpack._plan import shuffle_dims, squeeze_perm
from edgeport_xnnpack.options import XnnpackRuntimeOptions
from edgeport_xnnpack.runtime import NativeStep, ShuffleStep, XnnpackExecutor
from edgeport_xnnpack.schema import ConstantDataOffset, Graph, TensorValue, XNode, serialize
from edgeport_xnnpack.schema.graph import INVALID_ID

pytestmark = needs_xnnpack
S, D = 16, 8  # tokens, model width


def attention_blob() -> tuple[bytes, dict[str, np.ndarray]]:
    """x -> FC(qkv) -> reshape/transpose/slices -> q * scale @ k^T (scores, an output) -> softmax -> @ v ->
    size-1 transpose -> FC -> output; the 2022 library has no transpose, slice or batch matmul node."""
    rng = np.random.default_rng(0)
    c = {"w1": rng.standard_normal((3 * D, D), dtype=np.float32), "b1": rng.standard_normal(3 * D, dtype=np.float32),
         "scale": np.array([0.35], np.float32), "w2": rng.standard_normal((D, D), dtype=np.float32),
         "b2": rng.standard_normal(D, dtype=np.float32)}
    data, entries = b"", [ConstantDataOffset()]
    for a in c.values():
        entries.append(ConstantDataOffset(len(data), a.nbytes))
        data += a.tobytes()
    g = Graph(constant_data=entries)
    dims = {0: [1, S, D], 1: [3 * D, D], 2: [3 * D], 3: [1, S, 3 * D], 4: [S, 3, D], 5: [3, S, D], 6: [1, S, D],
            7: [1, S, D], 8: [1, S, D], 9: [1, D, S], 10: [1], 11: [1, S, D], 12: [1, S, S], 13: [1, S, S],
            14: [1, S, D], 15: [S, 1, D], 16: [D, D], 17: [D], 18: [S, 1, D]}
    const = {1: 1, 2: 2, 10: 3, 16: 4, 17: 5}
    ext = {0: (0, 1), 18: (1, 2), 12: (2, 2)}
    g.values = [TensorValue(1, dims[v], v, constant_buffer_idx=const.get(v, 0),
                            external_id=ext.get(v, (INVALID_ID,))[0], flags=ext.get(v, (0, 0))[1]) for v in dims]
    g.nodes = [
        XNode("XNNFullyConnected", dict(input1_id=0, filter_id=1, bias_id=2, output_id=3)),
        XNode("XNNStaticReshape", dict(num_dims=3, new_shape=[S, 3, D], input_id=3, output_id=4)),
        XNode("XNNStaticTranspose", dict(num_dims=3, perm=[1, 0, 2], input_id=4, output_id=5)),
        *(XNode("XNNStaticSlice", dict(num_dims=3, offsets=[i, 0, 0], sizes=[1, S, D], input_id=5, output_id=6 + i))
          for i in range(3)),
        XNode("XNNStaticTranspose", dict(num_dims=3, perm=[0, 2, 1], input_id=7, output_id=9)),
        XNode("XNNMultiply", dict(input1_id=6, input2_id=10, output_id=11)),
        XNode("XNNBatchMatrixMultiply", dict(input1_id=11, input2_id=9, output_id=12)),
        XNode("XNNSoftmax", dict(input_id=12, output_id=13)),
        XNode("XNNBatchMatrixMultiply", dict(input1_id=13, input2_id=8, output_id=14)),
        XNode("XNNStaticTranspose", dict(num_dims=3, perm=[1, 0, 2], input_id=14, output_id=15)),
        XNode("XNNFullyConnected", dict(input1_id=15, filter_id=16, bias_id=17, output_id=18)),
    ]
    g.num_externs, g.input_ids, g.output_ids = 3, [0], [18, 12]
    return serialize(g, data), c


def attention_reference(x: np.ndarray, c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    x64 = {k: v.astype(np.float64) for k, v in c.items()}
    qkv = x.astype(np.float64)[0] @ x64["w1"].T + x64["b1"]
    q, k, v = qkv[:, :D], qkv[:, D:2 * D], qkv[:, 2 * D:]
    scores = (q * x64["scale"][0]) @ k.T
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = (p @ v) @ x64["w2"].T + x64["b2"]
    return out.reshape(S, 1, D), scores.reshape(1, S, S)


def test_attention_blob_plans_few_steps_and_matches_numpy():
    blob, c = attention_blob()
    ex = XnnpackExecutor(num_threads=2)
    h = ex.init(memoryview(blob), [], runtime_options=XnnpackRuntimeOptions(fully_connected="xnnpack"))
    try:
        # FC | reshape, transpose, slices, scalar multiply, matmul on views | softmax | matmul, view | FC; the two
        # fully connected layers on XNNPACK's operator (packed once, shared by every specialization: _fc_ops)
        fc_ops = 2 if _fc_ops.available() else 0
        assert h.summary == {"native_steps": 3 - fc_ops, "host_steps": 2, "operator_steps": fc_ops, "nodes": 13,
                             "fully_connected": "xnnpack"}
        x = np.random.default_rng(1).standard_normal((1, S, D), dtype=np.float32)
        out, scores = ex.execute(h, [x])
        ref_out, ref_scores = attention_reference(x, c)
        np.testing.assert_allclose(scores, ref_scores, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out, ref_out, rtol=1e-4, atol=1e-4)
    finally:
        ex.destroy(h)


def test_out_arrays_are_written_and_returned():
    blob, c = attention_blob()
    ex = XnnpackExecutor(num_threads=1)
    h = ex.init(memoryview(blob), [])
    try:
        x = np.random.default_rng(2).standard_normal((1, S, D), dtype=np.float32)
        ref_out, ref_scores = attention_reference(x, c)
        o0, o1 = np.full((S, 1, D), np.nan, np.float32), np.full((1, S, S), np.nan, np.float32)
        res = ex.execute(h, [x], out=[o0, o1])
        assert res[0] is o0 and res[1] is o1
        np.testing.assert_allclose(o0, ref_out, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(o1, ref_scores, rtol=1e-4, atol=1e-4)
        res = ex.execute(h, [x], out=[None, o1])  # None: a fresh array
        assert res[1] is o1 and res[0] is not o0
        np.testing.assert_allclose(res[0], ref_out, rtol=1e-4, atol=1e-4)
        ro = np.empty((S, 1, D), np.float32)
        ro.flags.writeable = False
        bad = [[o0], [np.empty((S, D), np.float32), o1], [o0.astype(np.float64), o1], [ro, o1],
               [np.empty((S, 2, D), np.float32)[:, :1], o1], [o0.tolist(), o1]]
        for out in bad:
            with pytest.raises(RuntimeExecutionError, match="out"):
                ex.execute(h, [x], out=out)
        np.testing.assert_allclose(ex.execute(h, [x])[0], ref_out, rtol=1e-4, atol=1e-4)  # still works
    finally:
        ex.destroy(h)


def test_setup_runs_only_when_a_pointer_changes():
    blob, c = attention_blob()
    ex = XnnpackExecutor(num_threads=1)
    h = ex.init(memoryview(blob), [])
    try:
        # the native runtimes and fully connected operators (_fc_ops), in step order: FC, softmax, FC
        natives = [s.runtime if isinstance(s, NativeStep) else s.op for s in h.steps
                   if isinstance(s, (NativeStep, FullyConnectedStep))]
        assert len(natives) == 3
        x = np.random.default_rng(3).standard_normal((1, S, D), dtype=np.float32)
        outs = [np.empty((S, 1, D), np.float32), np.empty((1, S, S), np.float32)]
        for _ in range(3):
            ex.execute(h, [x], out=outs)
        assert [rt.setups for rt in natives] == [1, 1, 1]
        x2 = x * 2
        ex.execute(h, [x2], out=outs)  # the first runtime reads the new input: set up again, the others not
        assert [rt.setups for rt in natives] == [2, 1, 1]
        np.testing.assert_allclose(outs[0], attention_reference(x2, c)[0], rtol=1e-4, atol=1e-4)
        x[...] = x2  # same array, new contents: no setup, new result
        ex.execute(h, [x], out=outs)
        assert natives[0].setups == 3  # x is at another address than x2
        ex.execute(h, [x], out=outs)
        assert natives[0].setups == 3
        np.testing.assert_allclose(outs[0], attention_reference(x2, c)[0], rtol=1e-4, atol=1e-4)
    finally:
        ex.destroy(h)


def test_blas_threads_are_restored():
    fns = blas_threads()
    if fns is None:
        pytest.skip("numpy has no OpenBLAS here")
    get, set_ = fns
    before = get()
    blob, _ = attention_blob()
    ex = XnnpackExecutor(num_threads=1)
    h = ex.init(memoryview(blob), [])
    try:
        set_(2)
        ex.execute(h, [np.ones((1, S, D), np.float32)])
        assert get() == 2
    finally:
        set_(before)
        ex.destroy(h)


def test_nchw_transposes_run_as_channel_shuffles_and_are_freed():
    from test_schema_runtime import conv_relu_graph, reference

    _, blob, w, bias = conv_relu_graph()
    ex = XnnpackExecutor(num_threads=2)
    h = ex.init(memoryview(blob), [])
    ops = [s.op for s in h.steps if isinstance(s, ShuffleStep)]
    assert len(ops) == 2 and all(op.handle for op in ops)
    x = np.random.default_rng(4).standard_normal((1, 2, 5, 5), dtype=np.float32)
    out = np.empty((1, 4, 5, 5), np.float32)
    assert ex.execute(h, [x], out=[out])[0] is out
    np.testing.assert_allclose(out, reference(x, w, bias), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ex.execute(h, [np.asfortranarray(x)])[0], reference(x, w, bias), rtol=1e-5, atol=1e-5)
    ex.destroy(h)
    assert all(op.handle is None for op in ops)


@pytest.mark.parametrize("shape, perm", [((2, 3, 4, 5), (0, 2, 3, 1)), ((2, 3, 4, 5), (0, 3, 1, 2)),
                                         ((3, 7), (1, 0)), ((1, 6, 1, 4), (0, 3, 2, 1))])
def test_channel_shuffle_matches_numpy_transpose(shape, perm):
    sd = shuffle_dims(shape, perm)
    assert sd is not None
    x = np.random.default_rng(5).standard_normal(shape, dtype=np.float32)
    want = np.ascontiguousarray(x.transpose(perm))
    op = native.ChannelShuffle(*sd)
    out = np.empty(want.shape, np.float32)
    op.run(x, out)
    np.testing.assert_array_equal(out, want)
    x2 = x + 1
    op.run(x2, out)  # new pointers: set up again
    np.testing.assert_array_equal(out, want + 1)
    assert op.setups == 2
    op.close()
    with pytest.raises(native.XnnpackError, match="deleted"):
        op.run(x, out)


@pytest.mark.parametrize("shape, perm", [((1, 4, 5, 6), (0, 2, 3, 1)), ((2, 6, 4), (0, 2, 1))])
def test_int8_channel_shuffle_matches_numpy_transpose(shape, perm):
    x = np.random.default_rng(6).integers(-128, 128, shape, dtype=np.int8)
    want = np.ascontiguousarray(x.transpose(perm))
    op = native.ChannelShuffle(*shuffle_dims(shape, perm), element_size=1)
    out = np.empty(want.shape, np.int8)
    op.run(x, out)
    np.testing.assert_array_equal(out, want)
    with pytest.raises(native.XnnpackError, match="8-bit"):  # the right bytes, but 16-bit elements
        op.run(x.reshape(-1).view(np.int16), out)
    op.close()
    with pytest.raises(native.XnnpackError, match="1- or 4-byte"):
        native.ChannelShuffle(1, 2, 2, element_size=2)


def test_channel_shuffle_refuses_bad_buffers():
    op = native.ChannelShuffle(1, 3, 4)
    x = np.zeros((3, 4), np.float32)
    for src, dst in [(x, np.zeros((4, 2), np.float32)), (x[:, :2], np.zeros(6, np.float32)),
                     (x.astype(np.float64), np.zeros((4, 3))), (x, x)]:
        with pytest.raises(native.XnnpackError):
            op.run(src, dst)
    ro = np.zeros((4, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(native.XnnpackError, match="read-only"):
        op.run(x, ro)
    op.close()
    with pytest.raises(native.XnnpackError, match="groups"):
        native.ChannelShuffle(1, 1, 4)
    with pytest.raises(native.XnnpackError, match="batch"):
        native.ChannelShuffle(0, 2, 4)


def test_transpose_analysis():
    assert squeeze_perm((1, 128, 1, 256), (2, 1, 0, 3)) == ([128, 256], [0, 1])  # only size-1 dims move
    assert shuffle_dims((1, 3, 224, 224), (0, 2, 3, 1)) == (1, 3, 224 * 224)
    assert shuffle_dims((1, 224, 224, 3), (0, 3, 1, 2)) == (1, 224 * 224, 3)
    assert shuffle_dims((8, 128, 32), (1, 0, 2)) is None  # moves blocks of 32: not a 2-D transpose of elements
    assert shuffle_dims((4, 5, 6), (2, 1, 0)) is None


def test_padded_empty_never_needs_staging():
    for n in (1, 1020, 1021, 1024, 4096, 150528):
        a = native.padded_empty((n,), np.float32)
        end = a.ctypes.data + a.nbytes
        assert a.ctypes.data % 64 == 0 and a.flags.c_contiguous and a.shape == (n,)
        assert (end - 1) // 4096 == (end - 1 + native.EXTRA_BYTES) // 4096


def test_no_reference_to_the_callers_arrays_is_kept():
    import gc
    import weakref

    blob, c = attention_blob()
    ex = XnnpackExecutor(num_threads=1)
    h = ex.init(memoryview(blob), [])
    try:
        x = np.random.default_rng(6).standard_normal((1, S, D), dtype=np.float32)
        outs = [np.empty((S, 1, D), np.float32), np.empty((1, S, S), np.float32)]
        ex.execute(h, [x], out=outs)
        refs = [weakref.ref(a) for a in (x, *outs)]
        del x, outs
        gc.collect()
        assert all(r() is None for r in refs)
        x = np.ones((1, S, D), np.float32)  # new memory, maybe at the old address: still correct
        np.testing.assert_allclose(ex.execute(h, [x])[0], attention_reference(x, c)[0], rtol=1e-4, atol=1e-4)
    finally:
        ex.destroy(h)


def test_schedule_clusters_sides_and_respects_dependencies():
    from edgeport_xnnpack._plan import schedule

    # two independent chains a0 -> a1 -> a2 and b0 -> b1 -> b2, sides alternating N, H, N in blob order
    def node(i: int, o: int) -> XNode:
        return XNode("XNNSoftmax", dict(input_id=i, output_id=o))

    nodes = [node(0, 10), node(1, 20), node(10, 11), node(20, 21), node(11, 12), node(21, 22)]
    sides = ["N", "N", "H", "H", "N", "N"]
    groups = schedule(nodes, sides)
    assert [(s, sorted(idx)) for s, idx in groups] == [("N", [0, 1]), ("H", [2, 3]), ("N", [4, 5])]
    order = [i for _, idx in groups for i in idx]
    produced_at = {o: order.index(j) for j, n in enumerate(nodes) for o in n.outputs()}
    for j, n in enumerate(nodes):
        assert all(produced_at[v] < order.index(j) for v in n.inputs() if v in produced_at)
    # "S" (operator) nodes are one step each, even when adjacent
    assert [s for s, _ in schedule(nodes[:2], ["S", "S"])] == ["S", "S"]


def test_corrupted_attention_blobs_never_crash():
    """Random byte flips and truncations of a blob with host segments and views: ProgramError, or a handle that
    runs (RuntimeExecutionError at worst); never a crash or another exception."""
    from edgeport.errors import ProgramError

    blob, _ = attention_blob()
    ex = XnnpackExecutor(num_threads=1)
    outcomes = {"ok": 0, "error": 0}
    for data in corrupted_blobs(blob, count=300, seed=1, max_flips=6):
        try:
            h = ex.init(memoryview(data), [])
        except ProgramError:
            outcomes["error"] += 1
            continue
        try:
            ex.execute(h, [np.ones(dims, np.float32) for _, dims in h.inputs])
        except RuntimeExecutionError:
            pass
        ex.destroy(h)
        outcomes["ok"] += 1
    assert outcomes["error"] > 50


@pytest.mark.parametrize("mutate, message", [
    (lambda n: n[2].fields.__setitem__("perm", [1, 0, 5]), "permutation|perm"),
    (lambda n: n[3].fields.__setitem__("offsets", [3, 0, 0]), "slice"),
    (lambda n: n[8].fields.__setitem__("input2_id", 8), "inner sizes|matrix"),
])
def test_inconsistent_host_nodes_are_program_errors(mutate, message):
    from edgeport.errors import ProgramError
    from edgeport_xnnpack.schema import read_blob

    blob, _ = attention_blob()
    g, consts = read_blob(memoryview(blob))
    mutate(g.nodes)
    with pytest.raises(ProgramError, match=message):
        XnnpackExecutor(num_threads=1).init(memoryview(serialize(g, bytes(consts))), [])
