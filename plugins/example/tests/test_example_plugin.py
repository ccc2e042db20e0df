"""The plugin is discovered through its entry point, and its runtime side never needs torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import importlib_metadata
import numpy as np
import torch

import edgeport
from edgeport.backend import BackendSpec
from edgeport_example import CAPABILITIES, ExampleCompileOptions, ExampleExecutor, ExamplePartitioner


def test_entry_point_is_declared():
    eps = [ep for ep in importlib_metadata.entry_points(group="edgeport.backends") if ep.name == "example"]
    assert len(eps) == 1
    assert eps[0].value == "edgeport_example.plugin"
    assert eps[0].dist is not None and eps[0].dist.name == "edgeport-example"


def test_backend_is_registered():
    spec = edgeport.get_backend("ExampleBackend")
    assert isinstance(spec, BackendSpec)
    assert spec.backend_id == "ExampleBackend"
    assert spec.version == edgeport_example_version()
    assert spec.distribution == "edgeport-example"
    assert isinstance(spec.partitioner(), ExamplePartitioner)
    assert isinstance(spec.executor(), ExampleExecutor)
    assert spec.capabilities() is CAPABILITIES
    assert spec.compile_options is ExampleCompileOptions
    assert spec.is_available() == (True, "")
    assert "ExampleBackend" in [s.backend_id for s in edgeport.list_backends()]
    assert not [f for f in edgeport.plugin_errors() if f.plugin == "example"]


def edgeport_example_version() -> str:
    import edgeport_example

    return edgeport_example.__version__


def test_registered_preprocess_and_executor_run(edge_program):
    spec = edgeport.get_backend("ExampleBackend")
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    x = torch.randn(2, 3)
    ep = edge_program(model, x, keep_linear=True)
    blob = spec.preprocess(ep, ExampleCompileOptions(max_value=4).to_compile_specs()).processed_bytes
    ex = spec.executor()
    handle = ex.init(memoryview(blob), [])
    (out,) = ex.execute(handle, [x.numpy()])
    ex.destroy(handle)
    np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-6, atol=1e-6)


def test_runtime_is_torch_free(tmp_path, edge_program):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.full((3,), 2.0))

        def forward(self, x):
            return torch.sin(x) * self.w

    ep = edge_program(M(), torch.randn(3))
    blob = tmp_path / "blob.bin"
    blob.write_bytes(edgeport.get_backend("ExampleBackend").preprocess(ep, []).processed_bytes)
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # any "import torch" now fails
        import numpy as np
        import edgeport
        import edgeport_example
        spec = edgeport.get_backend("ExampleBackend")
        ex = spec.executor()
        data = open({str(blob)!r}, "rb").read()
        h = ex.init(memoryview(data), [])
        (out,) = ex.execute(h, [np.array([0.0, 0.5, 1.0], np.float32)])
        assert np.allclose(out, 2 * np.sin(np.array([0.0, 0.5, 1.0], np.float32)), atol=1e-6), out
        assert "torch" not in sys.modules or sys.modules["torch"] is None
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
