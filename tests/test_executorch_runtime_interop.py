"""The stock ExecuTorch runtime (test-only oracle) loads edgeport's .pte files; outputs match eager PyTorch."""

from __future__ import annotations

import pytest
import torch

from edgeport import to_edge
from edgeport.testing.models import MODELS

et_runtime = pytest.importorskip("executorch.runtime")
pytestmark = pytest.mark.executorch


def run_on_executorch(buffer: bytes, method: str, inputs: list) -> list:
    program = et_runtime.Runtime.get().load_program(buffer)
    return list(program.load_method(method).execute(inputs))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_executorch_runtime_runs_edgeport_program(name):
    model, inputs = MODELS[name]()
    with torch.no_grad():
        expected = model(*inputs)
    buffer = to_edge(torch.export.export(model, inputs)).to_executorch().buffer
    assert buffer[4:8] == b"ET12"
    (got,) = run_on_executorch(buffer, "forward", list(inputs))
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_two_methods_and_constant_method():
    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(10, 5)

        def forward(self, x):
            return torch.relu(self.fc(x))

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(5, 10)

        def forward(self, x):
            return torch.sigmoid(self.fc(x))

    torch.manual_seed(0)
    enc, dec = Encoder().eval(), Decoder().eval()
    programs = {
        "encode": torch.export.export(enc, (torch.randn(1, 10),)),
        "decode": torch.export.export(dec, (torch.randn(1, 5),)),
    }
    buffer = to_edge(programs, constant_methods={"get_version": 3, "get_scale": 0.25}).to_executorch().buffer
    program = et_runtime.Runtime.get().load_program(buffer)
    assert set(program.method_names) == {"encode", "decode", "get_version", "get_scale"}
    x = torch.randn(1, 10)
    with torch.no_grad():
        z = enc(x)
        torch.testing.assert_close(program.load_method("encode").execute([x])[0], z, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(program.load_method("decode").execute([z])[0], dec(z), atol=1e-5, rtol=1e-5)
    assert program.load_method("get_version").execute([]) == [3]
    assert program.load_method("get_scale").execute([]) == [0.25]


def test_dynamic_shape_program_runs_at_several_sizes():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x + y) * 3

    d = torch.export.Dim("d", min=1, max=16)
    ep = torch.export.export(M(), (torch.randn(2, 8), torch.randn(2, 8)), dynamic_shapes={"x": {1: d}, "y": {1: d}})
    buffer = to_edge(ep).to_executorch().buffer
    program = et_runtime.Runtime.get().load_program(buffer)
    method = program.load_method("forward")
    for n in (1, 5, 16):
        x, y = torch.randn(2, n), torch.randn(2, n)
        (got,) = method.execute([x, y])
        torch.testing.assert_close(got, torch.relu(x + y) * 3)


def test_list_output_ops_split_and_unbind():
    class M(torch.nn.Module):
        def forward(self, x):
            a, b = torch.split(x, [1, 3], dim=1)
            c, d = torch.unbind(x[:, :2], dim=1)
            return a * 2, b + 1, c - d

    x = torch.randn(2, 4)
    buffer = to_edge(torch.export.export(M(), (x,))).to_executorch().buffer
    program = et_runtime.Runtime.get().load_program(buffer)
    got = program.load_method("forward").execute([x])
    for g, want in zip(got, M()(x)):
        torch.testing.assert_close(g, want)
