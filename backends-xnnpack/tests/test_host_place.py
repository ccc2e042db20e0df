"""``_host_place.absorb_scaled_transposes``: the attention's scaled key transpose moved from the channel shuffle and
a native multiply to the host, where ``HostSegment`` fuses the multiply into the product. Checked on the placement
of a decode step's score nodes, and on whole Hugging Face decoders (the planner's ``place`` followed by it, as a
wrapper where ``_planner`` does not call it) against the program planned without it and against eager PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
from xnn_helpers import DECODE_PROMPT, DECODER_CASES, eager_greedy_tokens, greedy_decode, small_decoder

from edgeport_xnnpack import _host, _plan, _planner
from edgeport_xnnpack._host_place import absorb_scaled_transposes
from edgeport_xnnpack.schema.graph import FP32, TensorValue, XNode

if _host._bmm is None:
    pytest.skip("the _gemm extension has no bmm", allow_module_level=True)


def _scores():
    """The score nodes of one decode step (the medium decoder's delegate, as lowered): K expanded to all heads,
    reshaped, transposed, times the scale, q @ that, plus the mask, softmax."""
    nodes = [
        XNode("XNNStaticReshape", {"num_dims": 3, "new_shape": [8, 128, 64], "input_id": 0, "output_id": 3,
                                   "flags": 0}),
        XNode("XNNStaticTranspose", {"num_dims": 3, "perm": [0, 2, 1], "input_id": 3, "output_id": 4, "flags": 0}),
        XNode("XNNStaticReshape", {"num_dims": 4, "new_shape": [1, 8, 64, 128], "input_id": 4, "output_id": 5,
                                   "flags": 0}),
        XNode("XNNMultiply", {"input1_id": 5, "input2_id": 6, "output_id": 7, "flags": 0}),
        XNode("XNNStaticReshape", {"num_dims": 3, "new_shape": [8, 64, 128], "input_id": 7, "output_id": 8,
                                   "flags": 0}),
        XNode("XNNBatchMatrixMultiply", {"input1_id": 1, "input2_id": 8, "output_id": 9, "flags": 0}),
        XNode("XNNStaticReshape", {"num_dims": 4, "new_shape": [1, 8, 1, 128], "input_id": 9, "output_id": 10,
                                   "flags": 0}),
        XNode("XNNAdd", {"input1_id": 10, "input2_id": 2, "output_id": 11, "flags": 0}),
        XNode("XNNSoftmax", {"input_id": 11, "output_id": 12, "flags": 0}),
    ]
    dims = {0: (1, 2, 4, 128, 64), 1: (8, 1, 64), 2: (1, 1, 1, 128), 3: (8, 128, 64), 4: (8, 64, 128),
            5: (1, 8, 64, 128), 6: (1,), 7: (1, 8, 64, 128), 8: (8, 64, 128), 9: (8, 1, 128), 10: (1, 8, 1, 128),
            11: (1, 8, 1, 128), 12: (1, 8, 1, 128)}
    values = {v: TensorValue(datatype=FP32, dims=list(d), id_out=v) for v, d in dims.items()}
    native = [n.kind not in ("XNNStaticTranspose", "XNNBatchMatrixMultiply") for n in nodes]
    return nodes, native, values, dims


def test_the_scaled_key_transpose_moves_to_the_host():
    nodes, native, values, dims = _scores()
    placed = _plan.place(nodes, native, values, dims, set(), operators=True)
    assert placed.sides[1] == "S" and placed.sides[3] == "N" and placed.sides[5] == "H"  # the planner's choice
    moved = absorb_scaled_transposes(nodes, placed, dims)
    assert moved == [1, 2, 3, 4]
    assert placed.sides[:7] == ["H"] * 7 and placed.sides[7:] == ["N", "N"] and not placed.shuffles
    groups = _plan.schedule(nodes, placed.sides)
    assert [side for side, _ in groups] == ["H", "N"]  # one host step, one native runtime


@pytest.mark.parametrize("change", ["clamped", "tensor scale", "second reader", "first operand"])
def test_other_shapes_of_the_pattern_stay(change):
    nodes, native, values, dims = _scores()
    if change == "clamped":
        nodes[3].output_min_max = (0.0, 6.0)
    elif change == "tensor scale":
        dims[6] = (1, 8, 64, 128)
    elif change == "second reader":  # the scaled keys are also an output of the delegate's native part
        nodes.append(XNode("XNNAdd", {"input1_id": 7, "input2_id": 7, "output_id": 13, "flags": 0}))
        native.append(True)
        dims[13] = dims[7]
        values[13] = values[7]
    else:  # the scaled transpose is the product's first operand
        nodes[5] = XNode("XNNBatchMatrixMultiply", {"input1_id": 8, "input2_id": 1, "output_id": 9, "flags": 0})
    placed = _plan.place(nodes, native, values, dims, set(), operators=True)
    before = list(placed.sides)
    assert absorb_scaled_transposes(nodes, placed, dims) == []
    assert placed.sides == before


def _logits(pte: bytes, threads: int, absorb: bool, moved: list[int], monkeypatch) -> list[np.ndarray]:
    """Prefill + 8 greedy decode steps with the planner calling ``absorb_scaled_transposes`` (counted into
    ``moved``) or not; before ``_planner`` calls it, its ``place`` is wrapped to."""
    from edgeport.runtime import Runtime

    def counting(nodes, placed, dims):
        done = absorb_scaled_transposes(nodes, placed, dims)
        moved.extend(done)
        return done

    real = _planner.place

    def place(nodes, native, values, dims, const, *args, **kw):
        placed = real(nodes, native, values, dims, const, *args, **kw)
        counting(list(nodes), placed, dims)
        return placed

    with monkeypatch.context() as m:
        if hasattr(_planner, "absorb_scaled_transposes"):  # the planner calls it
            m.setattr(_planner, "absorb_scaled_transposes", counting if absorb else (lambda *a: []))
        elif absorb:
            m.setattr(_planner, "place", place)
        method = Runtime.get().load_program(pte).load_method(
            backend_options={"XnnpackBackend": {"num_threads": threads}})
        outs = greedy_decode(method, 8)  # specializations are planned at their first call: inside the context
    return outs


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name, scheme", DECODER_CASES)
def test_decoders_with_the_transpose_on_the_host(monkeypatch, name, scheme, threads):
    model, pte = small_decoder(name, scheme)
    moved: list[int] = []
    new = _logits(pte, threads, True, moved, monkeypatch)
    assert moved, "no transpose moved to the host"
    old = _logits(pte, threads, False, [], monkeypatch)
    for a, b in zip(new, old, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    if scheme is None:
        prompt = DECODE_PROMPT
        tokens = [int(np.argmax(o.reshape(-1, o.shape[-1])[-1])) for o in new]
        assert tokens == eager_greedy_tokens(model, prompt, 9)
