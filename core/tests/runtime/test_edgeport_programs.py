"""Programs written by edgeport's own pipeline (``edgeport.to_edge(...).to_executorch()``) run on the runtime,
including delegate calls to the example backend."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import edgeport  # noqa: E402
from edgeport.runtime import Runtime  # noqa: E402


@pytest.mark.parametrize("name", ["mlp", "cnn", "encoder_layer"])
def test_edgeport_written_program_matches_eager(zoo, name):
    model, inputs = zoo.make_model(name)
    pte = edgeport.to_edge(torch.export.export(model, inputs)).to_executorch().buffer
    method = Runtime.get().load_program(pte).load_method()
    (got,) = method.execute([t.numpy() for t in inputs])
    with torch.no_grad():
        np.testing.assert_allclose(got, model(*inputs).numpy(), atol=1e-4, rtol=1e-4)


def test_delegated_program_runs_backend_executor(zoo):
    example = pytest.importorskip("edgeport_example.partitioner")
    model, inputs = zoo.make_model("mlp")
    lowered = edgeport.to_edge_transform_and_lower(torch.export.export(model, inputs),
                                                   partitioner=[example.ExamplePartitioner()])
    method = Runtime.get().load_program(lowered.to_executorch().buffer).load_method()
    assert method.profile.delegates and all(d.status == "backend" for d in method.profile.delegates)
    assert method.metadata.backends == ("ExampleBackend",)
    for _ in range(2):
        (got,) = method.execute([t.numpy() for t in inputs])
        with torch.no_grad():
            np.testing.assert_allclose(got, model(*inputs).numpy(), atol=1e-4, rtol=1e-4)
    method.release()
