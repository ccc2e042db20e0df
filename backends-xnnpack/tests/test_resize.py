"""upsample_bilinear2d (align_corners either way, upsampling and downsampling) delegated to XNNPACK: edgeport's
runtime and the stock runtime (child process) against eager PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import edgeport
from edgeport.runtime import Runtime
from edgeport.testing.stock_runtime import run_program


class Up(torch.nn.Module):
    def __init__(self, size: tuple[int, int], align_corners: bool) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.size, self.align_corners = size, align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.interpolate(self.conv(x), size=self.size, mode="bilinear",
                                            align_corners=self.align_corners)
        return torch.relu(y)


@pytest.mark.parametrize(("size", "align_corners"), [((16, 12), False), ((16, 12), True), ((3, 5), False)])
def test_bilinear_resize_matches_eager_on_both_runtimes(size, align_corners):
    from edgeport_xnnpack import XnnpackPartitioner

    torch.manual_seed(0)
    model = Up(size, align_corners).eval()
    x = torch.randn(1, 3, 8, 6)
    manager = edgeport.to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                                   partitioner=[XnnpackPartitioner()]).to_executorch()
    ops = {o.name for p in manager.executorch_program.execution_plan for o in p.operators}
    assert not any("upsample" in o for o in ops), ops  # the resize is in the delegate
    with torch.no_grad():
        want = model(x).numpy()
    got = Runtime.get().load_program(manager.buffer).load_method().execute([x.numpy()])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    stock = run_program(manager.buffer, [x.numpy()])
    assert stock.ok, stock.describe() + "\n" + stock.log
    np.testing.assert_allclose(stock.outputs[0], want, rtol=1e-5, atol=1e-5)
