"""The float32 fully connected operator's AVX-512 stand-in (``_gemm.HostFullyConnected``, ``_gemm_fc.c``).

Oracle: libXNNPACK's own operator (``xnn_create_fully_connected_nc_f32``, ``_fc_ops.HOST_KERNEL = False``), bit for
bit, over batch sizes that exercise the one-row path (four panels in flight and the remainder), full and short
7-row blocks, odd panel counts and partial panels, bias or none, clamps, transposed filters, one and two threads,
and non-finite values; numpy in float64 as a second, independent check of the arithmetic. In a program: a dynamic
Llama-style MLP run at every length on the stand-in and on the library's operator, bit for bit.
"""

from __future__ import annotations

import ctypes
import functools
import math

import numpy as np
import pytest
import torch
from torch import nn
from xnn_helpers import needs_xnnpack

from edgeport import to_edge_transform_and_lower
from edgeport.program import load_pte
from edgeport_xnnpack import XnnpackPartitioner, _fc_ops, native
from edgeport_xnnpack._fc_ops import FullyConnected, FullyConnectedStep, PackedFullyConnected
from edgeport_xnnpack.native import XnnpackError
from edgeport_xnnpack.runtime import XnnpackExecutor

pytestmark = [needs_xnnpack]
if not (_fc_ops.available() and _fc_ops.host_kernel_available()):
    pytest.skip("needs AVX-512F, the _gemm extension and libXNNPACK's float32 fully connected operator",
                allow_module_level=True)

from edgeport_xnnpack import _gemm  # noqa: E402  (built: host_kernel_available says so)


def _run(host: bool, monkeypatch, k: int, n: int, w: np.ndarray, b: np.ndarray | None, lo: float, hi: float,
         flags: int, x: np.ndarray, pool) -> np.ndarray:
    monkeypatch.setattr(_fc_ops, "HOST_KERNEL", host)
    packed = PackedFullyConnected(k, n, w.reshape(-1), b, lo, hi, flags)
    assert (packed.host is not None) == host
    try:
        y = np.full((x.shape[0], n), np.nan, np.float32)
        FullyConnected(packed, x.shape[0], pool).run(x, y)
        return y
    finally:
        packed.close()


@functools.cache
def _pool() -> native.ThreadPool:
    return native.ThreadPool(2)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m", [1, 2, 7, 8, 20])
def test_bit_identical_to_the_library_operator(m, threads, monkeypatch):
    rng = np.random.default_rng(m * 10 + threads)
    pool = _pool() if threads == 2 else None
    cases = 0
    for k in (1, 5, 16, 37, 300):
        for n in (1, 9, 16, 40, 64, 97):
            transposed = (k + n) % 2
            w = rng.standard_normal((k, n) if transposed else (n, k)).astype(np.float32)
            b = rng.standard_normal(n).astype(np.float32) if n % 3 else None
            lo, hi = (-0.4, 0.9) if k % 2 else (-math.inf, math.inf)
            x = rng.standard_normal((m, k)).astype(np.float32)
            got = _run(True, monkeypatch, k, n, w, b, lo, hi, transposed, x, pool)
            want = _run(False, monkeypatch, k, n, w, b, lo, hi, transposed, x, pool)
            assert np.array_equal(got, want), (k, n, m, threads)
            rows = w.T if transposed else w
            exact = x.astype(np.float64) @ rows.T.astype(np.float64) + (0 if b is None else b)
            np.testing.assert_allclose(got, np.clip(exact, lo, hi), rtol=1e-4, atol=1e-4 * math.sqrt(k))
            cases += 1
    assert cases == 30


@pytest.mark.parametrize("m", [1, 9])
def test_non_finite_values_as_the_library(m, monkeypatch):
    rng = np.random.default_rng(5)
    k, n = 40, 50
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[3, 5], w[7, 1], w[20, 0] = np.inf, np.nan, -np.inf
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[-1, 9] = -np.inf
    for lo, hi in ((-math.inf, math.inf), (0.0, 6.0)):
        got = _run(True, monkeypatch, k, n, w, None, lo, hi, 0, x, None)
        want = _run(False, monkeypatch, k, n, w, None, lo, hi, 0, x, None)
        assert np.array_equal(got, want, equal_nan=True)
        if hi == math.inf:
            assert not np.isfinite(got).all()  # the infinities reached the unclamped outputs


def test_bad_construction_is_refused():
    w, b = np.zeros(3 * 20, np.float32), np.zeros(20, np.float32)  # k = 3 inputs, n = 20 outputs
    with pytest.raises(ValueError, match="holds .* items"):
        _gemm.HostFullyConnected(w[:-1], b, 3, 20, -1.0, 1.0)
    with pytest.raises(ValueError, match="holds .* items"):
        _gemm.HostFullyConnected(w, b[:16], 3, 20, -1.0, 1.0)
    with pytest.raises(TypeError, match="format 'f'"):
        _gemm.HostFullyConnected(w.astype(np.float64), b, 3, 20, -1.0, 1.0)
    with pytest.raises(ValueError, match="bad sizes"):
        _gemm.HostFullyConnected(w, b, 0, 20, -1.0, 1.0)
    with pytest.raises(ValueError, match="output range"):
        _gemm.HostFullyConnected(w, b, 3, 20, 1.0, -1.0)
    with pytest.raises(ValueError, match="both pool function addresses"):
        _gemm.HostFullyConnected(w, b, 3, 20, -1.0, 1.0, False, 1234, 0)
    with pytest.raises(RuntimeError, match="not initialized"):
        _gemm.HostFullyConnected.__new__(_gemm.HostFullyConnected).handle
    op = _gemm.HostFullyConnected(w, None, 3, 20, -1.0, 1.0)
    with pytest.raises(RuntimeError, match="already initialized"):
        op.__init__(w, b, 3, 20, -1.0, 1.0)
    setup = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p)(_gemm.FC_SETUP)
    run = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(_gemm.FC_RUN)
    src, dst = np.ones(3, np.float32), np.zeros(20, np.float32)
    assert run(op.handle, None) == 2  # not set up: refused (xnn_status_invalid_parameter), nothing read
    assert setup(op.handle, 0, src.ctypes.data, dst.ctypes.data, None) == 2
    assert setup(op.handle, 1, None, dst.ctypes.data, None) == 2
    assert setup(op.handle, 1, src.ctypes.data, dst.ctypes.data, None) == 0
    assert run(op.handle, None) == 0
    assert np.array_equal(dst, np.zeros(20, np.float32))  # zero filter and bias


def test_a_closed_operator_refuses_runs(monkeypatch):
    monkeypatch.setattr(_fc_ops, "HOST_KERNEL", True)
    packed = PackedFullyConnected(8, 16, np.ones(128, np.float32), None, -math.inf, math.inf, 0)
    run = FullyConnected(packed, 1)
    packed.close()
    assert packed.host is None
    with pytest.raises(XnnpackError, match="deleted"):
        run.run(np.ones((1, 8), np.float32), np.empty((1, 16), np.float32))


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(48, 80, bias=False), nn.Linear(48, 80, bias=False)
        self.down, self.head = nn.Linear(80, 48), nn.Linear(48, 33)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.head(self.down(nn.functional.silu(self.gate(x)) * self.up(x)) + x))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_dynamic_program_on_the_stand_in_matches_the_library_operator(threads, monkeypatch):
    torch.manual_seed(0)
    model = _Mlp().eval()
    seq = torch.export.Dim("seq", min=1, max=24)
    ep = torch.export.export(model, (torch.randn(1, 4, 48),), dynamic_shapes={"x": {1: seq}})
    lp = load_pte(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)
    outs: dict[bool, list[np.ndarray]] = {}
    for host in (True, False):
        monkeypatch.setattr(_fc_ops, "HOST_KERNEL", host)
        ex = XnnpackExecutor(num_threads=threads)
        handle = ex.init(lp.delegate_data(0, 0), [], named_data=lp.named_data)
        try:
            steps = [s for s in handle.steps if isinstance(s, FullyConnectedStep)]
            assert len(steps) == 4 and all((s.op.packed.host is not None) == host for s in steps)
            outs[host] = []
            for length in (1, 24, 7, 1, 13):
                x = np.random.default_rng(length).standard_normal((1, length, 48)).astype(np.float32)
                outs[host].append(np.array(ex.execute(handle, [x])[0]))
            with torch.no_grad():
                want = model(torch.from_numpy(x)).numpy()
            np.testing.assert_allclose(outs[host][-1], want, rtol=1e-4, atol=1e-4)
        finally:
            ex.destroy(handle)
    for a, b in zip(outs[True], outs[False], strict=True):
        assert np.array_equal(a, b)


class _InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion (ReLU6), 3x3 depthwise (ReLU6), 1x1 projection, residual; then a 1x1
    without bias, one too small for the operator (stays in the runtime) and a strided 1x1 (stays: not a GEMM)."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(24, 144, 1), nn.ReLU6())
        self.depthwise = nn.Sequential(nn.Conv2d(144, 144, 3, padding=1, groups=144), nn.ReLU6())
        self.project = nn.Conv2d(144, 24, 1)
        self.plain = nn.Conv2d(24, 40, 1, bias=False)
        self.tiny = nn.Conv2d(40, 8, 1)
        self.strided = nn.Conv2d(8, 16, 1, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.project(self.depthwise(self.expand(x)))
        return self.strided(self.tiny(self.plain(y)))


@pytest.mark.parametrize("threads", [1, 2])
def test_1x1_convolutions_on_the_stand_in_match_the_library(threads, monkeypatch):
    """1x1 stride-1 convolutions of >= MIN_CONV_MACS run as operator steps on the stand-in (a static-shape
    delegate), bit-identical to the library's runtime running them (``HOST_KERNEL = False``), close to eager."""
    torch.manual_seed(0)
    model = _InvertedResidual().eval()
    x = torch.randn(1, 24, 28, 28)
    ep = torch.export.export(model, (x,))
    lp = load_pte(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)
    outs = {}
    for host in (True, False):
        monkeypatch.setattr(_fc_ops, "HOST_KERNEL", host)
        ex = XnnpackExecutor(num_threads=threads)
        handle = ex.init(lp.delegate_data(0, 0), [], named_data=lp.named_data)
        try:
            steps = [s for s in handle.steps if isinstance(s, FullyConnectedStep)]
            # expand 784x24x144, project 784x144x24, plain 784x24x40 (0.75M MACs: stays), tiny and strided stay
            labels = sorted(s.label for s in steps)
            assert labels == (["convolution_1x1[784x144 -> 24]", "convolution_1x1[784x24 -> 144]"] if host else [])
            assert all(s.op.packed.host is not None for s in steps)
            outs[host] = [np.array(ex.execute(handle, [x.numpy()])[0]) for _ in range(2)]
        finally:
            ex.destroy(handle)
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(outs[True][0], want, rtol=1e-4, atol=1e-4)
    for a, b in zip(outs[True], outs[False], strict=True):
        assert np.array_equal(a, b)
