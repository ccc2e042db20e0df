"""Ops of decoders (GPT-2's ``addmm``, RoPE's ``sin`` / ``cos``, RMSNorm's ``pow``) and of segmentation heads
(bilinear / nearest upsampling) on the HTP, against eager PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import edgeport
from edgeport.runtime import Runtime

pytestmark = pytest.mark.usefixtures("requires_qnn")


def _lower_and_run(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]):
    from edgeport_qnn import QnnPartitioner

    p = QnnPartitioner()
    program = edgeport.to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[p])
    outside = [str(n.target) for n in program.exported_program().graph_module.graph.nodes
               if n.op == "call_function" and "getitem" not in str(n.target)
               and "call_delegate" not in str(n.target)]
    method = Runtime.get().load_program(program.to_executorch().buffer).load_method("forward")
    outs = method.execute([x.numpy() for x in inputs])
    with torch.no_grad():
        refs = model(*inputs)
    refs = refs if isinstance(refs, tuple) else (refs,)
    errors = [float(np.abs(o - r.numpy()).max() / max(1.0, float(r.abs().max()))) for o, r in zip(outs, refs)]
    return p, outside, errors


class _Conv1DLike(torch.nn.Module):
    """GPT-2's ``Conv1D``: ``addmm(bias, x, weight)`` with a [in, out] weight."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 24))
        self.bias = torch.nn.Parameter(torch.randn(24))
        self.small_bias = torch.nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        constant_weight = torch.addmm(self.bias, x, self.weight)
        computed_weight = torch.addmm(self.small_bias, x, y)  # mat2 computed: MatMul + Add
        return constant_weight, computed_weight


def test_addmm_constant_and_computed_operands():
    torch.manual_seed(0)
    p, outside, errors = _lower_and_run(_Conv1DLike(), (torch.randn(5, 16), torch.randn(16, 4)))
    assert p.rejections == {} and outside == []
    assert max(errors) <= 1e-5, errors


class _RotaryAndNorm(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        angles = x * 0.5
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return torch.sin(angles), torch.cos(angles), x * rms, x.abs().pow(3), (x.abs() + 1).pow(0.5), \
            (x.abs() + 1).pow(-0.5), (x.abs() + 1).pow(-1), torch.reciprocal(x.abs() + 0.5), torch.sign(x) * x


def test_sin_cos_sign_reciprocal_and_small_integer_or_half_powers():
    torch.manual_seed(0)
    p, outside, errors = _lower_and_run(_RotaryAndNorm(), (torch.randn(2, 8, 32) * 3,))
    assert p.rejections == {} and outside == []
    assert max(errors) <= 1e-5, errors


def test_other_powers_are_refused_at_partition_time_with_the_reason():
    class Pow(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x.abs() + 1).pow(1.7)

    p, outside, errors = _lower_and_run(Pow(), (torch.randn(4, 4),))
    assert outside == ["aten.pow.Tensor_Scalar"] and max(errors) <= 1e-6
    assert any("exponent 1.7" in reason for reason in p.rejections.values()), p.rejections


class _Upsample(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        f = torch.nn.functional.interpolate
        return (f(x, scale_factor=2, mode="bilinear", align_corners=False),
                f(x, size=(9, 7), mode="bilinear", align_corners=True),
                f(x, size=(13, 11), mode="bilinear", align_corners=False),
                f(x, scale_factor=3, mode="nearest"))


def test_bilinear_and_nearest_upsampling():
    torch.manual_seed(0)
    p, outside, errors = _lower_and_run(_Upsample(), (torch.randn(1, 3, 5, 6),))
    assert p.rejections == {} and outside == []
    assert max(errors) <= 1e-5, errors


class _SplitAndExpand(torch.nn.Module):
    def forward(self, x: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v = x.split([8, 8, 16], dim=-1)  # GPT-2's query / key / value split
        return q * 2, k + 1, v.relu(), kv.expand(3, 2, 5, 4) * 1.5, kv[0].expand(2, 2, 5, 4) + 1


def test_split_and_broadcasting_expand():
    torch.manual_seed(0)
    p, outside, errors = _lower_and_run(_SplitAndExpand(), (torch.randn(2, 5, 32), torch.randn(1, 2, 5, 4)))
    assert p.rejections == {} and outside == []
    assert max(errors) == 0.0, errors
