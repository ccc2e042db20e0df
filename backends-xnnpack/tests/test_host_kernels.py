"""The C host kernel for GELU (``edgeport_xnnpack._kernels``), which the 2022 libXNNPACK lacks.

Oracle: PyTorch's GELU in float64. The kernel is optional (built when a compiler is present); the numpy form it
replaces is checked against the same oracle, and the executor's results with either are compared with eager.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgeport_xnnpack import _host, _host_gelu  # noqa: E402

kernels = pytest.importorskip("edgeport_xnnpack._kernels", reason="the optional C kernels were not built")


def _reference(x: np.ndarray) -> np.ndarray:
    return torch.nn.functional.gelu(torch.from_numpy(x.astype(np.float64))).numpy()


def test_gelu_kernel_matches_torch_over_the_float_range():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(100_003).astype(np.float32) * 4,
                        np.linspace(-30, 30, 60_001, dtype=np.float32),
                        np.array([0.0, -0.0, 1e-38, -1e-38, 1e-45, 87.0, -87.0, 88.5, -88.5, 1e30, -1e30],
                                 np.float32)])
    out = np.empty_like(x)
    kernels.gelu(x, out)
    ref = _reference(x)
    scale = np.maximum(1.0, np.abs(ref))
    assert np.max(np.abs(out - ref) / scale) < 5e-7
    nan = np.empty(3, np.float32)
    kernels.gelu(np.array([np.nan, np.inf, -np.inf], np.float32), nan)
    np.testing.assert_array_equal(np.isnan(nan), np.isnan(_reference(np.array([np.nan, np.inf, -np.inf],
                                                                               np.float32))))


def test_numpy_form_and_kernel_agree():
    x = np.random.default_rng(1).standard_normal((4, 33, 17)).astype(np.float32) * 3
    fast = _host_gelu.gelu(x)
    slow = 0.5 * x * (1.0 + _host_gelu.erf(x / np.sqrt(2.0)))
    np.testing.assert_allclose(fast, slow, rtol=0, atol=5e-7)
    strided = x[:, ::2, :]  # not contiguous: copied first, never read out of bounds
    np.testing.assert_allclose(_host_gelu.gelu(strided), _reference(strided), rtol=0, atol=5e-6)


@pytest.mark.parametrize("args, message", [
    ((np.zeros(4, np.float64), np.zeros(4, np.float32)), "input must be float32"),
    ((np.zeros(4, np.float32), np.zeros(3, np.float32)), "input has 16 bytes, output 12"),
    ((np.zeros(8, np.float32)[::2], np.zeros(4, np.float32)), "C-contiguous"),
    ((np.zeros(4, np.float32), np.zeros(4, np.float32)[::1].copy().view(np.int32)), "output must be float32"),
    ((np.zeros(4, np.float32), b"\0" * 16), "writable"),
    (("not an array", np.zeros(4, np.float32)), "C-contiguous"),
])
def test_gelu_kernel_refuses_bad_buffers(args, message):
    with pytest.raises(ValueError, match=message):
        kernels.gelu(*args)


def _gelu_program():
    import edgeport
    from edgeport_xnnpack import XnnpackPartitioner

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).eval()
    x = torch.randn(5, 32)
    program = edgeport.to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                                   partitioner=[XnnpackPartitioner()]).to_executorch()
    with torch.no_grad():
        return program, x, model(x).numpy()


def test_a_gelu_model_is_one_xnnpack_delegate_equal_to_eager():
    from edgeport.runtime import Runtime

    program, x, want = _gelu_program()
    assert "1 delegate calls, 0 portable kernel calls" in program.delegation_summary()
    got = Runtime.get().load_program(program.buffer).load_method("forward").execute([x.numpy()])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.executorch
def test_the_stock_runtime_runs_the_gelu_delegate():
    """ExecuTorch's XNNPACK runs the blob's XNNGelu node natively (in a child process)."""
    from edgeport.testing.stock_runtime import run_program

    program, x, want = _gelu_program()
    result = run_program(program.buffer, [x.numpy()], name="linear-gelu-linear")
    assert result.ok, result.error
    np.testing.assert_allclose(result.outputs[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 1031])
def test_gelu_kernel_lengths_around_the_vector_width(n):
    """The AVX2 loop takes 8 floats per step and leaves the tail to the portable loop: both agree with the oracle,
    and nothing past the end is written."""
    x = np.random.default_rng(n).standard_normal(n + 8).astype(np.float32) * 5
    out = np.full(n + 8, 123.0, np.float32)
    kernels.gelu(x[:n], out[:n])
    np.testing.assert_allclose(out[:n], _reference(x[:n]), rtol=0, atol=5e-7 * max(1.0, float(np.abs(x).max())))
    assert np.all(out[n:] == 123.0)


def test_gelu_kernel_on_a_pool_matches_the_oracle_and_its_single_thread_result():
    """In chunks of 8192 floats on the delegate's pthreadpool: the same floats as on one thread."""
    import ctypes

    from edgeport_xnnpack import native

    if not native.is_available()[0]:
        pytest.skip(native.is_available()[1])
    pool = native.ThreadPool(2)
    try:
        x = np.random.default_rng(3).standard_normal(3 * 8192 + 13).astype(np.float32) * 4
        one, two = np.empty_like(x), np.empty_like(x)
        kernels.gelu(x, one)
        kernels.gelu(x, two, ctypes.cast(pool.lib.pool.pthreadpool_parallelize_1d, ctypes.c_void_p).value, pool.handle)
        np.testing.assert_array_equal(one, two)
        np.testing.assert_allclose(two, _reference(x), rtol=0, atol=5e-7 * 16)
        with pytest.raises(ValueError, match="pthreadpool_parallelize_1d"):
            kernels.gelu(x, two, 0, pool.handle)
    finally:
        pool.close()


def test_gelu_writes_a_little_endian_float32_output():
    x = np.linspace(-3, 3, 40, dtype=np.float32)
    out = np.empty(40, np.dtype("<f4"))
    kernels.gelu(x.astype("<f4"), out)
    np.testing.assert_allclose(out, _reference(x), rtol=0, atol=5e-7 * 3)
