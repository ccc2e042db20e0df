"""Dynamic int8 linears: XnnpackQuantizer(dynamic=True), lowering to qdint8 x qcint8 fully connected, both runtimes.

Oracles: the float32 eager model (SQNR), ExecuTorch 1.5.1's runtime running the int8 kernels of its own XNNPACK
(edgeport's executor emulates them on the 2022 library: it must agree to float32 rounding), and ExecuTorch's own
lowering of the same quantized model.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn
from xnn_helpers import (
    blob_nodes,
    delegate_count,
    lower_edgeport,
    needs_xnnpack,
    rel_err,
    run_edgeport,
    run_executorch,
    sqnr,
)

from edgeport_xnnpack._dynamic_quant import dequantize_filter, quantize_rows, row_params
from edgeport_xnnpack.schema.graph import FP32, QCINT8, QDINT8, PerTokenDynamicQuant
from edgeport_xnnpack.schema.reader import read_blob
from edgeport_xnnpack.schema.writer import serialize

pytest.importorskip("torchao")
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402

from edgeport_xnnpack.quantizer import XnnpackQuantizer  # noqa: E402

MIN_SQNR = 20.0
AGREE = 1e-5  # edgeport's emulation vs ExecuTorch's int8 kernels, relative to the output's scale


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(64, 96), nn.Linear(96, 96), nn.Linear(96, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class SharedInput(nn.Module):
    """Two linears reading the same input (one convert shared), one 3-D input."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(32, 16), nn.Linear(32, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) * self.k(x)


def dynamic(model: nn.Module, args: tuple, **options) -> torch.fx.GraphModule:
    prepared = prepare_pt2e(torch.export.export(model.eval(), args).module(), XnnpackQuantizer(dynamic=True, **options))
    prepared(*args)  # no calibration needed: one call runs the placeholder observers
    return convert_pt2e(prepared)


# -- the numerics ---------------------------------------------------------------------------------------------
def test_row_quantization_edge_cases():
    x = np.array([[0, 0, 0, 0], [1, 1, 1, 1], [-2, -1, 0, 1], [3, 5, 7, 9], [-9, -7, -5, -3]], np.float32)
    out = np.empty_like(x)
    quantize_rows(x, out)
    inv, zp = row_params(x)
    assert np.array_equal(out[0], x[0]) and inv[0] == 1  # an all-zero row: scale 1, exact
    assert np.all((zp >= -128) & (zp <= 127)) and np.array_equal(zp, np.rint(zp))
    # ranges are widened to contain 0, so 0 is exact and every value is within half a step
    assert np.all(np.abs(out - x) <= 0.5 / inv[:, None] * (1 + 1e-6))
    assert out[3, 0] == pytest.approx(3, abs=0.5 * 9 / 255) and out[4, 3] == pytest.approx(-3, abs=0.5 * 9 / 255)
    x3 = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    o3 = np.empty_like(x3)
    quantize_rows(x3, o3, num_nonbatch_dims=2)  # rows of 3 x 8 values
    assert len(np.unique(np.round(np.diff(np.sort(np.unique(o3[0]))), 5))) >= 1
    with pytest.raises(ValueError, match="float32"):
        quantize_rows(x.astype(np.float64), out)
    with pytest.raises(ValueError, match="num_nonbatch_dims"):
        quantize_rows(x, out, num_nonbatch_dims=3)


def test_filter_dequantization_is_exact():
    w = np.arange(-127, 128, dtype=np.int8)[:250].reshape(10, 25)
    s = np.linspace(0.001, 0.1, 10).astype(np.float32)
    f = dequantize_filter(w, s, 0)
    assert f.dtype == np.float32 and np.array_equal(f, (w.astype(np.float64) * s[:, None]).astype(np.float32))
    with pytest.raises(ValueError, match="scales"):
        dequantize_filter(w, s[:3], 0)


# -- the quantizer and the lowering ---------------------------------------------------------------------------
def test_quantizer_dynamic_annotates_linears_only():
    args = (torch.randn(4, 64),)
    cm = dynamic(Mlp(), args)
    ops = Counter(str(n.target) for n in cm.graph.nodes if n.op == "call_function")
    assert ops["quantized_decomposed.choose_qparams.tensor"] == 3
    assert ops["quantized_decomposed.quantize_per_tensor.tensor"] == 3
    assert ops["quantized_decomposed.dequantize_per_channel.default"] == 3
    assert "quantized_decomposed.quantize_per_tensor.default" not in ops  # outputs stay float


@needs_xnnpack
@pytest.mark.parametrize("model,shape", [(Mlp, (4, 64)), (SharedInput, (2, 5, 32))])
def test_dynamic_linear_lowered_and_matches_executorch(model, shape):
    torch.manual_seed(0)
    m = model().eval()
    args = (torch.randn(shape),)
    cm = dynamic(m, args)
    edge, buffer, _ = lower_edgeport(cm, args)
    assert delegate_count(edge) == 1
    kinds = blob_nodes(edge)
    n_linear = 3 if model is Mlp else 2
    assert kinds[("XNNFullyConnected", FP32)] == n_linear
    assert kinds[("XNNConvert", QDINT8)] == (3 if model is Mlp else 1)
    for name, module in edge.exported_program().graph_module.named_children():
        if name.startswith("lowered_module"):
            graph, _ = read_blob(module.processed_bytes)
            assert all(isinstance(v.quant, PerTokenDynamicQuant) for v in graph.values if v.datatype == QDINT8)
            assert sum(v.datatype == QCINT8 for v in graph.values) == n_linear
    g = torch.Generator().manual_seed(7)
    for _ in range(4):
        x = (torch.randn(shape, generator=g) * 3,)
        with torch.no_grad():
            ref = m(*x).numpy()
        et = run_executorch(buffer, x)
        ours = run_edgeport(buffer, x)
        assert sqnr(ref, et) >= MIN_SQNR
        assert rel_err(ours, et) <= AGREE, "edgeport's emulation differs from ExecuTorch's int8 kernels"


@needs_xnnpack
def test_executorch_written_dynamic_blob_runs_on_edgeport():
    pytest.importorskip("executorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(1)
    m = Mlp().eval()
    args = (torch.randn(4, 64),)
    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
    prepared = prepare_pt2e(torch.export.export(m, args).module(), q)
    prepared(*args)
    ep = torch.export.export(convert_pt2e(prepared), args)
    buffer = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    for seed in range(3):
        x = (torch.randn(4, 64, generator=torch.Generator().manual_seed(seed)),)
        assert rel_err(run_edgeport(buffer, x), run_executorch(buffer, x)) <= AGREE


def test_qdint8_values_round_trip_through_the_schema():
    from edgeport_xnnpack.schema.graph import Graph, TensorValue, XNode

    g = Graph(values=[TensorValue(FP32, [2, 8], 0, external_id=0, flags=1),
                      TensorValue(QDINT8, [2, 8], 1, quant=PerTokenDynamicQuant(1)),
                      TensorValue(FP32, [2, 8], 2, external_id=1, flags=2)],
              nodes=[XNode("XNNConvert", {"input_id": 0, "output_id": 1, "flags": 0}),
                     XNode("XNNConvert", {"input_id": 1, "output_id": 2, "flags": 0})],
              num_externs=2, input_ids=[0], output_ids=[2])
    back, _ = read_blob(serialize(g, b""))
    assert back.values[1].datatype == QDINT8 and back.values[1].quant == PerTokenDynamicQuant(1)
