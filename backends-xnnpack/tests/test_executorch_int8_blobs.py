"""Statically quantized (int8) blobs written by ExecuTorch 1.5.1, run by edgeport's executor on the 2022 libXNNPACK.

Models are quantized with ExecuTorch's ``XNNPACKQuantizer`` (symmetric, per-channel weights) through torchao's
pt2e flow and lowered with ExecuTorch's ``XnnpackPartitioner``. The oracle is ExecuTorch's runtime running the
same program on its own (newer) XNNPACK: outputs must agree to within one step of the output's quantization
scale (they agree exactly on the models below). See ``edgeport_xnnpack._rewrite_int8``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn
from xnn_helpers import needs_xnnpack, run_edgeport, run_executorch

from edgeport.errors import ProgramError
from edgeport.program import load_pte
from edgeport_xnnpack._native_run import glue_status
from edgeport_xnnpack._rewrite_int8 import int8_mean
from edgeport_xnnpack.options import XnnpackRuntimeOptions
from edgeport_xnnpack.runtime import ShuffleStep, XnnpackExecutor
from edgeport_xnnpack.schema.graph import INVALID_ID, QCINT8, QINT8, PerChannelQuant, PerTensorQuant
from edgeport_xnnpack.schema.reader import read_blob
from edgeport_xnnpack.schema.writer import serialize

pytestmark = [needs_xnnpack, pytest.mark.executorch]
pytest.importorskip("executorch")
pytest.importorskip("torchao")
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402

STEPS = 1.0  # max |edgeport - ExecuTorch| in steps of the output's quantization scale


class ConvReluLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def mlp() -> tuple[nn.Module, tuple]:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)), (torch.randn(4, 64),)


def conv_relu_linear() -> tuple[nn.Module, tuple]:
    return ConvReluLinear(), (torch.randn(2, 3, 8, 8),)


def linear_3d() -> tuple[nn.Module, tuple]:
    return nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 8)), (torch.randn(2, 5, 16),)


def mobilenet_v2(resolution: int = 64) -> tuple[nn.Module, tuple]:
    from edgeport.testing.vision import mobilenet_v2 as build

    return build(resolution=resolution)


def lower_int8(model: nn.Module, args: tuple) -> bytes:
    """``model`` quantized and lowered by ExecuTorch (test-only oracle)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(model.eval(), args).module(), quantizer)
    prepared(*args)
    converted = convert_pt2e(prepared)
    lowered = to_edge_transform_and_lower(torch.export.export(converted, args), partitioner=[XnnpackPartitioner()])
    return lowered.to_executorch().buffer


def output_scale(buffer: bytes) -> float:
    """The quantization scale of the int8 value the (single) delegate converts into its float32 output."""
    graph, _ = read_blob(load_pte(buffer).delegate_data(0, 0))
    q = {v.id_out: v.quant for v in graph.values}[graph.nodes[-1].inputs()[0]]
    assert graph.nodes[-1].kind == "XNNConvert" and isinstance(q, PerTensorQuant)
    return q.scale


def init(buffer: bytes, graph=None):
    """The delegate's handle, planned with every product in libXNNPACK (the plan these tests describe; int8 1x1
    convolutions on VNNI CPUs are ``test_host_gemm``'s)."""
    lp = load_pte(buffer)
    blob = lp.delegate_data(0, 0)
    if graph is not None:
        blob = serialize(graph, read_blob(blob)[1])
    return XnnpackExecutor().init(blob, [], named_data=lp.named_data,
                                  runtime_options=XnnpackRuntimeOptions(fully_connected="xnnpack"))


def compare(build, seed: int = 0) -> tuple[bytes, float]:
    torch.manual_seed(seed)
    model, args = build()
    buffer = lower_int8(model, args)
    ours, ref = run_edgeport(buffer, args), run_executorch(buffer, args)
    steps = float(np.abs(ours - ref).max()) / output_scale(buffer)
    assert steps <= STEPS, f"{steps:.2f} quantization steps from ExecuTorch's output"
    return buffer, steps


@pytest.fixture(scope="module")
def mlp_blob() -> bytes:
    torch.manual_seed(0)
    return lower_int8(*mlp())


# -- ExecuTorch's runtime as the oracle -----------------------------------------------------------------------
@pytest.mark.parametrize("build", [mlp, conv_relu_linear, linear_3d], ids=["mlp", "conv_relu_linear", "linear_3d"])
def test_int8_blobs_match_executorch(build):
    compare(build)


def test_int8_fully_connected_runs_natively_as_a_1x1_convolution(mlp_blob):
    graph, _ = read_blob(load_pte(mlp_blob).delegate_data(0, 0))
    values = {v.id_out: v for v in graph.values}
    fcs = [n for n in graph.nodes if n.kind == "XNNFullyConnected"]
    assert fcs and all(values[n.get("input1_id")].datatype == QINT8 and values[n.get("filter_id")].datatype == QCINT8
                       for n in fcs)
    handle = init(mlp_blob)
    try:  # the whole blob in one XNNPACK runtime: the rewritten fully connected needs no host step
        assert handle.summary["native_steps"] == 1 and handle.summary["host_steps"] == 0
        assert handle.summary["nodes"] == len(graph.nodes) + 2 * len(fcs)
    finally:
        XnnpackExecutor().destroy(handle)


def _int8_shuffles(handle) -> list[int]:
    """The element sizes of the handle's channel-shuffle operator steps."""
    return [s.op.element_size for s in handle.steps if isinstance(s, ShuffleStep)]


def test_int8_mobilenet_v2_matches_executorch():
    # NCHW -> NHWC int8 transpose on XNNPACK's 8-bit channel shuffle; the 1x1 [1, 1, 1, C] -> [1, C, 1, 1] one
    # becomes a reshape; the int8 global average pooling is rounded as newer XNNPACK does (the 2022 kernel is a
    # step off on ties)
    buffer, steps = compare(mobilenet_v2)
    assert steps == 0
    handle = init(buffer)
    try:  # 64x64 input: a 2x2 pooling with an odd zero point -> the host mean
        assert [s.label for s in handle.steps if "host" in s.label] == ["host[1 nodes: GlobalAvgPooling2d]"]
        assert _int8_shuffles(handle) == [1]
    finally:
        XnnpackExecutor().destroy(handle)


@pytest.mark.slow
def test_int8_mobilenet_v2_224_matches_executorch():
    buffer, steps = compare(lambda: mobilenet_v2(224))
    assert steps == 0
    handle = init(buffer)
    try:  # a 7x7 pooling has no ties: native; every step in XNNPACK, so the direct call (with the C glue)
        assert handle.summary["host_steps"] == 0 and _int8_shuffles(handle) == [1]
        assert (handle.direct is not None) == (glue_status()[0] == "c")
    finally:
        XnnpackExecutor().destroy(handle)


# -- the int8 mean ---------------------------------------------------------------------------------------------
def test_int8_mean_rounds_ties_to_even_on_the_raw_integers():
    x = np.array([1, 2, 2, 2, 3, 4, 4, 4, -3, -2, -2, -2, 127, 127, 127, 127], np.int8).reshape(4, 1, 4, 1)
    out = np.empty((4, 1), np.int8)
    int8_mean(x, (0.25, 0.0, -128, 127), out)  # shared scale and zero point (any): mean of the stored integers
    assert out.ravel().tolist() == [2, 4, -2, 127]  # 7/4, 15/4 round; -9/4 rounds; no overflow
    int8_mean(x, (0.25, 0.0, -128, 3), out)
    assert out.ravel().tolist() == [2, 3, -2, 3]
    x2 = np.array([0, 1, 2, 3], np.int8).reshape(1, 2, 2, 1)  # 6/4 = 1.5 -> 2 (even)
    int8_mean(x2, (0.25, 0.0, -128, 127), out[:1])
    assert out[0, 0] == 2
    with pytest.raises(ValueError):
        int8_mean(x.astype(np.int32), (0.25, 0.0, -128, 127), out)


# -- malformed int8 blobs: ProgramError before any native call -------------------------------------------------
def _fc_parts(graph):
    values = {v.id_out: v for v in graph.values}
    fc = next(n for n in graph.nodes if n.kind == "XNNFullyConnected")
    return values, fc


def _replace_value(graph, vid, **changes):
    graph.values = [dataclasses.replace(v, **changes) if v.id_out == vid else v for v in graph.values]


def _corrupt(buffer: bytes, how: str):
    graph, _ = read_blob(load_pte(buffer).delegate_data(0, 0))
    values, fc = _fc_parts(graph)
    f, b, y = values[fc.get("filter_id")], values[fc.get("bias_id")], values[fc.get("output_id")]
    if how == "filter_scales":
        _replace_value(graph, f.id_out, quant=PerChannelQuant([0.1] * 3, 0))
    elif how == "filter_channel_dim":
        _replace_value(graph, f.id_out, quant=dataclasses.replace(f.quant, channel_dim=1))
    elif how == "bias_dtype":
        _replace_value(graph, b.id_out, datatype=QINT8, quant=PerTensorQuant(0.1, 0))
    elif how == "output_dims":
        _replace_value(graph, y.id_out, dims=[y.dims[0], y.dims[1] + 1])
    elif how == "output_float":
        _replace_value(graph, y.id_out, datatype=1, quant=None)
    elif how == "flags":
        fc.fields["flags"] = 0x2
    elif how == "input_dims":
        _replace_value(graph, fc.get("input1_id"), dims=[3, 7])
    elif how == "missing_filter":
        fc.fields["filter_id"] = 999
    elif how == "input_unset":  # XNode.inputs() skips INVALID_ID: the check must not
        fc.fields["input1_id"] = INVALID_ID
    return graph


@pytest.mark.parametrize("how", ["filter_scales", "filter_channel_dim", "bias_dtype", "output_dims", "output_float",
                                 "flags", "input_dims", "missing_filter", "input_unset"])
def test_malformed_int8_fully_connected_is_a_program_error(mlp_blob, how):
    with pytest.raises(ProgramError):
        init(mlp_blob, _corrupt(mlp_blob, how))


def test_int8_transpose_must_keep_its_quantization():
    torch.manual_seed(0)
    buffer = lower_int8(*conv_relu_linear())
    graph, _ = read_blob(load_pte(buffer).delegate_data(0, 0))
    t = next(n for n in graph.nodes if n.kind == "XNNStaticTranspose")
    out = t.get("output_id")
    _replace_value(graph, out, quant=PerTensorQuant(0.5, 3))
    with pytest.raises(ProgramError, match="quantization"):
        init(buffer, graph)
    graph, _ = read_blob(load_pte(buffer).delegate_data(0, 0))
    t = next(n for n in graph.nodes if n.kind == "XNNStaticTranspose")
    t.fields["perm"] = [0, 1, 1, 2]
    with pytest.raises(ProgramError):
        init(buffer, graph)
