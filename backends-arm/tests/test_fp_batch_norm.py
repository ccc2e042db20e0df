"""Float batch norm on TOSA FP (issue 25): ``_native_batch_norm_legit_no_training`` becomes MUL + ADD with folded
constants; the delegated program matches fp32 eager (oracle) on Arm's TOSA reference model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.runtime import Runtime
from edgeport_arm import TosaCompileSpec, TOSAPartitioner

BN = "aten._native_batch_norm_legit_no_training.default"


class ConvBN(torch.nn.Module):
    """BN after a conv (NHWC inside the delegate), BN of an NCHW input, BN1d on (N, C) and (N, C, L)."""

    def __init__(self, affine: bool) -> None:
        super().__init__()
        self.bn_in = torch.nn.BatchNorm2d(3, affine=affine)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8, eps=1e-3, affine=affine)
        self.bn1 = torch.nn.BatchNorm1d(8, affine=affine)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn(self.conv(self.bn_in(x))))
        return y, self.bn1(y.mean((2, 3))) + self.bn1(y.flatten(2)).sum(2)


def _randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) * 2 + 0.1)
            if m.affine:
                m.weight.data.copy_(torch.randn(m.num_features, generator=gen))
                m.bias.data.copy_(torch.randn(m.num_features, generator=gen))
    return model.eval()


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_is_delegated_and_matches_eager(affine):
    torch.manual_seed(0)
    model = _randomized(ConvBN(affine), 1)
    x = torch.randn(1, 3, 6, 7)
    partitioner = TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))
    program = to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                          partitioner=[partitioner]).to_executorch()
    assert not any(BN in why for why in partitioner.rejections.values()), partitioner.rejections
    assert "batch_norm" not in program.delegation_summary()
    outs = Runtime.get().load_program(program.buffer).load_method("forward").execute([x])
    with torch.no_grad():
        want = model(x)
    for got, ref in zip(outs, want):
        ref = ref.numpy()
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


def test_float_batch_norm_in_an_integer_profile_stays_on_the_cpu_with_the_reason():
    model, x = _randomized(ConvBN(True), 1), torch.randn(1, 3, 6, 7)
    partitioner = TOSAPartitioner(TosaCompileSpec("TOSA-1.0+INT"))
    program = to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                          partitioner=[partitioner]).to_executorch()
    assert any(why.startswith(f"{BN}: no int8 lowering of a batch norm") for why in partitioner.rejections.values())
    out = Runtime.get().load_program(program.buffer).load_method("forward").execute([x])[0]
    with torch.no_grad():
        np.testing.assert_allclose(np.asarray(out), model(x)[0].numpy(), rtol=1e-5, atol=1e-5)
