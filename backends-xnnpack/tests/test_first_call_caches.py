"""What makes an LLM's first decode call (a specialization of every delegate) cheaper, each against the path
without it: copy-run tables kept by segment structure and dims (``_copies``), layouts shared by delegates of one
structure (``_plan.structure_token`` / ``known_layout``), shape rules read once per node (``_infer.node_rules``),
and the executor's buffers sharing one arena by lifetime (``_arena.arena_buffers``). Outputs are compared bit
for bit with the same program planned with every such cache emptied and every shortcut off, and with numpy /
eager PyTorch; cases where a cache must not be reused (other dims, other parameters, another structure) are
checked to plan afresh."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from xnn_helpers import DECODER_CASES, eager_greedy_tokens, forget_planning, greedy_decode, small_decoder

from edgeport_xnnpack import _arena, _copies, _host, _infer, _plan, _planner, _specialize, native
from edgeport_xnnpack._native_run import _near_page_end
from edgeport_xnnpack.schema.graph import XNode

PROMPT = [1, 17, 42, 9, 100, 5, 77]


# -- copy-run tables ----------------------------------------------------------------------------------------------

def _moves(shift: int = 0, batch: int = 2, offset: int = 2):
    """A data-moving segment (head split, rotary half, concatenation, transposed output); ids + ``shift``."""
    s = shift
    nodes = [
        XNode("XNNStaticTranspose", {"num_dims": 4, "perm": [0, 2, 1, 3], "input_id": 1 + s, "output_id": 2 + s,
                                     "flags": 0}),
        XNode("XNNStaticSlice", {"num_dims": 4, "offsets": [0, 0, 0, offset], "sizes": [batch, 8, 3, 3],
                                 "input_id": 2 + s, "output_id": 3 + s, "flags": 0}),
        XNode("XNNStaticReshape", {"num_dims": 3, "new_shape": [batch, 8, 9], "input_id": 3 + s, "output_id": 4 + s,
                                   "flags": 0}),
        XNode("XNNConcatenate2", {"axis": 2, "input1_id": 4 + s, "input2_id": 5 + s, "output_id": 6 + s,
                                  "flags": 0}),
        XNode("XNNStaticReshape", {"num_dims": 2, "new_shape": [batch * 8, 18], "input_id": 6 + s,
                                   "output_id": 7 + s, "flags": 0}),
    ]
    shapes = {1: (batch, 3, 8, 6), 2: (batch, 8, 3, 6), 3: (batch, 8, 3, 3), 4: (batch, 8, 9), 5: (batch, 8, 9),
              6: (batch, 8, 18), 7: (batch * 8, 18)}
    return nodes, {k + s: v for k, v in shapes.items()}, {2 + s, 7 + s}


def _segment(nodes, shapes, materialize):
    ops = [_host.make_host_op(n, [shapes[i] for i in n.inputs()], shapes[n.outputs()[0]]) for n in nodes]
    return _host.HostSegment(nodes, ops, set(materialize), shapes.__getitem__)


def _check_runs_like_numpy(seg, shapes, seed: int) -> None:
    """The segment's copy runs write what its numpy program writes."""
    reads, writes = seg.io
    rng = np.random.default_rng(seed)
    src = {v: rng.standard_normal(shapes[v]).astype(np.float32) for v in reads}
    fast = {**src, **{v: np.full(shapes[v], 7.0, np.float32) for v in writes}}
    slow = {**src, **{v: np.full(shapes[v], 7.0, np.float32) for v in writes}}
    assert seg.copies is not None and seg.copies.run([fast[v] for v in (*reads, *writes)])
    for step in seg.program:
        step(slow)
    for v in writes:
        np.testing.assert_array_equal(fast[v], slow[v])


@pytest.mark.skipif(_copies._run is None, reason="the copy-runs kernel is not built")
def test_copy_tables_are_shared_by_structure_and_dims_only():
    _copies.clear_memo()
    nodes, shapes, mat = _moves()
    first = _segment(nodes, shapes, mat)
    # the same structure under other value ids (the next layer): the same table, not planned again
    nodes2, shapes2, mat2 = _moves(shift=100)
    again = _segment(nodes2, shapes2, mat2)
    assert again.copies is first.copies
    _copies.clear_memo()
    fresh = _segment(nodes2, shapes2, mat2)  # planned from scratch: the oracle of the kept table
    assert fresh.copies is not first.copies
    np.testing.assert_array_equal(fresh.copies.table, first.copies.table)
    _check_runs_like_numpy(again, shapes2, 1)
    # other dims, other parameters: planned afresh, and each right
    for other in (_moves(shift=100, batch=3), _moves(shift=100, offset=1)):
        seg = _segment(*other)
        assert seg.copies is not first.copies
        assert seg.copies.table.tobytes() != first.copies.table.tobytes()
        _check_runs_like_numpy(seg, other[1], 2)
    _copies.clear_memo()


def test_copy_table_keys_tell_structures_apart():
    nodes, shapes, _ = _moves()
    key = _copies.signature(nodes, [1, 5], [2, 7], shapes.__getitem__)
    nodes2, shapes2, _ = _moves(shift=40)
    assert _copies.signature(nodes2, [41, 45], [42, 47], shapes2.__getitem__) == key
    assert _copies.signature(nodes, [5, 1], [2, 7], shapes.__getitem__) != key  # reads in another order
    assert _copies.signature(nodes, [1, 5], [7, 2], shapes.__getitem__) != key
    wider = {**shapes, 5: (2, 8, 10)}
    assert _copies.signature(nodes, [1, 5], [2, 7], wider.__getitem__) != key
    clamped = [XNode(n.kind, dict(n.fields), output_min_max=(0.0, 1.0)) if i == 3 else n for i, n in enumerate(nodes)]
    assert _copies.signature(clamped, [1, 5], [2, 7], shapes.__getitem__) != key


# -- shape rules --------------------------------------------------------------------------------------------------

def _shape_cases():
    two = {"input1_id": 0, "input2_id": 1, "output_id": 9, "flags": 0}
    one = {"input_id": 0, "output_id": 9, "flags": 0}
    nodes = [
        XNode("XNNAdd", dict(two)), XNode("XNNMultiply", dict(two)), XNode("XNNSigmoid", dict(one)),
        XNode("XNNSoftmax", dict(one)), XNode("XNNCopy", dict(one)),
        XNode("XNNStaticReshape", {**one, "new_shape": [0, 4, 8]}),
        XNode("XNNStaticReshape", {**one, "new_shape": [1, 0, 0]}),
        XNode("XNNStaticReshape", {**one, "new_shape": [2, 32]}),
        XNode("XNNStaticReshape", {**one, "new_shape": [4, 0]}),
        XNode("XNNStaticReshape", {**one, "new_shape": []}),  # an older blob: the declared dims
        XNode("XNNStaticTranspose", {**one, "perm": [0, 2, 1]}),
        XNode("XNNStaticTranspose", {**one, "perm": [1, 0]}),
        XNode("XNNStaticTranspose", {**one, "perm": [0, 0, 1]}),
        XNode("XNNStaticTranspose", {**one, "perm": ["x"]}),  # malformed
        XNode("XNNStaticSlice", {**one, "offsets": [0, 1, 0], "sizes": [1, 0, 4]}),
        XNode("XNNStaticSlice", {**one, "offsets": [0, 9, 0], "sizes": [1, 2, 4]}),
        XNode("XNNStaticSlice", {**one, "offsets": [0], "sizes": [1]}),
        XNode("XNNConcatenate2", {"input1_id": 0, "input2_id": 1, "output_id": 9, "axis": 1, "flags": 0}),
        XNode("XNNBatchMatrixMultiply", dict(two)),
        XNode("XNNArgMaxPooling2d", dict(one)),
        XNode("XNNStaticReshape", {"input_id": 0, "output_id": 99, "new_shape": [0]}),  # undeclared output
    ]
    shapes = [(1, 7, 4), (1, 1, 4), (1, 7, 1), (2, 3, 4), (7, 4), (1, 3, 1, 4), (4,)]
    return nodes, shapes


def test_node_rules_give_output_dims_results_and_errors():
    nodes, shapes = _shape_cases()
    declared = {0: (1, 8, 4), 1: (1, 8, 4), 9: (1, 8, 4, 8)}
    for node in nodes:
        rule = _infer.node_rules([node], declared)[0]
        for a, b in itertools.product(shapes, repeat=2):
            dims = {0: a, 1: b}
            try:
                want = _infer.output_dims(node, dims.__getitem__, declared)
            except Exception as exc:  # noqa: BLE001 - the rule must fail the same way
                with pytest.raises(type(exc)):
                    rule(dims.__getitem__)
                continue
            assert rule(dims.__getitem__) == want, (node.kind, node.fields, a, b)


def test_infer_dims_with_rules_matches_and_fails_the_same_way():
    n = [XNode("XNNStaticReshape", {"input_id": 0, "output_id": 1, "new_shape": [0, 32]}),
         XNode("XNNStaticTranspose", {"input_id": 1, "output_id": 2, "perm": [1, 0]}),
         XNode("XNNAdd", {"input1_id": 2, "input2_id": 3, "output_id": 4})]
    declared = {0: (1, 8, 32), 1: (8, 32), 2: (32, 8), 3: (32, 1), 4: (32, 8)}
    rules = _infer.node_rules(n, declared)
    for rows in (1, 3, 8):
        given = {0: (1, rows, 32)}
        assert _infer.infer_dims(n, declared, given, rules=rules) == _infer.infer_dims(n, declared, given)
    bad = {**declared, 3: (5, 1)}
    with pytest.raises(_infer.ShapeError, match=r"xnodes\[2\] \(XNNAdd\): shapes \[32, 3\] and \[5, 1\]"):
        _infer.infer_dims(n, bad, {0: (1, 3, 32)}, rules=_infer.node_rules(n, bad))


# -- the executor's buffers ---------------------------------------------------------------------------------------

def test_arena_buffers_keep_padded_empty_s_guarantees_and_share_only_across_lifetimes():
    rng = np.random.default_rng(0)
    dts = (np.float32, np.int8, np.float32, np.int32)
    specs = {i: (tuple(int(d) for d in rng.integers(1, 40, size=rng.integers(1, 4))), dts[i % 4]) for i in range(120)}
    specs.update({120: ((0,), np.float32), 121: ((1021,), np.float32), 122: ((1,), np.int8), 123: ((5000,), np.float32)})
    lifetimes = {v: tuple(sorted(int(t) for t in rng.integers(0, 30, size=2))) for v in specs}
    out = _arena.arena_buffers(specs, lifetimes)
    assert set(out) == set(specs)
    placed = []
    for v, (shape, dt) in specs.items():
        a = out[v]
        assert a.shape == shape and a.dtype == dt and a.flags.c_contiguous and a.flags.writeable
        start = a.ctypes.data
        if a.nbytes:  # (an empty array's address is numpy's choice, as with padded_empty)
            assert start % 64 == 0 and not _near_page_end(start + a.nbytes)
            placed.append((start, start + a.nbytes + native.EXTRA_BYTES, *lifetimes[v]))  # its padding included
    for i, (s0, e0, f0, l0) in enumerate(placed):
        for s1, e1, f1, l1 in placed[i + 1:]:
            if f0 <= l1 and f1 <= l0:  # both live at some step: no byte in common
                assert e0 <= s1 or e1 <= s0
    # each value written with a distinct pattern in lifetime order reads back intact until its last step
    for step in range(30):
        for v in specs:
            if lifetimes[v][0] == step:
                out[v].reshape(-1).view(np.uint8)[...] = v % 251
        for v in specs:
            if lifetimes[v][0] <= step <= lifetimes[v][1]:
                assert (out[v].reshape(-1).view(np.uint8) == v % 251).all()


def test_arena_reuses_memory_of_values_that_are_dead():
    # a chain: value i written by step i, read by step i + 1 -- two buffers' worth of memory, not ten
    specs = {i: ((1000,), np.float32) for i in range(10)}
    lifetimes = _arena.spans([([i - 1] if i else [], [i]) for i in range(10)] + [([9], [])], specs)
    assert lifetimes == {i: (i, i + 1) for i in range(10)}
    offsets, total = _arena.place({v: 4000 for v in specs}, lifetimes)
    assert len(set(offsets.values())) == 2 and total < 3 * 4000
    # a view made by a reshape step keeps the value it views alive over its own span
    spans = _arena.spans([([], [0]), ([0], [1]), ([1], [2]), ([2], [3])], {0, 1, 2, 3}, {1: 0})
    assert spans == {0: (0, 2), 2: (2, 3), 3: (3, 3)}


# -- layouts shared by delegates of one structure ------------------------------------------------------------------

def test_structure_tokens_ignore_constant_bytes_only():
    from edgeport_xnnpack.schema.graph import FP32, TensorValue

    def token(weight: np.ndarray, new_shape=(4, 8), debug=0, scale_dims=(1,)):
        values = {0: TensorValue(FP32, [32], 0, external_id=0, flags=1),
                  1: TensorValue(FP32, list(weight.shape), 1, constant_buffer_idx=3),
                  2: TensorValue(FP32, list(new_shape), 2, external_id=1, flags=2),
                  3: TensorValue(FP32, list(scale_dims), 3, constant_buffer_idx=4)}
        nodes = [XNode("XNNStaticReshape", {"input_id": 0, "output_id": 2, "new_shape": list(new_shape)},
                       debug_handle=debug)]
        return _plan.structure_token(nodes, values, {1: weight, 3: np.ones(scale_dims, np.float32)}, ("x", 1))

    w = np.zeros((4, 8), np.float32)
    base = token(w)
    assert token(np.ones((4, 8), np.float32)) == base  # other weights, same structure
    assert token(w, debug=5) == base  # debug handles do not change what is planned
    assert token(np.zeros((8, 4), np.float32)) != base  # a constant of another shape
    assert token(w.astype(np.float16)) != base  # ... or dtype
    assert token(w, new_shape=(8, 4)) != base  # other parameters
    assert token(w, scale_dims=(1, 1)) != base


def _run(pte: bytes, fresh: bool, monkeypatch, stats: dict) -> list[np.ndarray]:
    """Prefill + 6 greedy decode steps. ``fresh``: every kept layout, copy table and planner cache emptied before
    each plan, shape inference without rules, each buffer its own ``padded_empty`` (the path before the caches);
    else counts how often a kept layout / copy table served a plan."""
    from edgeport.runtime import Runtime

    real_plan, real_infer, real_known = _planner.Planner.plan, _specialize.infer_dims, _planner.known_layout
    real_copies = _copies._plan

    def plan(self, *args, **kw):
        if fresh:
            forget_planning(self)
        return real_plan(self, *args, **kw)

    def known(key):
        layout = real_known(key)
        stats["layout_hits"] = stats.get("layout_hits", 0) + (layout is not None)
        return layout

    def copies(*args):
        stats["copy_plans"] = stats.get("copy_plans", 0) + 1
        return real_copies(*args)

    with monkeypatch.context() as m:
        m.setattr(_planner.Planner, "plan", plan)
        m.setattr(_copies, "_plan", copies)
        if fresh:
            m.setattr(_specialize, "infer_dims", lambda nodes, declared, given, outputs=None, rules=None:
                      real_infer(nodes, declared, given))
            m.setattr(_planner, "arena_buffers", lambda specs, lifetimes: {v: native.padded_empty(s, d)
                                                                            for v, (s, d) in specs.items()})
        else:
            m.setattr(_planner, "known_layout", known)
        method = Runtime.get().load_program(pte).load_method(backend_options={"XnnpackBackend": {"num_threads": 1}})
        outs = greedy_decode(method, 6, PROMPT)
    return outs


@pytest.mark.parametrize("name, scheme", DECODER_CASES)
def test_first_call_caches_are_bit_identical_to_planning_afresh(monkeypatch, name, scheme):
    model, pte = small_decoder(name, scheme)
    _plan.clear_layouts()
    _copies.clear_memo()
    stats: dict = {}
    new = _run(pte, False, monkeypatch, stats)
    assert stats.get("layout_hits", 0) >= 1  # the second layer's attention took the first one's layout
    # a second load in the same process plans nothing it already planned: every layout and table is kept
    again_stats: dict = {}
    again = _run(pte, False, monkeypatch, again_stats)
    assert again_stats.get("copy_plans", 0) == 0 and again_stats["layout_hits"] > stats["layout_hits"]
    old = _run(pte, True, monkeypatch, {})
    for a, b, c in zip(new, again, old, strict=True):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, c)
    if scheme is None:
        tokens = [int(np.argmax(o.reshape(-1, o.shape[-1])[-1])) for o in new]
        assert tokens == eager_greedy_tokens(model, PROMPT, 7)


def test_another_structure_in_the_same_process_plans_afresh(monkeypatch):
    """Two decoders of other sizes loaded one after the other: the second one's outputs are those it gives alone
    (no layout or table of the first one is taken for it)."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from edgeport.llm import export_decoder
    from edgeport.testing.decoders import DECODERS

    small = export_decoder(DECODERS["llama"](size="small"), max_seq_len=16, max_context_len=32).manager.buffer
    other = export_decoder(DECODERS["llama"](seed=1, size="small"), max_seq_len=8, max_context_len=24).manager.buffer
    alone = _run(other, True, monkeypatch, {})
    _plan.clear_layouts()
    _copies.clear_memo()
    _run(small, False, monkeypatch, {})
    kept = set(_plan._LAYOUTS)
    after = _run(other, False, monkeypatch, {})
    for a, b in zip(after, alone, strict=True):
        np.testing.assert_array_equal(a, b)
    assert set(_plan._LAYOUTS) - kept  # the second program's layouts are its own
