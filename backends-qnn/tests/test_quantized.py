"""pt2e-quantized models (QnnQuantizer: uint8 activations, int8 per-channel weights) on the HTP, against the
converted model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from qnn_models import build

import edgeport
from edgeport.runtime import Runtime

pytestmark = pytest.mark.usefixtures("requires_qnn")


def quantize(name: str):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeport_qnn.quantizer import QnnQuantizer

    model, inputs = build(name)
    m = prepare_pt2e(torch.export.export(model, inputs).module(), QnnQuantizer())
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        m(*(torch.randn(x.shape, generator=gen) for x in inputs))
    m(*inputs)
    return convert_pt2e(m), inputs


def output_step(ep) -> float:
    (out,) = [n for n in ep.graph.nodes if n.op == "output"][0].args[0]
    assert "dequantize_per_tensor" in str(out.target)
    return float(out.args[1])


@pytest.mark.parametrize("name, max_steps", [("cnn", 1), ("mlp", 1)])  # measured: cnn bit-exact, mlp 1 step (88% exact)
def test_quantized_model_fully_delegated(name, max_steps):
    from edgeport_qnn import QnnPartitioner

    converted, inputs = quantize(name)
    ep = torch.export.export(converted, inputs)
    step = output_step(ep)
    p = QnnPartitioner()
    program = edgeport.to_edge_transform_and_lower(ep, partitioner=[p])
    assert p.rejections == {}
    gm = program.exported_program().graph_module
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and "getitem" not in str(n.target)]
    assert [str(n.target) for n in calls] == ["edgeport.call_delegate.default"]
    from edgeport_qnn.blob import unpack_blob

    header, _ = unpack_blob(gm.lowered_module_0.processed_bytes)
    assert header.ops.get("Quantize", 0) >= 1 and header.ops.get("FullyConnected", 0) >= 1
    (out,) = Runtime.get().load_program(program.to_executorch().buffer).load_method("forward").execute(
        [x.numpy() for x in inputs])
    ref = converted(*inputs).detach().numpy()
    assert np.abs(out - ref).max() <= max_steps * step * 1.001, (np.abs(out - ref).max(), step)


def test_quantized_encoder_runs_quantized():
    """Linear layers, layer norm, softmax, both bmm and gelu all run quantized (QNN LayerNorm / Softmax / MatMul /
    Gelu on uint8 tensors) in one delegate."""
    from edgeport_qnn import QnnPartitioner

    converted, inputs = quantize("encoder")
    ep = torch.export.export(converted, inputs)
    p = QnnPartitioner()
    program = edgeport.to_edge_transform_and_lower(ep, partitioner=[p])
    assert p.rejections == {}
    (out,) = Runtime.get().load_program(program.to_executorch().buffer).load_method("forward").execute(
        [x.numpy() for x in inputs])
    ref = converted(*inputs).detach().numpy()
    assert np.abs(out - ref).max() <= 2 * output_step(ep) * 1.001  # measured: 2 steps (82% of outputs exact)


class _PadThenConv(torch.nn.Module):
    """MobileNetV2's "same" padding: pad right and bottom by one, then a stride-2 depthwise convolution; either on
    the model's input (float, before the first quantize) or between quantized ops."""

    def __init__(self, on_input: bool) -> None:
        super().__init__()
        self.on_input = on_input
        self.expand = torch.nn.Conv2d(8, 48, 1)
        self.dw = torch.nn.Conv2d(48, 48, 3, stride=2, groups=48)

    def forward(self, x):
        if self.on_input:
            return torch.nn.functional.relu6(self.expand(torch.nn.functional.pad(x, (0, 1, 0, 1))))
        return self.dw(torch.nn.functional.pad(torch.nn.functional.relu6(self.expand(x)), (0, 1, 0, 1)))


@pytest.mark.parametrize("on_input", [False, True])
def test_quantized_right_bottom_padding(on_input):
    """A pad at the end of W in NCHW wrote garbage into the padding on the HTP (60-250 output steps off the
    converted model); padded in NHWC it is within 3 steps (measured: 1-2)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeport_qnn import QnnPartitioner
    from edgeport_qnn.quantizer import QnnQuantizer

    torch.manual_seed(0)
    model, inputs = _PadThenConv(on_input).eval(), (torch.randn(1, 8, 16, 16),)
    m = prepare_pt2e(torch.export.export(model, inputs).module(), QnnQuantizer())
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        m(torch.randn(inputs[0].shape, generator=gen))
    m(*inputs)
    converted = convert_pt2e(m)
    ep = torch.export.export(converted, inputs)
    program = edgeport.to_edge_transform_and_lower(ep, partitioner=[QnnPartitioner()])
    (out,) = Runtime.get().load_program(program.to_executorch().buffer).load_method("forward").execute(
        [x.numpy() for x in inputs])
    ref = converted(*inputs).detach().numpy()
    step = output_step(ep)
    assert np.abs(out - ref).max() <= 3 * step, (np.abs(out - ref).max() / step, "output steps")
