"""End to end: torch.export -> QnnPartitioner -> .pte -> edgeport's runtime (QNN HTP; x86-64: the emulator)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from qnn_models import build

import edgeport
from edgeport.runtime import Runtime

pytestmark = pytest.mark.usefixtures("requires_qnn")


def lower(name: str, partitioner=None):
    from edgeport_qnn import QnnPartitioner

    model, inputs = build(name)
    p = partitioner or QnnPartitioner()
    program = edgeport.to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[p])
    return model, inputs, p, program


def run_and_compare(model, inputs, program) -> float:
    pte = program.to_executorch()
    method = Runtime.get().load_program(pte.buffer).load_method("forward")
    (out,) = method.execute([x.numpy() for x in inputs])
    ref = model(*inputs).detach().numpy()
    err = float(np.abs(out - ref).max() / np.abs(ref).max())
    assert err <= 1e-4, f"max error {err:.3g} relative to the output's scale"
    return err


def delegated_ops(program) -> list[str]:
    gm = program.exported_program().graph_module
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "getitem" not in str(n.target)]


@pytest.mark.parametrize("name", ["mlp", "cnn", "encoder"])
def test_model_fully_delegated_matches_eager(name):
    model, inputs, p, program = lower(name)
    assert p.rejections == {}
    assert delegated_ops(program) == ["edgeport.call_delegate.default"]
    run_and_compare(model, inputs, program)


def test_partitioner_takes_executorch_compile_specs():
    from edgeport_qnn import (
        QcomChipset,
        QnnCompileOptions,
        QnnPartitioner,
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
    )

    specs = generate_qnn_executorch_compiler_spec(soc_model=QcomChipset.SM8550,
                                                  backend_options=generate_htp_compiler_spec(use_fp16=False))
    assert QnnCompileOptions.from_compile_specs(specs) == QnnCompileOptions(soc_model="SM8550")
    p = QnnPartitioner(specs)
    assert p.compile_options.chipset is QcomChipset.SM8550
    with pytest.raises(ValueError, match="known keys"):
        QnnPartitioner([edgeport.CompileSpec("bogus", b"1")])
    with pytest.raises(ValueError, match="unknown soc_model"):
        QnnCompileOptions(soc_model="SM0000")


def test_blob_header_and_describe(requires_qnn):
    from edgeport_qnn.blob import describe_blob, unpack_blob

    _, _, _, program = lower("mlp")
    blob = _only_blob(program)
    header, binary = unpack_blob(blob)
    assert header.soc_model == "SM8650" and header.qnn_build and header.ops["FullyConnected"] == 3
    info = describe_blob(blob)
    assert info["inputs"] == [{"shape": [2, 16], "dtype": "float32"}]
    assert info["context_binary_bytes"] == len(binary)
    with pytest.raises(ValueError):
        describe_blob(b"garbage" * 10)


def _only_blob(program) -> bytes:
    return bytes(program.exported_program().graph_module.lowered_module_0.processed_bytes)


class _Fn(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


@pytest.mark.parametrize("fn, shapes, node, qnn_op", [
    (lambda a, b: torch.maximum(a, b), [(1, 2, 1, 2, 3)] * 2, "maximum", "ElementWiseMaximum"),
    (lambda a, b: torch.cat([a, b], 1), [(1, 2, 1, 2, 1, 2)] * 2, "cat", "Concat"),
])
def test_backend_refusal_is_recorded_and_runs_on_cpu(fn, shapes, node, qnn_op):
    """The table claims these ops, the HTP refuses these shapes: the partitioner records QNN's answer."""
    from edgeport_qnn import QnnPartitioner

    inputs = tuple(torch.randn(s) for s in shapes)
    model = _Fn(fn)
    p = QnnPartitioner()
    program = edgeport.to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[p])
    assert "the QNN HTP backend refuses it" in p.rejections[node] and qnn_op in p.rejections[node]
    assert "edgeport.call_delegate.default" not in delegated_ops(program)
    (out,) = Runtime.get().load_program(program.to_executorch().buffer).load_method("forward").execute(
        [x.numpy() for x in inputs])
    np.testing.assert_array_equal(out, fn(*inputs).numpy())


@pytest.mark.parametrize("dilation", [1, 2, 3, 4])
def test_dilated_depthwise_conv_matches_eager(dilation):
    """48 channels, dilation 3-4 (MobileNetV2 + DeepLabV3's atrous blocks): the HTP's fp32 DepthWiseConv2d computes
    garbage there (errors up to 1e34 or NaN), so these lower to Conv2d with groups; dilation 1-2 stays depthwise."""
    from edgeport_qnn import QnnPartitioner
    from edgeport_qnn.blob import unpack_blob

    torch.manual_seed(dilation)
    model = torch.nn.Sequential(torch.nn.Conv2d(48, 48, 3, padding=dilation, dilation=dilation, groups=48),
                                torch.nn.ReLU6()).eval()
    inputs = (torch.randn(1, 48, 9, 9),)
    program = edgeport.to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[QnnPartitioner()])
    run_and_compare(model, inputs, program)
    header, _ = unpack_blob(_only_blob(program))
    assert header.ops.get("DepthWiseConv2d" if dilation <= 2 else "Conv2d") == 1
