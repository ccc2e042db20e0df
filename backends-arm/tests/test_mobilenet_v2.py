"""int8 MobileNetV2-style CNNs with calibrated BatchNorm on TOSA / Ethos-U: bit-exact against the pt2e model.

The cause of the 11.9 dB mismatch issue 25 reported: the quantizer left convolution biases in float, so the
pt2e model added the exact (BatchNorm-folded) bias while the integer graph added it rounded to int32; ~0.1% of
a convolution's outputs landed one step apart, and a deep CNN amplified that. Biases are now int32 in the pt2e
model too (derived from the input and weight scales). Oracle: the pt2e-converted torch model, evaluated in float64
(:class:`Float64Pt2e`): in float32 its convolutions land on the wrong side of a .5 rounding boundary now and
then (verified case: exact value 0.5000009 steps, float32 pt2e rounds down, the integer graph up, correctly), and
the transformers MobileNetV2 below, whose pt2e model is itself only ~4 dB from fp32 eager, amplifies one such
step to 12 dB on inputs other than the calibration one; in float64 the integer graph matches it exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arm_models import quantize_and_lower, run, sqnr_db
from torch import nn
from torch.fx import Interpreter

from edgeport_arm import (
    EthosUCompileSpec,
    EthosUPartitioner,
    EthosUQuantizer,
    TosaCompileSpec,
    TOSAPartitioner,
    TOSAQuantizer,
)

_QD = torch.ops.quantized_decomposed


class Float64Pt2e(Interpreter):
    """Runs a pt2e-converted model in float64: dequantize exact, every op in float64, quantize rounding
    ``x / scale`` half to even (the model input's quantize stays float32: the portable kernel does it)."""

    def call_function(self, target, args, kwargs):  # type: ignore[no-untyped-def]
        if target == _QD.quantize_per_tensor.default:
            x, scale, zp, qmin, qmax, dtype = args[:6]
            if x.dtype == torch.float32:
                return super().call_function(target, args, kwargs)
            return torch.clamp(torch.round(x / float(scale)) + int(zp), qmin, qmax).to(dtype)
        if target == _QD.dequantize_per_tensor.default:
            return (args[0].double() - int(args[2])) * float(args[1])
        if target == _QD.dequantize_per_channel.default:
            x, scales, zps, axis = args[:4]
            shape = [1] * x.dim()
            shape[axis] = -1
            return (x.double() - zps.double().reshape(shape)) * scales.double().reshape(shape)
        args = tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        return super().call_function(target, args, kwargs)


def pt2e_float64(converted: torch.fx.GraphModule, x: torch.Tensor) -> np.ndarray:
    out = Float64Pt2e(converted).run(x)
    return (out[0] if isinstance(out, (tuple, list)) else out).float().numpy()


def _cbr(cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU6()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 6) -> None:
        super().__init__()
        mid = cin * expand
        self.block = nn.Sequential(_cbr(cin, mid), _cbr(mid, mid, 3, stride, groups=mid), _cbr(mid, cout, act=False))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


class TinyMobileNetV2(nn.Module):
    """Stem, a depthwise-separable block, inverted residuals (stride 2, residual add), head, pool, classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _cbr(3, 16, 3, 2), _cbr(16, 16, 3, groups=16), _cbr(16, 8, act=False),
            InvertedResidual(8, 12, 2), InvertedResidual(12, 12, 1), InvertedResidual(12, 16, 2),
            _cbr(16, 64))
        self.classifier = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean(dim=(2, 3)))


def _calibrate_batch_norm(model: nn.Module, shape: tuple[int, ...], batches: int = 4) -> nn.Module:
    """BatchNorm statistics from a few training-mode batches (as issue 25's model had), then eval."""
    gen = torch.Generator().manual_seed(11)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn((8, *shape[1:]), generator=gen))
    return model.eval()


def _output_step(converted: torch.fx.GraphModule) -> float:
    out = next(n for n in converted.graph.nodes if n.op == "output").args[0][0]
    return float(out.args[1])  # the scale of the final dequantize


def _check(lowered, shape: tuple[int, ...], min_sqnr: float | None = None) -> None:
    """Bit-exact against the pt2e model in float64 (and in float32 on the calibration input), or (``min_sqnr``)
    within one output step of it and at least that SQNR."""
    gen = torch.Generator().manual_seed(5)
    step = _output_step(lowered.converted)
    outs, _ = run(lowered.program.buffer, [lowered.example])
    if min_sqnr is None:
        assert np.array_equal(outs[0], lowered.converted(lowered.example).detach().numpy())
    for x in [lowered.example] + [torch.randn(shape, generator=gen) for _ in range(2)]:
        outs, _ = run(lowered.program.buffer, [x])
        want = pt2e_float64(lowered.converted, x)
        if min_sqnr is None:
            assert np.array_equal(outs[0], want), f"SQNR vs pt2e {sqnr_db(want, outs[0]):.1f} dB, not bit-exact"
        else:
            assert np.max(np.abs(outs[0] - want)) <= step * 1.001 and sqnr_db(want, outs[0]) >= min_sqnr


def _int32_biases(converted: torch.fx.GraphModule) -> int:
    return sum(1 for n in converted.graph.nodes if n.op == "call_function" and "dequantize_per_channel" in
               str(n.target) and n.args[6] == torch.int32)


@pytest.mark.parametrize("backend", ["tosa", "ethos-u55-128"])
def test_mobilenet_v2_blocks_with_calibrated_batch_norm_are_bit_exact(backend):
    shape = (1, 3, 32, 32)
    torch.manual_seed(0)
    model = _calibrate_batch_norm(TinyMobileNetV2(), shape)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    if backend == "tosa":
        quantizer, partitioner = TOSAQuantizer(TosaCompileSpec()), TOSAPartitioner(TosaCompileSpec())
    else:
        spec = EthosUCompileSpec(backend)
        quantizer, partitioner = EthosUQuantizer(spec), EthosUPartitioner(spec)
    lowered = quantize_and_lower(model, x, quantizer, partitioner, calibration=4)
    convs = sum(1 for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    assert _int32_biases(lowered.converted) == convs  # every (BatchNorm-folded) bias is int32 in the pt2e model
    # Ethos-U targets average an even count (this 4x4 global mean) with AVG_POOL2D + RESCALE, rounding twice, for
    # Vela's cycles (bench/REPORT.md, "Arm Ethos-U: reading the numbers"): one step off on a few classifier outputs
    # (43.5 dB measured); everything before the pool is bit-exact (an odd count is bit-exact: test_avg_pool.py)
    _check(lowered, shape, None if backend == "tosa" else 40.0)
    outs, _ = run(lowered.program.buffer, [x])
    assert sqnr_db(model(x).detach().numpy(), outs[0]) >= 20.0  # and still close to fp32 eager


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tosa", "ethos-u55-128"])
def test_transformers_mobilenet_v2_96_is_bit_exact(backend):
    transformers = pytest.importorskip("transformers")
    shape = (1, 3, 96, 96)
    torch.manual_seed(0)
    config = transformers.MobileNetV2Config(num_channels=3, image_size=96, depth_multiplier=0.35, tf_padding=False)
    net = transformers.MobileNetV2Model(config)

    class Features(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x).last_hidden_state

    model = _calibrate_batch_norm(Features(), shape)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    if backend == "tosa":
        quantizer, partitioner = TOSAQuantizer(TosaCompileSpec()), TOSAPartitioner(TosaCompileSpec())
    else:
        spec = EthosUCompileSpec(backend)
        quantizer, partitioner = EthosUQuantizer(spec), EthosUPartitioner(spec)
    lowered = quantize_and_lower(model, x, quantizer, partitioner, calibration=4)
    _check(lowered, shape)  # was 6.7 dB (11.9 dB in issue 25's run) with float biases
