"""Quantized models lowered to TOSABackend (TOSA-1.0+INT) and EthosUBackend, run on Arm's TOSA reference model.

Oracles: the pt2e-converted torch model (what the integer graph computes in fake-quantized float: SQNR >= 35 dB
and within one output quantization step on >= 99% of elements) and fp32 eager (SQNR >= 20 dB). The stock
ExecuTorch runtime (no Arm backend in its wheel) must refuse the programs cleanly, in a child process.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from arm_models import MODELS, build, quantize_and_lower, run, sqnr_db

from edgeport_arm import (
    EthosUCompileSpec,
    EthosUPartitioner,
    EthosUQuantizer,
    TosaCompileSpec,
    TOSAPartitioner,
    TOSAQuantizer,
)
from edgeport_arm.keys import estimates_key


def _output_step(converted_graph: torch.fx.GraphModule) -> float:
    """Scale of the last dequantize before the output (one quantization step of the result)."""
    out = next(n for n in converted_graph.graph.nodes if n.op == "output")
    node = out.args[0][0]
    while node.op == "call_function" and "dequantize" not in str(node.target):
        node = node.args[0]
    return float(node.args[1])


# Fraction of output elements that must lie within one quantization step of the pt2e model (default 0.99).
_WITHIN_ONE_STEP: dict[str, float] = {}


def _check(lowered, method, name: str, runs: int = 8) -> None:
    gen = torch.Generator().manual_seed(5)
    inputs = [lowered.example] + [torch.randn(lowered.example.shape, generator=gen) for _ in range(runs - 1)]
    got = np.concatenate([np.asarray(method.execute([x])[0]).ravel() for x in inputs])
    expect = np.concatenate([lowered.converted(x).detach().numpy().ravel() for x in inputs])
    eager = np.concatenate([lowered.model(x).detach().numpy().ravel() for x in inputs])
    step = _output_step(lowered.converted)
    within = float(np.mean(np.abs(got - expect) <= step * 1.001))
    assert sqnr_db(expect, got) >= 35.0, f"SQNR vs pt2e {sqnr_db(expect, got):.1f} dB"
    need = _WITHIN_ONE_STEP.get(name, 0.99)
    assert within >= need, f"only {within:.3f} of elements within one step ({step:g}) of the pt2e model"
    assert sqnr_db(eager, got) >= 20.0, f"SQNR vs fp32 eager {sqnr_db(eager, got):.1f} dB"


def _fully_delegated(program, backend_id: str) -> None:
    summary = program.delegation_summary()
    assert f"delegated to {backend_id}: 1 call(s)" in summary, summary
    kernels = [line for line in summary.splitlines() if line.strip().startswith("portable")]
    assert all("quantize_per_tensor" in k for k in kernels), kernels  # only the I/O quantize / dequantize


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tosa_int8_matches_pt2e_and_eager(name):
    model, x = build(name)
    spec = TosaCompileSpec("TOSA-1.0+INT")
    lowered = quantize_and_lower(model, x, TOSAQuantizer(spec), TOSAPartitioner(spec))
    _fully_delegated(lowered.program, "TOSABackend")
    _, method = run(lowered.program.buffer, [x])
    _check(lowered, method, name)
    assert method.profile.delegates[0].execution.startswith("Arm's TOSA reference model")


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
@pytest.mark.parametrize("name", ["conv_block", "keyword_spotter", "mlp"])
def test_ethos_u_compiles_with_vela_and_runs_as_reference(name, target):
    model, x = build(name)
    spec = EthosUCompileSpec(target)
    lowered = quantize_and_lower(model, x, EthosUQuantizer(spec), EthosUPartitioner(spec))
    _fully_delegated(lowered.program, "EthosUBackend")
    _, method = run(lowered.program.buffer, [x])
    _check(lowered, method, name)
    info = method.profile.delegates[0]
    assert "reference execution" in info.execution and "not the Ethos-U NPU" in info.execution
    # Vela's estimates are kept beside the blob: every operator on the NPU, real cycle and memory numbers
    from edgeport.program.reader import load_pte

    lp = load_pte(lowered.program.buffer)
    blob = bytes(lp.delegate_data(0, 0))
    est = json.loads(bytes(lp.named_data(estimates_key(blob))).decode())
    assert est["target"] == target and est["cpu_ops"] == 0 and est["npu_ops"] >= 1
    assert est["cycles_npu"] > 0 and est["macs"] > 0 and est["sram_used_kib"] > 0
    # and shown where users look: the delegation summary and edgeport inspect
    assert f"delegate 0: Vela {target}: {est['cycles_npu']:,.0f} NPU cycles" in lowered.program.delegation_summary()


def test_ethos_u_refuses_float_leftovers_by_name():
    model, x = build("conv_block")
    spec = EthosUCompileSpec("ethos-u55-128")
    # leave the depthwise convolution in float: the NPU cannot run it
    quantizer = EthosUQuantizer(spec, node_filter=lambda n: "conv2d_1" not in n.name)
    from edgeport.errors import LoweringError

    with pytest.raises(LoweringError, match=r"would run in float on the CPU[\s\S]*convolution_1[\s\S]*cpu_fallback"):
        quantize_and_lower(model, x, quantizer, EthosUPartitioner(spec))
    # asked for, the fallback is allowed and the result still matches
    lowered = quantize_and_lower(model, x, quantizer, EthosUPartitioner(spec, cpu_fallback=True))
    outs, _ = run(lowered.program.buffer, [x])
    assert sqnr_db(lowered.converted(x).detach().numpy(), outs[0]) >= 35.0


def test_float_tosa_matches_eager():
    model, x = build("conv_block")
    ep = torch.export.export(model, (x,))
    from edgeport import to_edge_transform_and_lower

    program = to_edge_transform_and_lower(ep, partitioner=[TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))]
                                          ).to_executorch()
    outs, _ = run(program.buffer, [x])
    np.testing.assert_allclose(outs[0], model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.executorch
def test_stock_runtime_refuses_arm_programs_without_crashing():
    pytest.importorskip("executorch.runtime")
    from edgeport.testing.stock_runtime import run_cases

    cases = []
    for backend in ("tosa", "ethos"):
        model, x = build("mlp")
        if backend == "tosa":
            spec = TosaCompileSpec()
            lowered = quantize_and_lower(model, x, TOSAQuantizer(spec), TOSAPartitioner(spec))
        else:
            spec = EthosUCompileSpec("ethos-u55-128")
            lowered = quantize_and_lower(model, x, EthosUQuantizer(spec), EthosUPartitioner(spec))
        cases.append((backend, lowered.program.buffer, "forward", [x]))
    for result in run_cases(cases):
        assert result.crash is None, result.describe()
        assert result.error is not None and "Failed to load method" in result.error, result.describe()
