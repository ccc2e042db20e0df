"""Bilinear upsampling on TOSA FP (issue 25, the segmentation model's last CPU op): ``upsample_bilinear2d`` is one
RESIZE; the delegated program matches fp32 eager (oracle) on Arm's TOSA reference model, with and without
aligned corners, from a 1x1 map, by integer and non-integer ratios."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.runtime import Runtime
from edgeport_arm import TosaCompileSpec, TOSAPartitioner
from edgeport_arm.preprocess.ops.resize import resize_params


class Up(torch.nn.Module):
    def __init__(self, size: tuple[int, int], align: bool) -> None:
        super().__init__()
        self.size, self.align = size, align

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.interpolate(x * 2.0, size=self.size, mode="bilinear", align_corners=self.align)
        return torch.relu(y)


@pytest.mark.parametrize(("hw", "size", "align"), [
    ((1, 1), (4, 4), True), ((1, 1), (3, 5), False), ((3, 5), (6, 10), False), ((4, 4), (7, 9), True),
    ((4, 6), (6, 9), False), ((5, 3), (5, 7), True),
])
def test_bilinear_upsampling_is_delegated_and_matches_eager(hw, size, align):
    torch.manual_seed(0)
    model, x = Up(size, align), torch.randn(1, 3, *hw)
    partitioner = TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))
    program = to_edge_transform_and_lower(torch.export.export(model, (x,)), partitioner=[partitioner]).to_executorch()
    assert not partitioner.rejections, partitioner.rejections
    got = np.asarray(Runtime.get().load_program(program.buffer).load_method("forward").execute([x])[0])
    want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_inexact_scale_factor_stays_on_the_cpu_with_the_reason():
    class ByFactor(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.interpolate(x, scale_factor=1.7, mode="bilinear") + 1.0

    x = torch.randn(1, 2, 5, 5)
    partitioner = TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))
    program = to_edge_transform_and_lower(torch.export.export(ByFactor(), (x,)),
                                          partitioner=[partitioner]).to_executorch()
    assert any("do not give the output size exactly" in why for why in partitioner.rejections.values()), \
        partitioner.rejections
    got = np.asarray(Runtime.get().load_program(program.buffer).load_method("forward").execute([x])[0])
    np.testing.assert_allclose(got, ByFactor()(x).numpy(), rtol=1e-5, atol=1e-5)


def test_resize_parameters_give_the_output_size():
    for size_in, size_out, align in [(3, 6, False), (4, 7, True), (1, 9, True), (12, 24, False), (5, 5, False)]:
        n, d, offset, border = resize_params(size_in, size_out, align)
        assert ((size_in - 1) * n - offset + border) // d + 1 == size_out
