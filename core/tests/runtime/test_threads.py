"""One loaded method executed from 8 threads at once gives the same results as serial runs."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgeport.runtime import Runtime


def _hammer(method, inputs, expected, threads=8, reps=10):
    errors = []
    barrier = threading.Barrier(threads)

    def worker(t):
        try:
            barrier.wait()
            for r in range(reps):
                k = (t * reps + r) % len(inputs)
                out = method.execute(inputs[k])
                for o, e in zip(out, expected[k]):
                    np.testing.assert_array_equal(o, e)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]


def test_threads_hand_built(builder):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    method = Runtime.get().load_program(builder.linear_relu(w, b, batch=16).serialize()).load_method()
    inputs = [[rng.standard_normal((16, 32)).astype(np.float32)] for _ in range(16)]
    expected = [method.execute(i) for i in inputs]
    _hammer(method, inputs, expected)


@pytest.mark.executorch
def test_threads_executorch_cnn(zoo):
    pytest.importorskip("executorch")
    torch = pytest.importorskip("torch")
    model, _, pte = zoo.cached("mobilenet_small")
    method = Runtime.get().load_program(pte).load_method()
    gen = torch.Generator().manual_seed(3)
    inputs = [[torch.randn(1, 3, 32, 32, generator=gen).numpy()] for _ in range(4)]
    expected = [method.execute(i) for i in inputs]
    with torch.no_grad():
        for i, e in zip(inputs, expected):
            np.testing.assert_allclose(e[0], model(torch.from_numpy(i[0])).numpy(), atol=1e-4, rtol=1e-4)
    _hammer(method, inputs, expected, reps=2)  # 8 threads at once; the hand-built test hammers longer
