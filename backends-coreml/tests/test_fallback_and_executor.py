"""What a Linux machine can do with a Core ML program: run its portable fallback (when it was written with one),
and the executor's Mac path driven against a stand-in for coremltools' MLModel (no Core ML here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from coreml_models import build, lowered

from edgeport import to_edge_transform_and_lower
from edgeport.aot.config import ExecutorchBackendConfig
from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport.runtime import Runtime
from edgeport_coreml import CoreMLPartitioner, generate_compile_specs
from edgeport_coreml import runtime as coreml_runtime


def test_portable_fallback_runs_where_core_ml_does_not():
    if coreml_runtime.coreml_available()[0]:
        pytest.skip("Core ML is available here")
    model, x = build("cnn")
    specs = generate_compile_specs(compute_precision="float32", minimum_deployment_target="iOS16")
    program = to_edge_transform_and_lower(torch.export.export(model, (x,)), partitioner=[CoreMLPartitioner(specs)]
                                          ).to_executorch(ExecutorchBackendConfig(portable_fallbacks=True))
    with pytest.warns(RuntimeWarning, match=r"CoreMLBackend\) runs on its portable fallback.*Core ML runs on macOS"):
        method = Runtime.get().load_program(program.buffer).load_method("forward", allow_fallback=True)
    out = np.asarray(method.execute([x.numpy()])[0])
    np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


class _FakeMLModel:
    """Records what the executor feeds; answers with each output's position (as a constant array)."""

    fed: dict = {}

    def __init__(self, path, compute_units=None, **kw):
        self.path, self.compute_units = path, compute_units

    def predict(self, feed):
        type(self).fed = feed
        return {"_softmax": np.full((1, 10), 7.0, np.float32)}


def test_executor_mac_path_with_a_stand_in(monkeypatch):
    import coremltools as ct

    blob = lowered("cnn").blob()  # lowered before coremltools' MLModel is replaced
    monkeypatch.setattr(ct.models, "MLModel", _FakeMLModel)
    ex = coreml_runtime.CoreMLExecutor()
    specs = generate_compile_specs(compute_unit="cpu_only")
    handle = ex.init(memoryview(blob), specs)
    try:
        assert handle.model.path.endswith("lowered_module/model.mlpackage")
        assert handle.model.compute_units == ct.ComputeUnit.CPU_ONLY
        assert ex.num_outputs(handle) == 1 and "cpu_only" in ex.describe_execution(handle)
        x = np.ones((1, 3, 16, 16), np.float32)
        (out,) = ex.execute(handle, [x])
        assert list(_FakeMLModel.fed) == ["x"] and out.shape == (1, 10)
        with pytest.raises(RuntimeExecutionError, match="2 inputs given, the model takes 1"):
            ex.execute(handle, [x, x])
        directory = handle.directory
    finally:
        ex.destroy(handle)
    assert not directory.exists()


def test_executor_refuses_multifunction_references():
    with pytest.raises(ProgramError, match="multifunction"):
        coreml_runtime.CoreMLExecutor().init(memoryview(b'CMJR{"version": 1}'), [])
