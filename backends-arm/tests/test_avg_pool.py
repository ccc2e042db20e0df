"""Integer average pooling: bit-exact against the pt2e model, and no RESCALE after a pool that needs none.

A pool over an odd number of elements cannot produce an exact .5 tie, so the quantizer lets it share its
input's parameters (as ExecuTorch's does) and the lowering emits AVG_POOL2D alone: Vela's cycles then match
ExecuTorch's on the DS-CNN and MobileNetV2 (bench/REPORT.md, "Arm Ethos-U"). A pool over an even count keeps
its own output parameters (ties are frequent on the input's scale, and TOSA rounds them up where torch rounds
to even), at the price of one RESCALE. Oracle: the pt2e-converted model evaluated in float64.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from arm_models import quantize_and_lower, run, sqnr_db
from test_mobilenet_v2 import TinyMobileNetV2, _calibrate_batch_norm, pt2e_float64
from torch import nn

from edgeport.program.reader import load_pte
from edgeport_arm import (
    EthosUCompileSpec,
    EthosUPartitioner,
    EthosUQuantizer,
    TosaCompileSpec,
    TOSAPartitioner,
    TOSAQuantizer,
)
from edgeport_arm.keys import estimates_key

_QD = torch.ops.quantized_decomposed


class ConvPool(nn.Module):
    """conv + relu, then a global average (``how``: mean over H and W, adaptive pool, or avg_pool2d)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        if self.how == "mean":
            return y.mean(dim=(2, 3))
        if self.how == "adaptive":
            return nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        return nn.functional.avg_pool2d(y, y.shape[2:]).flatten(1)


def _lowered(model: nn.Module, x: torch.Tensor, backend: str):  # type: ignore[no-untyped-def]
    if backend == "tosa":
        spec = TosaCompileSpec()
        return quantize_and_lower(model, x, TOSAQuantizer(spec), TOSAPartitioner(spec), calibration=4)
    spec = EthosUCompileSpec(backend)
    return quantize_and_lower(model, x, EthosUQuantizer(spec), EthosUPartitioner(spec), calibration=4)


def _pool_shares_parameters(converted: torch.fx.GraphModule) -> bool:
    """Whether the quantize after the pool has the parameters of the dequantize before it."""
    pools = [n for n in converted.graph.nodes if n.op == "call_function" and any(
        k in str(n.target) for k in ("mean.dim", "avg_pool2d"))]
    assert len(pools) == 1, pools
    pool = pools[0]
    dq = pool.args[0]
    (q,) = [u for u in pool.users if u.target == _QD.quantize_per_tensor.default]
    return (float(dq.args[1]), int(dq.args[2])) == (float(q.args[1]), int(q.args[2]))


def _ethos_u_tosa_ops(buffer: bytes) -> dict[str, int]:
    lp = load_pte(buffer)
    return json.loads(bytes(lp.named_data(estimates_key(bytes(lp.delegate_data(0, 0))))))["tosa_ops"]


def _assert_bit_exact(lowered, shape: tuple[int, ...], inputs: int = 4) -> None:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(5)
    for x in [lowered.example] + [torch.randn(shape, generator=gen) for _ in range(inputs - 1)]:
        outs, _ = run(lowered.program.buffer, [x])
        want = pt2e_float64(lowered.converted, x)
        assert np.array_equal(outs[0], want), f"SQNR vs pt2e {sqnr_db(want, outs[0]):.1f} dB, not bit-exact"


@pytest.mark.parametrize("backend, how", [("tosa", "mean"), ("tosa", "adaptive"), ("tosa", "avg_pool2d"),
                                          ("ethos-u55-128", "mean"), ("ethos-u55-128", "avg_pool2d")])
def test_odd_count_pool_shares_parameters_and_is_bit_exact(backend, how):
    shape = (1, 3, 5, 7)  # 35 elements per average: no ties possible
    torch.manual_seed(0)
    lowered = _lowered(ConvPool(how).eval(), torch.randn(shape), backend)
    assert _pool_shares_parameters(lowered.converted)
    _assert_bit_exact(lowered, shape)


@pytest.mark.parametrize("target", ["ethos-u55-128", pytest.param("ethos-u85-256", marks=pytest.mark.slow)])
def test_ethos_u_pool_needs_a_rescale_only_over_an_even_count(target):
    rescales = {}
    for shape in ((1, 3, 5, 5), (1, 3, 4, 4)):
        torch.manual_seed(0)
        lowered = _lowered(ConvPool("mean").eval(), torch.randn(shape), target)
        assert _pool_shares_parameters(lowered.converted) == (shape[2] % 2 == 1)
        ops = _ethos_u_tosa_ops(lowered.program.buffer)
        assert ops["AVG_POOL2D"] == 1
        rescales[shape[2]] = ops["RESCALE"]
    assert rescales[4] == rescales[5] + 1  # the even-count pool's own parameters cost one RESCALE


@pytest.mark.parametrize("target", ["ethos-u55-128", pytest.param("ethos-u85-256", marks=pytest.mark.slow)])
def test_mobilenet_v2_with_odd_pool_is_bit_exact_on_ethos_u(target):
    shape = (1, 3, 36, 36)  # the head pools 5x5
    torch.manual_seed(0)
    model = _calibrate_batch_norm(TinyMobileNetV2(), shape)
    lowered = _lowered(model, torch.randn(shape, generator=torch.Generator().manual_seed(2)), target)
    assert _pool_shares_parameters(lowered.converted)
    _assert_bit_exact(lowered, shape, inputs=3)
    outs, _ = run(lowered.program.buffer, [lowered.example])
    assert sqnr_db(model(lowered.example).detach().numpy(), outs[0]) >= 20.0
