"""ExecuTorch 1.5.1's own TOSA programs (its Arm quantizer + TOSAPartitioner) run on edgeport's runtime and give
exactly what ExecuTorch's TOSA blob gives on Arm's reference model (the oracle: the blob run directly, with the
program's own input quantization and output dequantization)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arm_models import build, run

pytestmark = pytest.mark.executorch


@pytest.mark.parametrize("name", ["conv_block", "mlp"])
def test_executorch_tosa_program_runs_on_edgeport(name):
    pytest.importorskip("executorch.backends.arm.tosa.partitioner")
    import tosa_reference_model as rm
    from executorch.backends.arm.quantizer import TOSAQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    model, x = build(name)
    spec = TosaCompileSpec("TOSA-1.0+INT")
    quantizer = TOSAQuantizer(spec)
    quantizer.set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(check_guards=False), quantizer)
    prepared(x)
    converted = convert_pt2e(prepared)
    edge = to_edge_transform_and_lower(torch.export.export(converted, (x,)), partitioner=[TOSAPartitioner(spec)])
    graph = edge.exported_program().graph
    quant = next(n for n in graph.nodes if "quantize_per_tensor" in str(n.target)
                 and "dequantize" not in str(n.target))
    dequant = [n for n in graph.nodes if "dequantize_per_tensor" in str(n.target)][-1]
    blob = edge.exported_program().graph_module.lowered_module_0.processed_bytes
    pte = edge.to_executorch().buffer

    outs, method = run(pte, [x])
    assert method.profile.delegates[0].backend_id == "TOSABackend"
    q_in = np.clip(np.round(x.numpy() / quant.args[1]) + quant.args[2], -128, 127).astype(np.int8)
    ref, status = rm.run(blob, [q_in])
    assert status.name == "TOSA_VALID"
    expect = (ref[0].astype(np.float32) - dequant.args[2]) * np.float32(dequant.args[1])
    np.testing.assert_array_equal(outs[0].reshape(-1), expect.reshape(-1))


def test_executorch_ethos_u_program_is_refused_clearly():
    """ExecuTorch's Ethos-U programs carry only Vela's command stream: edgeport reads the stream (it is valid) and
    says it needs the NPU, instead of pretending to run it."""
    pytest.importorskip("executorch.backends.arm.ethosu")
    from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
    from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeport.errors import ProgramError
    from edgeport.program.reader import load_pte
    from edgeport_arm.schema.vela_stream import parse_vela_stream

    model, x = build("mlp")
    spec = EthosUCompileSpec("ethos-u55-128")
    quantizer = EthosUQuantizer(spec)
    quantizer.set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(check_guards=False), quantizer)
    prepared(x)
    ep = torch.export.export(convert_pt2e(prepared), (x,))
    pte = to_edge_transform_and_lower(ep, partitioner=[EthosUPartitioner(spec)]).to_executorch().buffer
    stream = parse_vela_stream(load_pte(pte).delegate_data(0, 0))
    assert stream.cmd_data and stream.inputs and stream.outputs
    with pytest.raises(ProgramError, match="can only run on an Ethos-U NPU"):
        run(pte, [x])
