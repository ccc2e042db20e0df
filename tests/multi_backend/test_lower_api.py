"""``edgeport.lower``: profiles, strict mode, bad input, quantization by ownership, load-time fallback policy."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import edgeport
from edgeport.errors import BackendNotFoundError, PartitionError
from edgeport.targets import PROFILES, resolve_profile

pytest.importorskip("edgeport_xnnpack")


class SinNet(torch.nn.Module):
    """conv -> relu -> max_pool2d -> flatten -> linear -> sin (sin: on no backend here but Core ML)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return torch.sin(self.fc(y.flatten(1)))


def _model() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return SinNet().eval(), torch.randn(1, 3, 8, 8)


def test_cpu_profile_matches_eager_and_reports_the_cpu_op() -> None:
    model, x = _model()
    stages: list[str] = []
    manager = edgeport.lower(model, (x,), target="cpu", progress=stages.append)
    assert stages == ["export", "partition", "preprocess: XnnpackBackend", "serialize"]
    report = manager.lowering_report
    assert [b for b, _ in report.delegates] == ["XnnpackBackend"]
    assert [op for _, op, _ in report.portable_ops] == ["aten.sin.default"]
    assert "not in the XnnpackBackend capability table" in report.portable_ops[0][2]
    assert "XnnpackBackend" in report.table()
    out = edgeport.load(manager.buffer)(x.numpy())[0]
    np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_strict_mode_names_the_undelegated_nodes() -> None:
    model, x = _model()
    with pytest.raises(PartitionError, match=r"(?s)1 node\(s\) would run on the CPU.*sin.*aten\.sin\.default"):
        edgeport.lower(model, (x,), require_full_delegation=True)
    with pytest.raises(PartitionError, match="allowed: \\['aten.cos'\\]"):
        edgeport.lower(model, (x,), allowed_portable_ops=["aten.cos"])
    manager = edgeport.lower(model, (x,), require_full_delegation=True, allowed_portable_ops=["aten.sin"])
    assert len(manager.lowering_report.portable_ops) == 1


def test_bad_targets() -> None:
    with pytest.raises(ValueError, match="unknown target 'tpu'.*cpu, arm-ethos-u55"):
        resolve_profile("tpu")
    with pytest.raises(BackendNotFoundError, match="'NopeBackend' is not installed. Installed backends: .*Xnnpack"):
        resolve_profile("cpu", ["NopeBackend"])
    assert [c.backend_id for c in resolve_profile("qualcomm-htp", ["XnnpackBackend"]).backends] == ["XnnpackBackend"]
    assert [c.backend_id for c in PROFILES["qualcomm-htp"].backends] == ["QnnBackend", "XnnpackBackend"]


def test_quantized_cpu_matches_pt2e_eager_with_the_backend_quantizer_alone() -> None:
    """One backend: quantization by ownership must equal the backend's own quantizer (oracle: torchao pt2e
    with XnnpackQuantizer, run in eager PyTorch)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeport_xnnpack.quantizer import XnnpackQuantizer

    class ConvNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.c2 = torch.nn.Conv2d(8, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c2(torch.relu(self.c1(x)))

    torch.manual_seed(0)
    model, x = ConvNet().eval(), torch.randn(1, 3, 8, 8)
    calibration = [(torch.randn(1, 3, 8, 8),) for _ in range(3)] + [(x,)]
    manager = edgeport.lower(model, (x,), target="cpu", quantize=True, calibration=calibration)
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), XnnpackQuantizer())
    for batch in calibration:
        prepared(*batch)
    ref = convert_pt2e(prepared)(x).detach().numpy()
    out = edgeport.load(manager.buffer)(x.numpy())[0]
    report = manager.lowering_report.quantization
    assert report["conv2d"].owner == "XnnpackBackend" and "int8" in report["conv2d"].how
    step = float(np.abs(ref).max()) / 127
    assert np.mean(np.abs(out - ref) <= step) >= 0.99


def test_apple_lowers_and_falls_back_at_load_only_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    """Core ML lowers on Linux but cannot execute here: the load-time policy decides."""
    pytest.importorskip("edgeport_coreml")
    model, x = _model()
    manager = edgeport.lower(model, (x,), target="apple", portable_fallbacks=True)
    assert [b for b, _ in manager.lowering_report.delegates] == ["CoreMLBackend"]
    with pytest.raises(BackendNotFoundError, match="CoreMLBackend.*allow_fallback=True.*on_backend_unavailable='portable'"):
        edgeport.load(manager.buffer)["forward"]
    with pytest.raises(ValueError, match="on_backend_unavailable must be one of"):
        edgeport.load(manager.buffer, on_backend_unavailable="cpu")
    program = edgeport.runtime.Runtime.get().load_program(manager.buffer)
    with caplog.at_level(logging.WARNING, logger="edgeport.runtime"), pytest.warns(RuntimeWarning):
        method = program.load_method("forward", on_backend_unavailable="portable")
    (fallback,) = method.profile.fallbacks
    assert fallback.backend_id == "CoreMLBackend" and "unavailable" in fallback.reason
    events = [r.edgeport_event for r in caplog.records if hasattr(r, "edgeport_event")]
    assert events and events[0]["event"] == "portable_fallback" and events[0]["backend_id"] == "CoreMLBackend"
    (out,) = method.execute([x.numpy()])
    np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-4, atol=1e-5)
