"""Graph.execute's hot path: small tensors go through buffers bound once (copied in and out), large ones are bound
per run; results never alias each other or those buffers."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("shape", [(2, 16), (64, 128)], ids=["staged", "bound-per-run"])  # 128 B / 32 KB
def test_results_are_fresh_and_correct(context, rng, shape):
    g = context.graph_builder("relu")
    g.add_input("x", shape, np.float32)
    g.add_output("y", shape, np.float32)
    g.add_node("Relu", "relu", ["x"], ["y"])
    graph = g.finalize()
    # multiples of 1/8: exact in fp32 and fp16 (whatever precision the emulator prepares float graphs in)
    a, b = ((rng.integers(-64, 64, shape) / 8).astype(np.float32) for _ in range(2))
    (ya,) = graph.execute([a])
    (yb,) = graph.execute([b])
    assert ya is not yb and not np.shares_memory(ya, yb)
    # rtol 1e-6: exact in fp32; after a SoC was configured in this process the emulator's fp16 path is 1 ulp off
    np.testing.assert_allclose(ya, np.maximum(a, 0), rtol=1e-6, atol=0)  # not overwritten by the second run
    np.testing.assert_allclose(yb, np.maximum(b, 0), rtol=1e-6, atol=0)
    expected = np.maximum(a, 0)
    a[:] = -7.0  # a caller's later writes do not reach a finished run's result
    np.testing.assert_allclose(ya, expected, rtol=1e-6, atol=0)


def test_subclass_and_wrong_inputs(context, rng):
    g = context.graph_builder("relu")
    g.add_input("x", (2, 3), np.float32)
    g.add_output("y", (2, 3), np.float32)
    g.add_node("Relu", "relu", ["x"], ["y"])
    graph = g.finalize()
    x = (rng.integers(-64, 64, (2, 3)) / 8).astype(np.float32)
    (y,) = graph.execute([x.view(np.matrix)])  # an ndarray subclass is accepted
    np.testing.assert_allclose(np.asarray(y), np.maximum(x, 0), rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="dtype float64 != expected float32"):
        graph.execute([x.astype(np.float64)])
    with pytest.raises(ValueError, match="shape"):
        graph.execute([x.T.copy()])
    with pytest.raises(ValueError, match="C-contiguous"):
        graph.execute([np.asfortranarray(rng.standard_normal((2, 3)).astype(np.float32))])
    with pytest.raises(ValueError, match="expected a numpy array"):
        graph.execute([x.tolist()])

