"""a16w8 (int16 activations, int8 weights) on TOSABackend (``TOSA-1.0+INT+int16``) and EthosUBackend.

Oracles: the pt2e-converted torch model (SQNR >= 35 dB, >= 99% of elements within one output step) and fp32
eager (SQNR >= 20 dB), on Arm's TOSA reference model; Vela must put every operator on the NPU.
"""

from __future__ import annotations

import json

import pytest
import torch
from arm_models import quantize_and_lower, run, sqnr_db
from test_int8_models import _check, _fully_delegated

from edgeport_arm import (
    EthosUCompileSpec,
    EthosUPartitioner,
    EthosUQuantizer,
    TosaCompileSpec,
    TOSAPartitioner,
    TOSAQuantizer,
)
from edgeport_arm.keys import estimates_key


class SmallCnn(torch.nn.Module):
    """conv + relu, depthwise conv + relu, residual add, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        z = torch.relu(self.dw(y)) + y
        return self.fc(z.reshape(1, -1))


def _model() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return SmallCnn().eval(), torch.randn(1, 3, 8, 8)


def test_a16w8_tosa_int16_matches_pt2e_and_eager():
    model, x = _model()
    spec = TosaCompileSpec("TOSA-1.0+INT+int16")
    lowered = quantize_and_lower(model, x, TOSAQuantizer(spec, a16w8=True), TOSAPartitioner(spec))
    _fully_delegated(lowered.program, "TOSABackend")
    qs = [n for n in lowered.converted.graph.nodes if "quantize_per_tensor" in str(n.target)]
    assert qs and all(n.args[5] == torch.int16 for n in qs)  # activations are int16 throughout
    _, method = run(lowered.program.buffer, [x])
    _check(lowered, method, "a16w8_cnn")
    # int16 is finer than int8: the same model in int8 is further from eager
    spec8 = TosaCompileSpec("TOSA-1.0+INT")
    lowered8 = quantize_and_lower(model, x, TOSAQuantizer(spec8), TOSAPartitioner(spec8))
    eager = model(x).detach().numpy()
    out16 = run(lowered.program.buffer, [x])[0][0]
    out8 = run(lowered8.program.buffer, [x])[0][0]
    assert sqnr_db(eager, out16) > sqnr_db(eager, out8) + 6.0


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_a16w8_ethos_u_all_on_the_npu(target):
    from edgeport.program.reader import load_pte

    model, x = _model()
    spec = EthosUCompileSpec(target)
    lowered = quantize_and_lower(model, x, EthosUQuantizer(spec, a16w8=True), EthosUPartitioner(spec))
    _fully_delegated(lowered.program, "EthosUBackend")
    lp = load_pte(lowered.program.buffer)
    est = json.loads(bytes(lp.named_data(estimates_key(bytes(lp.delegate_data(0, 0))))).decode())
    assert est["cpu_ops"] == 0 and est["npu_ops"] >= 3, est
    _, method = run(lowered.program.buffer, [x])
    _check(lowered, method, "a16w8_cnn", runs=4)


def test_a16w8_without_int16_extension_is_refused():
    with pytest.raises(ValueError, match="int16 extension"):
        TOSAQuantizer(TosaCompileSpec("TOSA-1.0+INT"), a16w8=True)


def test_a16w8_ops_without_int16_lowering_stay_on_the_cpu_by_name():
    class Gate(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(self.fc(x))

    torch.manual_seed(0)
    model, x = Gate().eval(), torch.randn(1, 8)
    spec = EthosUCompileSpec("ethos-u85-256")
    from edgeport.errors import LoweringError

    with pytest.raises(LoweringError, match=r"sigmoid[\s\S]*no int16 \(a16w8\) lowering"):
        quantize_and_lower(model, x, EthosUQuantizer(spec, a16w8=True), EthosUPartitioner(spec))
