"""Preprocess's graph-level rewrites in isolation: view-plan factoring, dead-node pruning, native/host grouping,
and the op-by-op fallback when a view chain cannot be factored (checked against eager on both runtimes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from xnn_helpers import (
    RTOL,
    delegate_count,
    eager,
    lower_edgeport,
    needs_xnnpack,
    rel_err,
    run_edgeport,
    run_executorch,
)

from edgeport_xnnpack.preprocess import passes, views
from edgeport_xnnpack.schema.graph import FP32, ConstantDataOffset, Graph, TensorValue, XNode


def _check_plan(idx: np.ndarray, n_src: int) -> views.Plan:
    p = views.plan(idx, n_src)
    assert p is not None
    src = np.arange(n_src).reshape(p.shape)
    got = src[tuple(slice(o, o + s) for o, s in zip(p.offsets, p.sizes, strict=True))].transpose(p.perm)
    assert np.array_equal(got.reshape(idx.shape), idx)
    return p


def test_plan_factors_permute_reshape_and_slice_chains():
    a = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    p = _check_plan(a.transpose(0, 2, 1, 3), a.size)
    assert p.shape == (2, 3, 4, 5) and p.perm == [0, 2, 1, 3]
    p = _check_plan(a.transpose(2, 0, 1, 3).transpose(1, 2, 0, 3), a.size)  # identity
    assert p.perm == sorted(p.perm) and p.sizes == list(p.shape)
    p = _check_plan(np.arange(12).reshape(1, 3, 4).transpose(1, 0, 2), 12)  # moves a size-1 dim only
    assert [a for a in p.perm if p.sizes[a] > 1] == sorted(a for a in p.perm if p.sizes[a] > 1)
    qkv = np.arange(6 * 24).reshape(6, 3, 2, 4)  # rows x (q, k, v) x heads x head dim
    p = _check_plan(qkv[:, 1].transpose(1, 0, 2), qkv.size)  # k, heads first: one slice + one transpose
    assert p.shape == (6, 6, 4) and p.offsets == [0, 2, 0] and p.sizes == [6, 2, 4] and p.perm == [1, 0, 2]
    _check_plan(np.arange(24).reshape(4, 6)[:, 1:4].reshape(12), 24)


def test_plan_refuses_a_gather():
    assert views.plan(np.array([0, 2, 1, 3, 5, 4]), 6) is None


def _graph(kinds: list[tuple[str, list[int], int]], n_values: int, outputs: list[int], constants=()) -> Graph:
    g = Graph()
    for i in range(n_values):
        g.values.append(TensorValue(FP32, [4], i))
    for vid in constants:
        g.constant_data.append(ConstantDataOffset(16 * len(g.constant_data), 16))
        g.values[vid].constant_buffer_idx = len(g.constant_data) - 1
    for kind, ins, out in kinds:
        fields = ({"input_id": ins[0]} if len(ins) == 1 else {"input1_id": ins[0], "input2_id": ins[1]})
        g.nodes.append(XNode(kind, {**fields, "output_id": out, "flags": 0}))
    g.input_ids, g.output_ids = [0], outputs
    g.values[0].flags, g.values[0].external_id = 1, 0
    for k, o in enumerate(outputs):
        g.values[o].flags, g.values[o].external_id = 2, 1 + k
    g.num_externs = 1 + len(outputs)
    return g


def test_prune_drops_dead_nodes_values_and_constant_data():
    # 0 -> add(0, c5) -> 1 (dead) ; 0 -> sigmoid -> 2 ; 2 -> mul(2, c6) -> 3 (output)
    g = _graph([("XNNAdd", [0, 5], 1), ("XNNSigmoid", [0], 2), ("XNNMultiply", [2, 6], 3)], 7, [3],
               constants=(5, 6))
    data = bytearray(b"a" * 16 + b"b" * 16)
    g.constant_data = [ConstantDataOffset(), ConstantDataOffset(0, 16), ConstantDataOffset(16, 16)]
    g.values[5].constant_buffer_idx, g.values[6].constant_buffer_idx = 1, 2
    new = passes.prune(g, data)
    assert [n.kind for n in g.nodes] == ["XNNSigmoid", "XNNMultiply"]
    assert [v.id_out for v in g.values] == list(range(len(g.values))) and len(g.values) == 4
    assert bytes(new) == b"b" * 16 and len(g.constant_data) == 2
    mul = g.nodes[1]
    assert g.values[mul.get("input2_id")].constant_buffer_idx == 1
    assert g.output_ids == [mul.get("output_id")]


def test_schedule_groups_native_and_host_nodes():
    # two independent chains: transpose (host) -> sigmoid (native), each; blob order alternates
    g = _graph([("XNNStaticTranspose", [0], 1), ("XNNSigmoid", [1], 2), ("XNNStaticTranspose", [0], 3),
                ("XNNSigmoid", [3], 4), ("XNNAdd", [2, 4], 5)], 6, [5])
    passes.schedule(g)
    kinds = [n.kind for n in g.nodes]
    assert kinds == ["XNNStaticTranspose", "XNNStaticTranspose", "XNNSigmoid", "XNNSigmoid", "XNNAdd"]


class HeadSplit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(6)
        self.fc = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.fc(x).reshape(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
        q, k, v = (z.reshape(4, 5, 8) for z in (q, k, v))
        att = torch.softmax(torch.bmm(q * 0.3, k.transpose(1, 2)), dim=-1)
        return torch.bmm(att, v).reshape(2, 2, 5, 8).permute(0, 2, 1, 3).reshape(2, 5, 16)


@needs_xnnpack
@pytest.mark.executorch
def test_unfactorable_views_fall_back_to_op_by_op(monkeypatch):
    model, args = HeadSplit().eval(), (torch.randn(2, 5, 16),)
    ref = eager(model, args)
    folded = lower_edgeport(model, args)[1]
    monkeypatch.setattr(views, "plan", lambda idx, n: None)
    edge, buffer, partitioner = lower_edgeport(model, args)
    assert delegate_count(edge) == 1, partitioner.rejections
    assert buffer != folded
    for out in (run_edgeport(buffer, args), run_edgeport(folded, args)):
        assert rel_err(out, ref) <= RTOL
    pytest.importorskip("executorch")
    for buf in (buffer, folded):
        assert rel_err(run_executorch(buf, args), ref) <= RTOL
