"""Float32 fully connected layers on XNNPACK operators packed once per delegate and shared by every specialization
(``edgeport_xnnpack._fc_ops``).

A Llama-style MLP exported with a dynamic sequence length (1..16) runs at changing lengths on one handle. Oracles:
a fresh load run at each length (bit for bit), the previous path -- the fully connected nodes inside the native
runtimes, every specialization packing its own filters (bit for bit), eager PyTorch (within 1e-4 of the output's
scale). Sharing: one packed operator per node for the handle's life (object identity, and the count of operators
created), closed with the handle. The C glue's operator kind: runs sharing one operator set it up again after one
another, and it refuses bad cells, sizes, overlaps and overlapping calls; the Python path (no glue) does the same.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn
from xnn_helpers import needs_xnnpack

from edgeport import to_edge_transform_and_lower
from edgeport.program import load_pte
from edgeport.testing.architectures import assert_close_to_scale
from edgeport_xnnpack import XnnpackPartitioner, _fc_ops, _native_run
from edgeport_xnnpack._fc_ops import FullyConnected, FullyConnectedStep, PackedFullyConnected
from edgeport_xnnpack.native import XnnpackError
from edgeport_xnnpack.runtime import XnnpackExecutor

pytestmark = [needs_xnnpack]
if not _fc_ops.available():
    pytest.skip("this libXNNPACK has no float32 fully connected operator", allow_module_level=True)

BOUND = 16
WIDTH = 32


class Mlp(nn.Module):
    """``down(silu(gate(x)) * up(x)) + x``, then a head with a fused ReLU (an output range on the node)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(WIDTH, 64, bias=False), nn.Linear(WIDTH, 64, bias=False)
        self.down, self.head = nn.Linear(64, WIDTH), nn.Linear(WIDTH, 40)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(nn.functional.silu(self.gate(x)) * self.up(x)) + x
        return torch.relu(self.head(h))


@functools.cache
def _program() -> tuple[nn.Module, bytes]:
    torch.manual_seed(0)
    model = Mlp().eval()
    seq = torch.export.Dim("seq", min=1, max=BOUND)
    ep = torch.export.export(model, (torch.randn(1, 4, WIDTH),), dynamic_shapes={"x": {1: seq}})
    pte = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    return model, pte


def _init(ex: XnnpackExecutor):
    lp = load_pte(_program()[1])
    assert len(lp.program.execution_plan[0].delegates) == 1
    return ex.init(lp.delegate_data(0, 0), [], named_data=lp.named_data)


def _x(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, n, WIDTH)).astype(np.float32)


def _fc_steps(steps) -> list[FullyConnectedStep]:
    return [s for s in steps if isinstance(s, FullyConnectedStep)]


@pytest.mark.parametrize("threads", [1, 2])
def test_changing_lengths_match_a_fresh_load_and_the_runtime_path(threads, monkeypatch):
    model = _program()[0]
    ex = XnnpackExecutor(num_threads=threads)
    handle = _init(ex)
    monkeypatch.setattr(_fc_ops, "ENABLED", False)
    before = _init(ex)  # the previous path: fully connected nodes inside the runtimes
    monkeypatch.setattr(_fc_ops, "ENABLED", True)
    assert not _fc_steps(before.steps) and len(_fc_steps(handle.steps)) == 4
    try:
        for k, n in enumerate((BOUND, 1, 7, 1, 2, BOUND, 1, 7)):
            x = _x(n, k)
            (got,) = ex.execute(handle, [x])
            out = [np.empty_like(got)]
            assert ex.execute(handle, [x], out=out) is out  # the direct call (a known shape)
            np.testing.assert_array_equal(out[0], got)
            fresh = _init(ex)
            try:
                np.testing.assert_array_equal(got, ex.execute(fresh, [x])[0], err_msg=f"length {n}: fresh load")
            finally:
                ex.destroy(fresh)
            np.testing.assert_array_equal(got, ex.execute(before, [x])[0], err_msg=f"length {n}: runtime path")
            with torch.no_grad():
                assert_close_to_scale(got, model(torch.from_numpy(x)).numpy(), f"length {n}")
    finally:
        ex.destroy(handle)
        ex.destroy(before)


def test_specializations_share_one_packed_operator_per_node(monkeypatch):
    made: list[PackedFullyConnected] = []
    real = _fc_ops.packed_for
    monkeypatch.setattr("edgeport_xnnpack._planner.packed_for", lambda *a: made.append(real(*a)) or made[-1])
    ex = XnnpackExecutor(num_threads=1)
    handle = _init(ex)
    assert len(made) == 4  # one per fully connected node, at load
    declared = {id(s.op.packed) for s in _fc_steps(handle.steps)}
    assert declared == {id(p) for p in made}
    for n in (1, 7, 2, 1):
        ex.execute(handle, [_x(n, n)])
    assert len(made) == 4  # no specialization packed a filter of its own
    plans = list(handle.specializer.cache.values())
    assert len(plans) == 3
    for plan in plans:
        steps = _fc_steps(plan.steps)
        assert {id(s.op.packed) for s in steps} == declared
        rows = plan.inputs[0][1][1]
        assert all(s.op.batch == rows for s in steps)
    ex.destroy(handle)
    assert all(p.handle is None for p in made)  # deleted with the handle
    assert all(s.op.handle is None for s in _fc_steps(plans[0].steps))


def test_python_path_alternates_shapes_like_the_glue(monkeypatch):
    ex = XnnpackExecutor(num_threads=1)
    glued = _init(ex)
    monkeypatch.setattr(_native_run, "_glue", None)
    plain = _init(ex)
    assert all(s.op.glue is None for s in _fc_steps(plain.steps))
    try:
        for k, n in enumerate((1, BOUND, 1, 3, 1, 3)):
            x = _x(n, 10 + k)
            np.testing.assert_array_equal(ex.execute(plain, [x])[0], ex.execute(glued, [x])[0], err_msg=f"length {n}")
    finally:
        ex.destroy(plain)
        ex.destroy(glued)


def _packed(k: int = 24, n: int = 40, seed: int = 0) -> tuple[PackedFullyConnected, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    return PackedFullyConnected(k, n, w, b, -np.inf, np.inf, 0), w, b


@pytest.mark.parametrize("glue", [True, False])
def test_runs_sharing_an_operator_set_it_up_after_one_another(glue, monkeypatch):
    if not glue:
        monkeypatch.setattr(_native_run, "_glue", None)
    elif _native_run._glue is None:
        pytest.skip("the C glue is not built")
    packed, w, b = _packed()
    one, five = FullyConnected(packed, 1), FullyConnected(packed, 5)
    rng = np.random.default_rng(1)
    x1, x5 = rng.standard_normal((1, 24)).astype(np.float32), rng.standard_normal((5, 24)).astype(np.float32)
    y1, y5 = np.empty((1, 40), np.float32), np.empty((5, 40), np.float32)
    results = []
    for run, x, y in ((one, x1, y1), (five, x5, y5), (one, x1, y1), (one, x1, y1), (five, x5, y5)):
        y.fill(np.nan)
        run.run(x, y)
        np.testing.assert_allclose(y, x @ w.T + b, rtol=1e-5, atol=1e-5)
        results.append(y.copy())
    np.testing.assert_array_equal(results[0], results[2])
    np.testing.assert_array_equal(results[1], results[4])
    assert (one.setups, five.setups) == (2, 2)  # the same buffers again, yet set up again after the other run
    with pytest.raises(XnnpackError):
        one.run(x5, y5)  # wrong sizes
    with pytest.raises(XnnpackError):
        one.run(x1, np.empty((1, 39), np.float32))
    overlap = np.zeros(64, np.float32)
    with pytest.raises(XnnpackError, match="overlap"):
        FullyConnected(packed, 1).run(overlap[:24], overlap[10:50])
    packed.close()
    assert one.handle is None and five.handle is None
    with pytest.raises(XnnpackError, match="deleted"):
        one.run(x1, y1)


def test_glue_operator_kind_refuses_bad_cells_and_overlapping_calls():
    glue = _native_run._glue
    if glue is None:
        pytest.skip("the C glue is not built")
    packed, _, _ = _packed()
    run = FullyConnected(packed, 2)
    x, y = np.ones((2, 24), np.float32), np.empty((2, 40), np.float32)
    common = dict(handle=packed.handle, setup=1, run=1, ids=[0, 1], nbytes=[2 * 24 * 4, 2 * 40 * 4],
                  outputs=[False, True], extra=16, page=4096, check=lambda *a: None)
    with pytest.raises(ValueError, match="bytearray"):
        glue.Binding(glue.KIND_OPERATOR, **common, shared=bytearray(8))
    with pytest.raises(ValueError, match="bytearray"):
        glue.Binding(glue.KIND_RUNTIME, **common, shared=bytearray(16))
    with pytest.raises(ValueError, match="an input and an output"):
        glue.Binding(glue.KIND_OPERATOR, **{**common, "outputs": [True, True]})
    packed.cell[8] = 1  # another run of the operator is in progress
    with pytest.raises(XnnpackError, match="already running"):
        run.run(x, y)
    packed.cell[8] = 0
    run.run(x, y)
    assert int.from_bytes(packed.cell[:8], "little") != 0  # this run's mark
    run.close()
    assert int.from_bytes(packed.cell[:8], "little") == 0  # forgotten when closed
    packed.close()
