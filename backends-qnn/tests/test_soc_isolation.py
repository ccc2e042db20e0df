"""QNN's graph finalize runs in worker processes (one per HTP configuration): float32 and quantized partitions lower
in one program and in any order in one session, and a crash of QNN's libraries becomes an exception naming the
partition's ops and the signal. Oracles: eager PyTorch and the pt2e-converted model.

Named ``test_soc_*`` to run after the modules that build float32 graphs in the test process: running a quantized
program here creates a SoC-configured HTP device, after which the emulator prepares this process's float32 graphs
at fp16 precision (lowering is unaffected: it happens in workers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from qnn_models import build

import edgeport
from edgeport.errors import LoweringError
from edgeport.runtime import Runtime

pytestmark = pytest.mark.usefixtures("requires_qnn")


def _run(program, inputs) -> np.ndarray:
    method = Runtime.get().load_program(program.to_executorch().buffer).load_method("forward")
    return method.execute([x.numpy() for x in inputs])[0]


def _headers(program) -> list:
    from edgeport_qnn.blob import unpack_blob

    gm = program.exported_program().graph_module
    return [unpack_blob(getattr(gm, a).processed_bytes)[0] for a in sorted(dir(gm)) if a.startswith("lowered_module_")]


class _QuantThenFloat(torch.nn.Module):
    """linear + relu (quantized by QnnQuantizer), atan (not a QNN op: the CPU), then exp and a division, which
    QnnQuantizer leaves in float: a quantized and a float32 QnnBackend partition in one program."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(torch.atan(torch.relu(self.fc(x)))) / 3.0


def _sqnr(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(10 * np.log10((want ** 2).sum() / max(((got - want) ** 2).sum(), 1e-30)))


def test_float_and_quantized_partitions_in_one_program_any_order():
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeport_qnn import QnnPartitioner
    from edgeport_qnn.quantizer import QnnQuantizer

    torch.manual_seed(0)
    model, inputs = _QuantThenFloat().eval(), (torch.randn(2, 16),)
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), QnnQuantizer())
    for seed in range(4):
        prepared(torch.randn(2, 16, generator=torch.Generator().manual_seed(seed)))
    converted = convert_pt2e(prepared)
    program = edgeport.to_edge_transform_and_lower(torch.export.export(converted, inputs),
                                                   partitioner=[QnnPartitioner()])
    assert sorted(h.device for h in _headers(program)) == ["default", "soc"]
    # float32 after quantized in this session: still fp32-exact against eager (the default-device worker)
    mlp, mlp_inputs = build("mlp")
    got = _run(edgeport.to_edge_transform_and_lower(torch.export.export(mlp, mlp_inputs),
                                                    partitioner=[QnnPartitioner()]), mlp_inputs)
    ref = mlp(*mlp_inputs).detach().numpy()
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


def test_float_and_quantized_partitions_of_one_program_run_together():
    """The emulator runs contexts of one HTP configuration at a time (the other's ``graphExecute`` fails: "VTCM");
    the executor loads such a context again once and runs it (measured: 148 dB against the pt2e model)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeport_qnn import QnnPartitioner
    from edgeport_qnn.quantizer import QnnQuantizer

    torch.manual_seed(0)
    model, inputs = _QuantThenFloat().eval(), (torch.randn(2, 16),)
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), QnnQuantizer())
    for seed in range(4):
        prepared(torch.randn(2, 16, generator=torch.Generator().manual_seed(seed)))
    converted = convert_pt2e(prepared)
    with torch.no_grad():
        want = converted(*inputs).numpy()
    program = edgeport.to_edge_transform_and_lower(torch.export.export(converted, inputs),
                                                   partitioner=[QnnPartitioner()])
    method = Runtime.get().load_program(program.to_executorch().buffer).load_method("forward")
    for _ in range(3):
        assert _sqnr(method.execute([inputs[0].numpy()])[0], want) > 60


def test_a_crash_while_checking_nodes_becomes_a_rejection(monkeypatch):
    import qnn_crash

    from edgeport_qnn import QnnPartitioner, isolated, partitioner

    monkeypatch.setattr(isolated, "_ENTRY", qnn_crash.segfault)
    monkeypatch.setattr(partitioner, "_CACHE", {})  # ask the (crashing) backend again
    model, inputs = build("mlp")
    p = QnnPartitioner()
    program = edgeport.to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[p])
    assert p.rejections and all("SIGSEGV" in why and "crashed" in why for why in p.rejections.values())
    np.testing.assert_allclose(_run(program, inputs), model(*inputs).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_crash_while_lowering_a_partition_moves_it_to_the_cpu_or_is_a_lowering_error(monkeypatch):
    import qnn_crash

    from edgeport_qnn import QnnPartitioner, isolated, preprocess

    monkeypatch.setattr(isolated, "_ENTRY", qnn_crash.segfault_when_serializing)
    monkeypatch.setattr(preprocess, "_FINALIZED", {})
    model, inputs = build("mlp")
    # the partitioner test-finalizes each partition: the crash refuses it, naming the signal, and the CPU runs it
    p = QnnPartitioner()
    program = edgeport.to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[p])
    assert p.refusals and all(r.signal == "SIGSEGV" for r in p.refusals)
    assert p.rejections and all("killed by SIGSEGV" in why for why in p.rejections.values()), p.rejections
    np.testing.assert_allclose(_run(program, inputs), model(*inputs).detach().numpy(), rtol=1e-5, atol=1e-6)
    # without the test compilation, the crash in preprocess is a LoweringError naming the partition
    with pytest.raises(LoweringError) as info:
        edgeport.to_edge_transform_and_lower(torch.export.export(model, inputs),
                                             partitioner=[QnnPartitioner(trial_compile=False)])
    message = str(info.value)
    assert "partition" in message and "killed by SIGSEGV" in message and "FullyConnected" in message, message
    assert "aten.linear.default" in message, message
    monkeypatch.undo()  # the next lowering starts a fresh worker
    got = _run(edgeport.to_edge_transform_and_lower(torch.export.export(model, inputs),
                                                    partitioner=[QnnPartitioner()]), inputs)
    np.testing.assert_allclose(got, model(*inputs).detach().numpy(), rtol=1e-5, atol=1e-6)


class _Multiplies(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.relu(x * 1.5) * x * 0.5 + x)


def test_a_partition_refused_whole_shrinks_by_bisection(monkeypatch):
    """Each node validates alone; the graph of the partition is refused only whole, with no node named: the
    partition shrinks (bisection) until every delegate finalizes, and the program still matches eager."""
    import qnn_crash

    from edgeport_qnn import QnnPartitioner, isolated, preprocess

    monkeypatch.setattr(isolated, "_ENTRY", qnn_crash.refuse_two_multiplies)
    monkeypatch.setattr(preprocess, "_FINALIZED", {})
    x = torch.randn(4, 16)
    p = QnnPartitioner()
    program = edgeport.to_edge_transform_and_lower(torch.export.export(_Multiplies(), (x,)), partitioner=[p])
    assert p.refusals and all("bisection" in r.how and "planted refusal" in r.message for r in p.refusals)
    moved = [name for r in p.refusals for name in r.culprits]
    assert moved and all("planted refusal" in p.rejections[name] for name in moved)
    gm = program.exported_program().graph_module
    assert sum("call_delegate" in str(n.target) for n in gm.graph.nodes) >= 1
    np.testing.assert_allclose(_run(program, (x,)), _Multiplies()(x).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(LoweringError, match="planted refusal"):
        edgeport.to_edge_transform_and_lower(torch.export.export(_Multiplies(), (x,)),
                                             partitioner=[QnnPartitioner(trial_compile=False)])


class _Zero(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(x), x[:, :0] * 2.0


def test_dynamic_and_zero_element_tensors_are_refused_at_partition_time():
    from edgeport_qnn import QnnPartitioner

    model, inputs = _Zero(), (torch.randn(2, 8),)
    p = QnnPartitioner()
    program = edgeport.to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[p])
    assert any("no elements" in why for why in p.rejections.values()), p.rejections
    got = Runtime.get().load_program(program.to_executorch().buffer).load_method("forward").execute([inputs[0].numpy()])
    np.testing.assert_allclose(got[0], torch.relu(inputs[0]).numpy())
    assert got[1].shape == (2, 0)

    seq = torch.export.Dim("seq", min=2, max=16)
    dyn = torch.export.export(torch.nn.Linear(8, 8).eval(), (torch.randn(1, 4, 8),),
                              dynamic_shapes=({1: seq},))
    p = QnnPartitioner()
    edgeport.to_edge_transform_and_lower(dyn, partitioner=[p])  # no exception out of partition
    assert any("dynamic shape" in why for why in p.rejections.values()), p.rejections
