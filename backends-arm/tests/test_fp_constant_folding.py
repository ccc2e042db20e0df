"""TOSA FP takes subgraphs computed from no graph input (causal masks, rotary tables, position embeddings) into
its delegates and folds them at preprocess (issue 25): the program matches fp32 eager (oracle) on Arm's TOSA
reference model, and a constant that only a CPU op or a graph output reads is not delegated."""

from __future__ import annotations

import numpy as np
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.runtime import Runtime
from edgeport_arm import TosaCompileSpec, TOSAPartitioner


class MaskedRotary(torch.nn.Module):
    """A causal additive mask built from ``arange`` / comparisons / ``where``, rotary ``cos`` / ``sin`` from a
    buffer, a position-id embedding of a buffer, and ``full_like`` of an activation."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.linspace(0.1, 1.0, 4))
        self.register_buffer("position_ids", torch.arange(16).unsqueeze(0))
        self.pos = torch.nn.Embedding(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (1, 6, 8)
        n = x.shape[1]
        i = torch.arange(n)
        mask = torch.where(i[None, :] <= i[:, None], torch.tensor(0.0), torch.tensor(float("-inf")))
        angles = i[:, None].float() * self.inv_freq[None, :]
        rot = torch.cat([angles.cos(), angles.sin()], -1)
        h = x * rot + self.pos(self.position_ids[:, :n]) + torch.full_like(x, 0.5)
        scores = h @ h.transpose(1, 2) + mask
        return torch.softmax(scores, -1) @ h


class ConstantOut(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1.0, torch.arange(4).float().cos()


def _lower(model: torch.nn.Module, x: torch.Tensor) -> tuple[TOSAPartitioner, object]:
    partitioner = TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))
    program = to_edge_transform_and_lower(torch.export.export(model, (x,)), partitioner=[partitioner])
    return partitioner, program.to_executorch()


def test_constant_subgraphs_are_delegated_and_match_eager():
    torch.manual_seed(0)
    model, x = MaskedRotary().eval(), torch.randn(1, 6, 8)
    partitioner, program = _lower(model, x)
    assert not partitioner.rejections, partitioner.rejections
    assert "0 portable kernel calls" in program.delegation_summary(), program.delegation_summary()
    out = Runtime.get().load_program(program.buffer).load_method("forward").execute([x])[0]
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_a_constant_read_only_by_the_output_is_not_delegated():
    x = torch.randn(3, 4)
    partitioner, program = _lower(ConstantOut(), x)
    assert any("cos" in name for name in partitioner.rejections), partitioner.rejections
    got = Runtime.get().load_program(program.buffer).load_method("forward").execute([x])
    np.testing.assert_allclose(np.asarray(got[0]), (x + 1.0).numpy(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got[1]), torch.arange(4).float().cos().numpy(), rtol=1e-6)
