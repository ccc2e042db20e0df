"""``edgeport lower`` and ``edgeport run``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from edgeport.cli import main

pytest.importorskip("edgeport_xnnpack")

FACTORY = textwrap.dedent('''
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            return torch.sin(self.fc(x))

    def build():
        torch.manual_seed(0)
        return Net().eval(), (torch.randn(2, 8),)

    def not_a_pair():
        return Net()
''')


@pytest.fixture
def factory(tmp_path: Path) -> Path:
    path = tmp_path / "mymodels.py"
    path.write_text(FACTORY)
    return path


def test_lower_then_run(factory: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model.pte"
    assert main(["lower", f"{factory}:build", "--target", "cpu", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # not a terminal: no progress display
    assert "XnnpackBackend" in captured.out and "aten.sin.default" in captured.out
    assert out.stat().st_size > 0

    assert main(["run", str(out)]) == 0  # seeded random inputs shaped from the program
    assert "output 0: float32[2, 4]" in capsys.readouterr().out

    inputs = tmp_path / "in.npz"
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    np.savez(inputs, x)
    assert main(["run", str(out), "--inputs", str(inputs), "--repeat", "3"]) == 0
    text = capsys.readouterr().out
    assert "output 0: float32[2, 4]" in text and "latency over 3 run(s)" in text
    # the printed values are the model's
    import importlib.util

    spec = importlib.util.spec_from_file_location("mymodels_check", factory)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, _ = module.build()
    expected = model(torch.from_numpy(x)).detach().numpy().reshape(-1)[:3]
    first = text.split("[2, 4] [")[1].split()[:3]
    np.testing.assert_allclose([float(v) for v in first], expected, atol=1e-4)


def test_progress_is_shown_when_forced(factory: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lower", f"{factory}:build", "--progress", "-o", str(tmp_path / "m.pte")]) == 0
    err = capsys.readouterr().err
    for stage in ("[1/5] export", "[2/5] partition", "[3/5] preprocess: XnnpackBackend", "[4/5] serialize",
                  "[5/5] write"):
        assert stage in err


def test_strict_mode_from_the_command_line(factory: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lower", f"{factory}:build", "--require-full-delegation", "-o", str(tmp_path / "m.pte")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgeport lower: strict mode: 1 node(s) would run on the CPU") and "sin" in err


@pytest.mark.parametrize("spec, message", [
    ("no_such_pkg.models:build", "module 'no_such_pkg.models' does not import (ModuleNotFoundError"),
    ("{factory}:missing", "has no callable 'missing'"),
    ("{factory}:not_a_pair", "returned Net, not (model, example_inputs)"),
    ("nocolon", "is not MODULE:FACTORY"),
])
def test_bad_factory_is_one_line(spec: str, message: str, factory: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lower", spec.format(factory=factory), "-o", str(tmp_path / "m.pte")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_run_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tmp_path / "nope.pte")]) == 2
    assert capsys.readouterr().err.startswith("edgeport run:")


def test_progress_on_a_terminal_and_quiet_otherwise(factory: Path, tmp_path: Path) -> None:
    """A real pseudo-terminal as stderr shows the stages; a pipe does not."""
    import os
    import pty
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "edgeport.cli", "lower", f"{factory}:build", "-o", str(tmp_path / "m.pte")]
    primary, secondary = pty.openpty()
    try:
        proc = subprocess.run(cmd, stderr=secondary, stdout=subprocess.PIPE, timeout=300, check=False)
        os.close(secondary)
        chunks = []
        while True:
            try:
                data = os.read(primary, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(primary)
    assert proc.returncode == 0
    assert "[1/5] export" in b"".join(chunks).decode(errors="replace")
    piped = subprocess.run(cmd, capture_output=True, timeout=300, check=False, text=True)
    assert piped.returncode == 0 and "[1/5]" not in piped.stderr and "XnnpackBackend" in piped.stdout
