"""Acceptance: models no single backend covers, lowered for two backends in one program, quantized by ownership,
run on edgeport's runtime and compared with the pt2e-quantized eager model; and a models x profiles matrix (slow)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import edgeport
from edgeport.aot.capability_partitioner import op_name
from edgeport.testing import models as zoo


class EluCNN(torch.nn.Module):
    """A CNN with ``elu``: in XNNPACK's table, in neither the Arm nor the QNN table."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.elu(torch.relu(self.c1(x)))
        y = torch.nn.functional.max_pool2d(torch.relu(self.c2(y)), 2)
        return self.fc(y.flatten(1))


def _quantized_eager(model: torch.nn.Module, x: torch.Tensor, target: str,
                     calibration: list[tuple[torch.Tensor, ...]]) -> tuple[np.ndarray, float]:
    """The oracle: torchao pt2e with the profile's quantizers composed by ownership, run in eager PyTorch;
    and the output quantization step (the scale of the last quantize in the graph)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeport.aot.composable_quantizer import OwnershipQuantizer, QuantizerEntry
    from edgeport.registry import get_backend
    from edgeport.targets import PROFILES

    entries = []
    for choice in PROFILES[target].backends:
        spec = get_backend(choice.backend_id)
        entries.append(QuantizerEntry(choice.backend_id, spec.quantizers[choice.quantizer](), spec.capabilities()))
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), OwnershipQuantizer(entries))
    for batch in calibration:
        prepared(*batch)
    converted = convert_pt2e(prepared)
    scales = [float(n.args[1]) for n in converted.graph.nodes
              if n.op == "call_function" and "quantize_per_tensor" in op_name(n.target)
              and "dequantize" not in op_name(n.target)]
    return converted(x).detach().numpy(), scales[-1]


@pytest.mark.parametrize("target, primary", [("arm-ethos-u55+cpu", "EthosUBackend"),
                                             ("qualcomm-htp", "QnnBackend")])
def test_two_backends_one_program_match_the_quantized_eager_model(target: str, primary: str) -> None:
    torch.manual_seed(0)
    model, x = EluCNN().eval(), torch.randn(1, 3, 8, 8)
    calibration = [(torch.randn(1, 3, 8, 8),) for _ in range(4)] + [(x,)]
    manager = edgeport.lower(model, (x,), target=target, quantize=True, calibration=calibration)
    report = manager.lowering_report
    backends = {b for b, _ in report.delegates}
    assert backends == {primary, "XnnpackBackend"}
    elu = [r for r in report.ownership.values() if r.op == "aten.elu.default"]
    assert [r.owner for r in elu] == ["XnnpackBackend"]
    assert "not in the" in elu[0].not_taken[primary]
    assert report.quantization["elu"].owner is None  # no owner quantizes elu: it stays float
    assert report.quantization["conv2d_1"].owner == primary
    ref, step = _quantized_eager(model, x, target, calibration)
    out = edgeport.load(manager.buffer)(x.numpy())[0]
    within = np.abs(out - ref) <= step * 1.001
    assert within.mean() >= 0.99, (np.abs(out - ref).max(), step)


def _case(name: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    builders = {"simple_conv": zoo.simple_conv, "cnn_bn_pool": zoo.cnn_bn_pool, "elu_cnn": None}
    if name == "elu_cnn":
        torch.manual_seed(0)
        return EluCNN().eval(), (torch.randn(1, 3, 8, 8),)
    model, inputs = builders[name](0)
    return model.eval(), tuple(inputs)


@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["simple_conv", "cnn_bn_pool", "elu_cnn"])
@pytest.mark.parametrize("target", ["cpu", "vulkan", "arm-ethos-u55+cpu", "qualcomm-htp", "apple"])
def test_matrix(model_name: str, target: str) -> None:
    model, inputs = _case(model_name)
    quantize = target in ("arm-ethos-u55+cpu", "qualcomm-htp")
    manager = edgeport.lower(model, inputs, target=target, quantize=quantize)
    report = manager.lowering_report
    profile_ids = {c.backend_id for c in edgeport.targets.PROFILES[target].backends}
    assert report.delegates and {b for b, _ in report.delegates} <= profile_ids
    if target == "apple":  # Core ML cannot execute on Linux: lowering and structure only
        return
    out = edgeport.load(manager.buffer)(*[t.numpy() for t in inputs])[0]
    if quantize:
        ref, step = _quantized_eager(model, inputs[0], target, [inputs])
        # one quantum (+1% for the float dequantize) on >= 99%; QNN's HTP emulator rounds some requantizations
        # differently from torch (simple_conv: 98.7% within 1.001 steps, 99.5% within 1.01, all within 2)
        steps = np.abs(out - ref) / step
        assert (steps <= 1.01).mean() >= 0.99 and steps.max() <= 2.01
    else:
        ref = model(*inputs).detach().numpy()
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4)
