"""edgeport.aot.quantizer_base: a minimal backend quantizer built from the base, run through torchao's real
prepare_pt2e / convert_pt2e; the converted graph is checked against the quantization rules written out here."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

from torch.fx import GraphModule, Node  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402

from edgeport.aot.quantizer_base import (  # noqa: E402
    BackendQuantizer,
    int8_activation_spec,
    int32_bias_spec,
    observer_class,
    symmetric_weight_spec,
)
from edgeport.node_helpers import node_arg  # noqa: E402

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


class ConvQuantizer(BackendQuantizer):
    """What a backend would write on the base: int8 conv / linear with int32 biases and a fused relu, max
    pooling on its input's parameters, add on both inputs."""

    def __init__(self, *, per_channel: bool = True, node_filter=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(node_filter=node_filter)
        self.per_channel = per_channel
        self.act = int8_activation_spec("minmax")
        self.weight = symmetric_weight_spec(per_channel=per_channel)

    def annotate(self, model: GraphModule) -> GraphModule:
        for node in self.candidates(model):
            if node.target in (aten.conv2d.default, aten.linear.default):
                x, w, b = node.args[0], node.args[1], node_arg(node, 2, "bias")
                inputs = {x: self.act, w: self.weight}
                if b is not None:
                    inputs[b] = int32_bias_spec(x, w, node, per_channel=self.per_channel)
                self.mark(node, inputs)
                self.quantize_output(node, self.act, lambda u: u.target == aten.relu.default)
            elif node.target == aten.max_pool2d.default:
                self.annotate_shared(node, self.act)
            elif node.target == aten.add.Tensor:
                self.annotate_binary(node, self.act)
        return model


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.fc = torch.nn.Linear(6 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc((y + y).flatten(1))


def _converted(quantizer: BackendQuantizer) -> GraphModule:
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(1, 3, 8, 8)
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    for _ in range(3):
        prepared(torch.randn(1, 3, 8, 8))
    return convert_pt2e(prepared)


def _calls(gm: GraphModule, target) -> list[Node]:  # type: ignore[no-untyped-def]
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]


def _const(gm: GraphModule, node: Node) -> torch.Tensor:
    return getattr(gm, node.target) if node.op == "get_attr" else node


@pytest.mark.parametrize("per_channel", [True, False])
def test_bias_is_int32_on_the_accumulator_scale(per_channel):  # type: ignore[no-untyped-def]
    gm = _converted(ConvQuantizer(per_channel=per_channel))
    (conv,) = _calls(gm, aten.conv2d.default)
    x_dq, w_dq, b_dq = conv.args[0], conv.args[1], conv.args[2]
    input_scale = float(x_dq.args[1])
    if per_channel:
        weight_scale = _const(gm, w_dq.args[1]).to(torch.float64)
        bias_scale, bias_zp = _const(gm, b_dq.args[1]), _const(gm, b_dq.args[2])
        assert b_dq.target == qd.dequantize_per_channel.default
        assert b_dq.args[-1] == torch.int32 and int(b_dq.args[3]) == 0  # channel axis 0
    else:
        weight_scale = torch.tensor([float(w_dq.args[1])], dtype=torch.float64)
        bias_scale, bias_zp = torch.tensor([float(b_dq.args[1])]), torch.tensor([int(b_dq.args[2])])
        assert b_dq.target == qd.dequantize_per_tensor.default and b_dq.args[-1] == torch.int32
    want = (weight_scale * input_scale).to(torch.float32)
    assert torch.equal(bias_scale.to(torch.float32).reshape(-1), want.reshape(-1))
    assert not bias_zp.any()
    codes = _const(gm, b_dq.args[0])
    assert codes.dtype == torch.int32
    torch.manual_seed(0)
    float_bias = Net().conv.bias.detach()
    assert torch.equal(codes, torch.round(float_bias.double() / want.double()).to(torch.int32))
    # so the float bias the pt2e model adds is a whole number of accumulator steps, as the integer kernel's is
    added = codes.double() * bias_scale.double()
    assert torch.equal(torch.round(added / want.double()), codes.double())


def test_relu_after_conv_is_fused_and_pooling_shares_parameters():
    gm = _converted(ConvQuantizer())
    (relu,) = _calls(gm, aten.relu.default)
    assert relu.args[0].target == aten.conv2d.default  # nothing quantized between the conv and its relu
    (q_relu,) = relu.users
    assert q_relu.target == qd.quantize_per_tensor.default
    (pool,) = _calls(gm, aten.max_pool2d.default)
    (q_pool,) = [u for u in pool.users if u.target == qd.quantize_per_tensor.default]
    assert pool.args[0].args[1:3] == q_pool.args[1:3]  # scale, zero point of its input's dequantize
    (add,) = _calls(gm, aten.add.Tensor)
    assert all(a.target == qd.dequantize_per_tensor.default for a in add.args[:2])


def test_node_filter_keeps_nodes_in_float():
    gm = _converted(ConvQuantizer(node_filter=lambda n: n.target != aten.conv2d.default))
    (conv,) = _calls(gm, aten.conv2d.default)
    assert all(getattr(a, "target", None) not in (qd.dequantize_per_tensor.default,
                                                  qd.dequantize_per_channel.default) for a in conv.args[:3])
    (linear,) = _calls(gm, aten.linear.default)
    assert linear.args[2].target == qd.dequantize_per_channel.default  # the others are still quantized


def test_specs_and_observer_names():
    w16 = symmetric_weight_spec(torch.int16)
    assert (w16.quant_min, w16.quant_max, w16.qscheme, w16.ch_axis) == (-32767, 32767, torch.per_channel_symmetric, 0)
    w8 = symmetric_weight_spec(per_channel=False)
    assert (w8.quant_min, w8.quant_max, w8.qscheme) == (-127, 127, torch.per_tensor_symmetric)
    act = int8_activation_spec()
    assert (act.dtype, act.quant_min, act.quant_max, act.qscheme) == (torch.int8, -128, 127, torch.per_tensor_affine)
    with pytest.raises(ValueError, match=r"AcmeQuantizer: observer must be one of \['histogram', 'minmax'\], "
                                         r"got 'mse'"):
        observer_class("mse", "AcmeQuantizer")
