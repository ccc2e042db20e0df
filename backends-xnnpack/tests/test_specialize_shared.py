"""Specializations reuse what a delegate's planner derives from its nodes alone (``_planner.Planner``: each node's
inputs and outputs, the schedule of a placement, the padded copies of constants native runtimes read in place;
``Specializer.node_outputs``; ``XNode.inputs`` / ``outputs`` on per-kind field names). Checked against the same
program planned with every cache emptied before each plan (the path before the caches), bit for bit, on Hugging
Face decoders (a prefill shorter than the declared one and decode steps are both specializations), and against
eager PyTorch."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from xnn_helpers import DECODER_CASES, eager_greedy_tokens, forget_planning, greedy_decode, small_decoder

from edgeport_xnnpack import _copies, _plan, _planner, _specialize, native
from edgeport_xnnpack._plan import schedule
from edgeport_xnnpack.schema.graph import CAT_INPUTS, INPUT_FIELDS, INVALID_ID, NODE_KINDS, OUTPUT_FIELDS, XNode, \
    node_layout

PROMPT = [1, 17, 42, 9, 100, 5, 77]


def _old_inputs(n: XNode) -> list[int]:  # XNode.inputs as it was written before the per-kind names
    names = [f for f, _ in node_layout(n.kind) if f in INPUT_FIELDS]
    if n.kind in CAT_INPUTS:
        names = [f"input{i + 1}_id" for i in range(CAT_INPUTS[n.kind])]
    return [n.get(f) for f in names if n.get(f) != INVALID_ID]


def _old_outputs(n: XNode) -> list[int]:
    return [n.get(f) for f, _ in node_layout(n.kind) if f in OUTPUT_FIELDS]


def test_node_ids_match_the_layout_reading():
    rng = random.Random(0)
    for kind, _ in NODE_KINDS:
        for _ in range(20):
            fields = {}
            for f, _ in node_layout(kind):
                r = rng.random()
                if r < 0.2:
                    continue  # missing: reads as 0
                fields[f] = None if r < 0.3 else INVALID_ID if r < 0.45 else rng.randrange(50)
            n = XNode(kind, fields)
            assert n.inputs() == _old_inputs(n) and n.outputs() == _old_outputs(n), (kind, fields)
        n.fields[next(iter(node_layout(kind)))[0]] = 7  # a rewritten field is read again (nothing is cached)
        assert n.inputs() == _old_inputs(n) and n.outputs() == _old_outputs(n)


def test_native_argument_fast_paths_refuse_what_they_did():
    assert native._dims((1, 32, 512)) == [1, 32, 512]
    assert native._dims([np.int64(3), 4]) == [3, 4]
    assert list(native._size_array([2, 3, 5])) == [2, 3, 5] and len(native._size_array([])) == 1
    assert list(native._size_array(list(range(1, 11)))) == list(range(1, 11))
    for bad in ((1, -1), (True, 2), (1 << 31,), (1,) * (native.MAX_TENSOR_DIMS + 1)):
        with pytest.raises(native.XnnpackError):
            native._dims(bad)
    assert native._u32(5, "x") == 5 and native._u32(np.uint32(7), "x") == 7
    for bad in (True, -1, 1 << 32, 1.0):
        with pytest.raises(native.XnnpackError):
            native._u32(bad, "x")


def _run(pte: bytes, fresh: bool, monkeypatch, seen: dict) -> list[np.ndarray]:
    """Prefill + 6 greedy decode steps (each a new specialization of every delegate); ``fresh``: every planner
    cache emptied before each plan and ``infer_dims`` reading the nodes' outputs itself (the uncached path)."""
    from edgeport.runtime import Runtime

    real_plan, real_infer, real_padded = _planner.Planner.plan, _specialize.infer_dims, _planner._padded_copy

    def plan(self, *args, **kw):
        if fresh:
            forget_planning(self)
        out = real_plan(self, *args, **kw)
        seen.setdefault(id(self), []).append((self, id(self.node_io()), len(self._groups)))
        return out

    def padded_copy(a):
        seen["padded_copies"] = seen.get("padded_copies", 0) + 1
        return real_padded(a)

    with monkeypatch.context() as m:
        m.setattr(_planner.Planner, "plan", plan)
        m.setattr(_planner, "_padded_copy", padded_copy)
        if fresh:
            m.setattr(_specialize, "infer_dims", lambda nodes, declared, given, outputs=None, rules=None:
                      real_infer(nodes, declared, given))
        method = Runtime.get().load_program(pte).load_method(backend_options={"XnnpackBackend": {"num_threads": 1}})
        outs = greedy_decode(method, 6, PROMPT)
    return outs


@pytest.mark.parametrize("name, scheme", DECODER_CASES)
def test_specializations_with_shared_facts_are_bit_identical(monkeypatch, name, scheme):
    model, pte = small_decoder(name, scheme)
    shared: dict = {}
    new = _run(pte, False, monkeypatch, shared)
    old = _run(pte, True, monkeypatch, {})
    for a, b in zip(new, old, strict=True):
        np.testing.assert_array_equal(a, b)

    planners = [v for k, v in shared.items() if k != "padded_copies"]
    assert any(len(calls) >= 3 for calls in planners)  # the load's plan, the prefill's and the decode's
    for calls in planners:
        assert len({io for _, io, _ in calls}) == 1  # one list of node inputs / outputs per delegate
        assert calls[-1][2] <= len(calls)  # at most one schedule per plan, kept
        planner = calls[0][0]
        for sides, groups in planner._groups.items():  # each kept schedule is the one its placement gives
            assert groups == schedule(planner.g.nodes, list(sides), planner.node_io())
    # each padded constant copied once per delegate, however many plans define it
    padded = sum(len(calls[0][0]._padded) for calls in planners)
    assert shared.get("padded_copies", 0) == padded

    if scheme is None:
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT])).logits.numpy()
        tokens = [int(np.argmax(o.reshape(-1, o.shape[-1])[-1])) for o in new]
        assert tokens == eager_greedy_tokens(model, PROMPT, 7)
        np.testing.assert_allclose(new[0].reshape(-1, logits.shape[-1])[-1], logits[0, -1], rtol=1e-3, atol=1e-3)
