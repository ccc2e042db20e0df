"""``CoreMLQuantizer`` with torchao 0.18's pt2e flow: the quantized graph lowers to one Core ML delegate whose ML
program has Core ML's quantized ops, and whose weights are the pt2e model's own int8 weights.

Oracle: the pt2e-converted torch model (``convert_pt2e``): its ``dequantize_per_channel`` nodes carry the int8
weights, scales and zero points torchao computed; the ML program's ``constexpr_affine_dequantize`` /
``constexpr_blockwise_shift_scale`` inputs must be those integers exactly, with the same scales, so the
dequantized weights agree within float rounding."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from coreml_models import build, load_package, mil_ops
from test_compression import _decode

from edgeport import to_edge_transform_and_lower
from edgeport.program.reader import load_pte
from edgeport_coreml import CoreMLPartitioner, generate_compile_specs
from edgeport_coreml.quantizer import CoreMLQuantizer, QuantizationSettings


def _pt2e(name: str, quantizer: CoreMLQuantizer):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    model, x = build(name)
    m = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    torch.manual_seed(1)
    for _ in range(4):
        m(torch.randn_like(x))
    m(x)
    return convert_pt2e(m), x


@functools.cache
def _lowered(name: str, mode: str, target: str):
    q = CoreMLQuantizer.int8_static() if mode == "static" else CoreMLQuantizer.int8_weight_only()
    m, x = _pt2e(name, q)
    p = CoreMLPartitioner(generate_compile_specs(minimum_deployment_target=target, compute_precision="float32"))
    program = to_edge_transform_and_lower(torch.export.export(m, (x,)), partitioner=[p]).to_executorch().buffer
    return m, x, p, bytes(program)


def _pt2e_weights(m) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(int8 weight, scales, zero points) of every per-channel dequantize in the pt2e model."""
    out = []
    for node in m.graph.nodes:
        if node.op == "call_function" and "dequantize_per_channel" in str(node.target):
            q, s, z = (getattr(m, a.target).detach().numpy() for a in node.args[:3])
            out.append((q, s, z))
    return out


def _mil_weight_ops(blob: bytes):
    from coremltools.converters.mil.frontend.milproto.load import load as load_mil

    root, mlmodel = load_package(blob)
    spec = mlmodel.get_spec()
    prog = load_mil(spec, spec.specificationVersion, str(root / "model.mlpackage/Data/com.apple.CoreML/weights"))
    return [op for f in prog.functions.values() for op in f.operations
            if op.op_type in ("constexpr_affine_dequantize", "constexpr_blockwise_shift_scale")], spec


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("mode, target", [("static", "iOS17"), ("weight_only", "iOS16"), ("static", "iOS18")])
def test_quantized_graph_lowers_with_the_pt2e_weights(name, mode, target):
    m, x, p, program = _lowered(name, mode, target)
    assert p.rejections == {}
    assert len(load_pte(program).program.execution_plan[0].delegates) == 1
    blob = bytes(load_pte(program).delegate_data(0, 0))
    ops, spec = _mil_weight_ops(blob)
    kinds = set(mil_ops(spec))
    if mode == "static":
        assert {"quantize", "dequantize"} <= kinds, kinds
    else:
        assert not {"quantize", "dequantize"} & kinds
    want = _pt2e_weights(m)
    assert len(ops) == len(want) == 3
    by_shape = {q.shape: (q, s, z) for q, s, z in want}
    for op in ops:
        v = {k: np.asarray(i.val) for k, i in op.inputs.items()}
        data = v.get("quantized_data", v.get("data"))
        q, s, z = by_shape[data.shape]
        np.testing.assert_array_equal(data, q)  # the pt2e model's integers, exactly
        scale = v["scale"].reshape(-1)
        np.testing.assert_allclose(scale, s, rtol=1e-6)
        zp = v.get("zero_point", v.get("offset", np.zeros(1))).reshape(-1)
        assert np.all(zp == 0) and np.all(z == 0)
        dq, _ = _decode(op)
        expected = torch.ops.quantized_decomposed.dequantize_per_channel(
            torch.from_numpy(q), torch.from_numpy(s), torch.from_numpy(z), 0, -127, 127, torch.int8).numpy()
        np.testing.assert_allclose(dq, expected, rtol=1e-6, atol=1e-9)


def test_static_needs_ios17_and_says_so():
    m, x, p, program = _lowered("mlp", "static", "iOS16")
    reasons = set(p.rejections.values())
    assert reasons and all("need minimum_deployment_target iOS17" in r for r in reasons), reasons
    assert len(load_pte(program).program.execution_plan[0].delegates) >= 1  # the float ops still go to Core ML


def test_coremltools_config_is_read():
    qconfig = pytest.importorskip("coremltools.optimize.torch.quantization.quantization_config")
    cfg = qconfig.LinearQuantizerConfig(global_config=qconfig.ModuleLinearQuantizerConfig(
        quantization_scheme="symmetric", activation_dtype=torch.quint8, weight_dtype=torch.qint8,
        weight_per_channel=True))
    assert CoreMLQuantizer(cfg).settings == QuantizationSettings()
    wo = qconfig.LinearQuantizerConfig(global_config=qconfig.ModuleLinearQuantizerConfig(
        quantization_scheme="symmetric", activation_dtype=torch.float32, weight_dtype=torch.qint8,
        weight_per_channel=True))
    assert CoreMLQuantizer(wo).settings == QuantizationSettings(activation_dtype=None)
    with pytest.raises(ValueError, match="weight_n_bits=4 is not supported"):
        CoreMLQuantizer(qconfig.LinearQuantizerConfig(global_config=qconfig.ModuleLinearQuantizerConfig(
            weight_dtype="qint4", activation_dtype=torch.float32)))


def test_coremltools_own_quantizer_does_not_import_on_this_torch():
    """Why CoreMLQuantizer annotates itself: coremltools 9.0's pt2e quantizer needs torch.ao's quantizer module."""
    with pytest.raises(ImportError, match="torch.ao.quantization.quantizer"):
        import coremltools.optimize.torch.quantization._coreml_quantizer  # noqa: F401


def test_bad_settings():
    with pytest.raises(ValueError, match="activation_dtype must be"):
        QuantizationSettings(activation_dtype=torch.float16)
    with pytest.raises(ValueError, match="symmetric weights need weight_dtype=torch.qint8"):
        QuantizationSettings(weight_dtype=torch.quint8)
