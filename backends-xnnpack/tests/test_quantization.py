"""Static int8: XnnpackQuantizer with torchao's pt2e flow, int8 lowering, both runtimes (SQNR against fp32 eager)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xnn_zoo as zoo
from torch import nn
from xnn_helpers import blob_nodes, delegate_count, lower_edgeport, needs_xnnpack, sqnr

import edgeport
from edgeport.testing import models
from edgeport_xnnpack import native
from edgeport_xnnpack.schema.graph import FP32, QCINT8, QCINT32, QINT8, QINT32, PerChannelQuant
from edgeport_xnnpack.schema.reader import read_blob

pytest.importorskip("torchao")
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer import Quantizer  # noqa: E402

from edgeport_xnnpack.quantizer import XnnpackQuantizer  # noqa: E402

XNNPACK_OK = native.is_available()[0]
MIN_SQNR = 20.0  # dB, against the float32 model in eager PyTorch
_Q = torch.ops.quantized_decomposed


def seeded_inputs(args: tuple, seed: int, count: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(a.shape, generator=g) for a in args) for _ in range(count)]


def quantize(model: nn.Module, args: tuple, calibration: int = 4, **options) -> torch.fx.GraphModule:
    """prepare_pt2e -> calibrate on ``calibration`` seeded inputs -> convert_pt2e."""
    prepared = prepare_pt2e(torch.export.export(model, args).module(), XnnpackQuantizer(**options))
    with torch.no_grad():
        for batch in seeded_inputs(args, 1234, calibration):
            prepared(*batch)
    return convert_pt2e(prepared)


def blob_values(edge) -> list:
    values = []
    for name, module in edge.exported_program().graph_module.named_children():
        if name.startswith("lowered_module"):
            values += read_blob(module.processed_bytes)[0].values
    return values


def eager_outputs(model: nn.Module, inputs: list[tuple]) -> np.ndarray:
    with torch.no_grad():
        return np.stack([model(*x).numpy() for x in inputs])


def edgeport_outputs(buffer: bytes, inputs: list[tuple]) -> np.ndarray:
    """Runs every input through one loaded method of edgeport's runtime."""
    from edgeport.runtime import Runtime

    method = Runtime.get().load_program(buffer).load_method("forward")
    return np.stack([method.execute([a.numpy() for a in x])[0] for x in inputs])


def executorch_outputs(buffer: bytes, inputs: list[tuple]) -> np.ndarray:
    """Runs every input through one loaded method of the stock ExecuTorch runtime."""
    pytest.importorskip("executorch")
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(buffer).load_method("forward")
    return np.stack([method.execute(list(x))[0].numpy() for x in inputs])


# -- the quantizer ----------------------------------------------------------------------------------------------
def test_quantizer_is_registered_lazily_and_is_a_torchao_quantizer():
    spec = edgeport.get_backend("XnnpackBackend")
    assert set(spec.quantizers) == {"int8"}
    q = spec.quantizers["int8"](per_channel=False, observer="minmax")
    assert isinstance(q, XnnpackQuantizer) and isinstance(q, Quantizer)
    assert not q.per_channel and q.observer == "minmax"


def test_quantizer_options():
    assert edgeport.get_backend("XnnpackBackend").quantizers["int8"](dynamic=True).dynamic
    with pytest.raises(ValueError, match="observer"):
        XnnpackQuantizer(observer="percentile")


def _targets(gm: torch.fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_conv_relu_is_quantized_as_one_pattern_with_per_channel_weights():
    model, args = models.simple_conv()
    gm = quantize(model, args)
    targets = _targets(gm)
    assert targets.count(_Q.quantize_per_tensor.default) == 2  # the input, the relu's output
    # the weight (folded to int8 by convert) and the bias (int32, scale input_scale * weight_scale)
    assert targets.count(_Q.dequantize_per_channel.default) == 2
    relu = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.relu.default)
    assert relu.args[0].target == torch.ops.aten.conv2d.default  # no quantize between conv and relu
    weight_dq = relu.args[0].args[1]
    assert weight_dq.target == _Q.dequantize_per_channel.default
    assert weight_dq.args[4:7] == (-127, 127, torch.int8)  # symmetric int8, axis 0
    assert weight_dq.args[3] == 0
    bias_dq = relu.args[0].args[2]
    assert bias_dq.target == _Q.dequantize_per_channel.default and bias_dq.args[6] == torch.int32


def test_per_tensor_weights_and_shared_parameters():
    model, args = models.cnn_bn_pool()
    gm = quantize(model, args, per_channel=False, observer="minmax")
    targets = _targets(gm)
    assert _Q.dequantize_per_channel.default not in targets
    assert targets.count(_Q.dequantize_per_tensor.default) > 4
    pool = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.max_pool2d.default)
    q_out = next(iter(pool.users))
    dq_in = pool.args[0]
    assert q_out.target == _Q.quantize_per_tensor.default and dq_in.target == _Q.dequantize_per_tensor.default
    assert q_out.args[1:3] == dq_in.args[1:3]  # max pooling keeps its input's scale and zero point


def test_node_filter_leaves_nodes_in_float():
    model, args = models.mlp()
    gm = quantize(model, args, observer="minmax", node_filter=lambda n: n.name != "linear")
    first = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default)
    assert first.args[1].op == "get_attr"  # float weight, no dequantize


# -- the partitioner --------------------------------------------------------------------------------------------
class _Uint8(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = _Q.quantize_per_tensor(x, 0.05, 3, 0, 255, torch.uint8)
        return torch.relu(_Q.dequantize_per_tensor(q, 0.05, 3, 0, 255, torch.uint8))


class _Int8Output(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = _Q.quantize_per_tensor(x, 0.05, 3, -128, 127, torch.int8)
        return torch.relu(_Q.dequantize_per_tensor(q, 0.05, 3, -128, 127, torch.int8)), q


def test_partitioner_refuses_what_it_cannot_lower():
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines the quantized_decomposed ops)

    from edgeport_xnnpack import XnnpackPartitioner

    p = XnnpackPartitioner()
    ep = edgeport.to_edge(torch.export.export(_Uint8(), (torch.randn(2, 8),))).exported_program()
    p.partition(ep)
    assert "uint8" in p.rejections["quantize_per_tensor"]
    assert "uint8" in p.rejections["dequantize_per_tensor"]
    assert "relu" not in p.rejections
    # an int8 value leaving the graph: neither the quantize nor its dequantize is delegated (no int8 delegate
    # inputs or outputs)
    ep = edgeport.to_edge(torch.export.export(_Int8Output(), (torch.randn(2, 8),))).exported_program()
    p.partition(ep)
    assert "would output int8" in p.rejections["quantize_per_tensor"]
    assert "neither a constant nor a delegated quantize" in p.rejections["dequantize_per_tensor"]


# -- small models on both runtimes ------------------------------------------------------------------------------
SMALL = {
    "mlp": (models.mlp, {}),
    "simple_conv": (models.simple_conv, {}),
    "mobilenet_v2_style": (models.mobilenet_v2_style, {}),
    "resnet_block": (models.resnet_block, {}),
    "mlp_per_tensor": (models.mlp, {"per_channel": False}),
    "simple_conv_per_tensor": (models.simple_conv, {"per_channel": False}),
}
FULLY_INT8 = {"XNNConv2d", "XNNDepthwiseConv2d", "XNNAdd", "XNNGlobalAvgPooling2d", "XNNMaxPooling2d",
              "XNNStaticReshape", "XNNClamp"}
N_INPUTS = 8


@pytest.fixture(scope="module")
def quantized():
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            build, options = SMALL[name]
            model, args = build()
            qmodel = quantize(model, args, **options)
            edge, buffer, partitioner = lower_edgeport(qmodel, args)
            inputs = seeded_inputs(args, 7, N_INPUTS)
            cache[name] = (model, qmodel, edge, buffer, partitioner, inputs, eager_outputs(model, inputs),
                           eager_outputs(qmodel, inputs))
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(SMALL))
def test_small_quantized_models_lower_to_one_int8_delegate(name, quantized):
    model, qmodel, edge, buffer, partitioner, inputs, ref, qref = quantized(name)
    assert delegate_count(edge) == 1 and not partitioner.rejections, partitioner.rejections
    nodes = blob_nodes(edge)
    # every compute node reads and writes int8; float32 appears only at the delegate's edges
    float_nodes = {k for (k, dt) in nodes if dt == FP32}
    assert float_nodes <= {"XNNConvert", "XNNStaticTranspose"}, nodes
    assert nodes[("XNNConvert", FP32)] == 1 and nodes[("XNNConvert", QINT8)] == 1, nodes
    assert {k for (k, dt) in nodes if dt == QINT8} <= FULLY_INT8 | {"XNNConvert"}
    assert nodes[("XNNConv2d", QINT8)] >= 1
    # the torchao reference (q/dq simulated in float) is itself close to float
    assert sqnr(ref, qref) >= MIN_SQNR


@needs_xnnpack
@pytest.mark.parametrize("name", list(SMALL))
def test_small_quantized_models_on_edgeport_runtime(name, quantized):
    model, qmodel, edge, buffer, partitioner, inputs, ref, qref = quantized(name)
    out = edgeport_outputs(buffer, inputs)
    assert sqnr(ref, out) >= MIN_SQNR
    assert sqnr(qref, out) >= 30.0  # XNNPACK's int8 arithmetic vs torchao's reference


@pytest.mark.executorch
@pytest.mark.parametrize("name", list(SMALL))
def test_small_quantized_models_on_executorch_runtime(name, quantized):
    pytest.importorskip("executorch")
    model, qmodel, edge, buffer, partitioner, inputs, ref, qref = quantized(name)
    out = executorch_outputs(buffer, inputs)
    assert sqnr(ref, out) >= MIN_SQNR
    assert sqnr(qref, out) >= 30.0


def test_weights_are_int8_per_channel_in_the_blob(quantized):
    model, qmodel, edge, buffer, *_ = quantized("mobilenet_v2_style")
    values = blob_values(edge)
    filters = [v for v in values if v.datatype == QCINT8]
    biases = [v for v in values if v.datatype == QCINT32]
    assert filters and len(biases) == len(filters)  # batch norms folded into biases
    assert all(isinstance(v.quant, PerChannelQuant) and v.constant_buffer_idx for v in filters + biases)
    # depthwise filters are [1, kh, kw, C] with their scales along dimension 3
    assert any(v.quant.channel_dim == 3 and v.dims[0] == 1 for v in filters)
    assert all(len(v.quant.scale) == v.dims[v.quant.channel_dim] for v in filters)
    assert not any(v.datatype == FP32 and v.constant_buffer_idx for v in values)  # no float weights left
    fp32_buffer = lower_edgeport(*models.mobilenet_v2_style())[1]
    assert len(buffer) < len(fp32_buffer) / 2


def test_per_tensor_weights_in_the_blob(quantized):
    values = blob_values(quantized("simple_conv_per_tensor")[2])
    assert [v.datatype for v in values if v.constant_buffer_idx] == [QINT8, QINT32]


def test_to_backend_after_to_edge_lowers_the_decomposed_linear_in_int8():
    """Without ``ops_to_not_decompose``, linear becomes ``addmm(bias, x, permute(weight))``: still int8."""
    from edgeport_xnnpack import XnnpackPartitioner

    model, args = models.mlp()
    qmodel = quantize(model, args, observer="minmax")
    edge = edgeport.to_edge(torch.export.export(qmodel, args)).to_backend(XnnpackPartitioner())
    assert delegate_count(edge) == 1
    nodes = blob_nodes(edge)
    assert nodes[("XNNConv2d", QINT8)] == 4 and {k for (k, dt) in nodes if dt == FP32} == {"XNNConvert"}
    if XNNPACK_OK:
        inputs = seeded_inputs(args, 3, 4)
        out = edgeport_outputs(edge.to_executorch().buffer, inputs)
        assert sqnr(eager_outputs(qmodel, inputs), out) >= 30.0


# -- float ops between int8 ones --------------------------------------------------------------------------------
class Mixed(nn.Module):
    """int8 convolutions around float ops (sigmoid, concatenate, a scalar multiply) and a flatten of a spatial
    tensor into a linear (an NHWC -> NCHW transpose of int8 data, done in float32)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 4, 1)
        self.fc = nn.Linear(4 * 6 * 6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        z = self.conv2(torch.cat([torch.sigmoid(y), y], 1)) * 2.0
        return self.fc(torch.flatten(torch.relu(z), 1))


@pytest.mark.executorch
def test_float_ops_between_int8_ops_convert_inside_the_delegate():
    model, args = Mixed().eval(), (torch.randn(1, 3, 6, 6),)
    qmodel = quantize(model, args, calibration=32)  # a tiny random model: 4 inputs do not cover the range
    edge, buffer, partitioner = lower_edgeport(qmodel, args)
    assert delegate_count(edge) == 1 and not partitioner.rejections, partitioner.rejections
    nodes = blob_nodes(edge)
    assert nodes[("XNNConv2d", QINT8)] == 3  # the linear is a 1x1 convolution
    assert nodes[("XNNSigmoid", FP32)] == 1 and nodes[("XNNConcatenate2", FP32)] == 1
    assert nodes[("XNNConvert", QINT8)] >= 3 and nodes[("XNNConvert", FP32)] >= 3
    inputs = seeded_inputs(args, 11, N_INPUTS)
    ref = eager_outputs(model, inputs)
    if XNNPACK_OK:
        assert sqnr(ref, edgeport_outputs(buffer, inputs)) >= MIN_SQNR
    pytest.importorskip("executorch")
    assert sqnr(ref, executorch_outputs(buffer, inputs)) >= MIN_SQNR


# -- MobileNetV2 -----------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.executorch
def test_int8_mobilenet_v2_is_one_delegate_and_accurate_on_both_runtimes():
    model, args = zoo.mobilenet_v2()
    qmodel = quantize(model, args, calibration=4)
    edge, buffer, partitioner = lower_edgeport(qmodel, args)
    assert delegate_count(edge) == 1 and not partitioner.rejections, partitioner.rejections
    nodes = blob_nodes(edge)
    assert nodes[("XNNConv2d", QINT8)] == 36 and nodes[("XNNDepthwiseConv2d", QINT8)] == 17  # 35 convs + fc
    assert nodes[("XNNAdd", QINT8)] == 10 and nodes[("XNNGlobalAvgPooling2d", QINT8)] == 1
    assert {k for (k, dt) in nodes if dt == FP32} == {"XNNConvert", "XNNStaticTranspose"}
    inputs = seeded_inputs(args, 42, 32)
    ref = eager_outputs(model, inputs)
    ours = None
    if XNNPACK_OK:
        ours = edgeport_outputs(buffer, inputs)
        assert sqnr(ref, ours) >= MIN_SQNR  # measured: 39.7 dB
    pytest.importorskip("executorch")
    theirs = executorch_outputs(buffer, inputs)
    assert sqnr(ref, theirs) >= MIN_SQNR  # measured: 39.7 dB
    if ours is not None:
        assert sqnr(theirs, ours) >= 40.0  # the same int8 kernels: identical here
