"""The ``_qd8`` host kernel (dynamically quantized fully connected, qd8 x qc8w / qb4w).

Oracles: float64 products of the rows quantized by ``quantize_rows`` (XNNPACK's f32 -> qd8 arithmetic, checked
against ExecuTorch's runtime in test_dynamic_quant.py) and the exactly dequantized filters; for 4-bit filters also
numpy's float32 evaluation of the kernel's formula (exact int64 sums per group, then float32 scaling and sums in
group order), which every loop must match bit for bit; every loop this CPU has (AVX-512 VNNI, AVX2, portable C), on
1 and 2 threads, and, end to end, the executor's float32 path (``fully_connected="xnnpack"``) on the same program.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from edgeport_xnnpack._dynamic_quant import (
    Qd8Weights,
    dequantize_blockwise,
    dequantize_filter,
    quantize_rows,
    row_params,
)
from edgeport_xnnpack.preprocess.affine_quantized import pack_int4

qd8 = pytest.importorskip("edgeport_xnnpack._qd8", reason="the _qd8 extension is not built")

CASES = [  # bits, m, k, n, group
    (4, 1, 64, 40, 32), (4, 5, 256, 70, 64), (4, 9, 128, 33, 128), (8, 1, 100, 33, 100), (8, 6, 48, 17, 48),
    (8, 4, 2048, 96, 2048),
    # decode shapes (m < 4: several columns per step), column counts not a multiple of 4, odd group counts (the
    # AVX-512 VNNI loop takes two groups of 32 per step, else the AVX2 one), rows in fours and a remainder
    (4, 1, 512, 37, 32), (4, 2, 96, 13, 32), (4, 3, 128, 9, 64), (4, 6, 256, 21, 32), (8, 1, 96, 11, 96),
    (8, 5, 40, 7, 40),
]


def _operands(bits: int, m: int, k: int, n: int, group: int, seed: int):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, k)) * 3 + rng.standard_normal((m, 1))).astype(np.float32)
    if bits == 4:
        w = pack_int4(rng.integers(-8, 8, (n, k)).astype(np.int8))
        s = (rng.random((n, k // group)) * 0.1 + 0.01).astype(np.float32)
        wf = dequantize_blockwise(w, s, (n, k), group)
    else:
        w = rng.integers(-128, 128, (n, k)).astype(np.int8)
        s = (rng.random(n) * 0.01 + 0.001).astype(np.float32)
        wf = dequantize_filter(w, s, 0)
    bias = rng.standard_normal(n).astype(np.float32)
    return x, w, s, bias, wf


def _select(monkeypatch, loop: str) -> None:
    if loop == "portable":
        monkeypatch.setenv("EDGEPORT_XNNPACK_QD8_PORTABLE", "1")
        assert qd8.simd() == "portable"
    elif loop == "avx2":
        monkeypatch.setenv("EDGEPORT_XNNPACK_QD8_AVX2", "1")
        assert qd8.simd() in ("avx2", "portable")


@pytest.mark.parametrize("loop", ["default", "avx2", "portable"])
@pytest.mark.parametrize("bits,m,k,n,group", CASES)
def test_kernel_matches_the_quantized_reference(monkeypatch, loop, bits, m, k, n, group):
    """Every loop this CPU has (the default: AVX-512 VNNI where present; AVX2; portable C) against the reference."""
    _select(monkeypatch, loop)
    x, w, s, bias, wf = _operands(bits, m, k, n, group, seed=m * k + n)
    xq = np.empty_like(x)
    quantize_rows(x, xq)
    for b in (bias, None):
        ref = xq.astype(np.float64) @ wf.astype(np.float64).T + (0 if b is None else b)
        out = np.full((m, n), np.nan, np.float32)
        qd8.fc(x, w, s, b, out, m, k, n, group, bits, -np.inf, np.inf)
        assert np.abs(out - ref).max() <= 2e-6 * np.abs(ref).max()
    lo, hi = -0.5, 0.75
    clamped = np.empty((m, n), np.float32)
    qd8.fc(x, w, s, bias, clamped, m, k, n, group, bits, lo, hi)
    assert clamped.min() >= lo and clamped.max() <= hi
    ref = xq.astype(np.float64) @ wf.astype(np.float64).T + bias
    assert np.abs(clamped - np.clip(ref, lo, hi)).max() <= 2e-6 * np.abs(ref).max()


def _exact4(x: np.ndarray, w: np.ndarray, s: np.ndarray, bias, group: int, lo: float, hi: float) -> np.ndarray:
    """The 4-bit kernel's result computed in numpy: exact int64 sums of (q - zp) * (nibble - 8) per group, then in
    float32: times the group's scale, summed in group order, times 1 / inv, plus the bias (0 without one), clamped."""
    m, k = x.shape
    inv, zp = row_params(x)
    a = np.rint(np.clip(x * inv[:, None], (-128 - zp)[:, None], (127 - zp)[:, None])).astype(np.int64)
    vals = np.empty((w.shape[0], k), np.int64)
    vals[:, 0::2], vals[:, 1::2] = (w & 15).astype(np.int64) - 8, (w >> 4).astype(np.int64) - 8
    groups = k // group
    ints = np.einsum("mgi,ngi->mng", a.reshape(m, groups, group), vals.reshape(-1, groups, group))
    acc = np.zeros((m, w.shape[0]), np.float32)
    for g in range(groups):
        acc = acc + ints[:, :, g].astype(np.float32) * s[None, :, g]
    y = acc * (np.float32(1) / inv)[:, None] + (np.float32(0) if bias is None else bias)
    return np.minimum(np.float32(hi), np.maximum(np.float32(lo), y)).astype(np.float32)


def _pool_args(pool) -> tuple[int, int]:
    if pool is None:
        return 0, 0
    return ctypes.cast(pool.lib.pool.pthreadpool_parallelize_1d, ctypes.c_void_p).value, pool.handle


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def pool(request):
    if request.param == 1:
        yield None
        return
    from edgeport_xnnpack import native

    if not native.is_available()[0]:
        pytest.skip(native.is_available()[1])
    p = native.shared_pools.acquire(2)
    yield p
    native.shared_pools.release(p)


CASES4 = [  # m, k, n, group: decode (m = 1) and prefill rows (8-, 4-row passes and a remainder), column counts off
    # the 16-column blocks, one and odd group counts, groups 32 / 64 / 128
    (1, 512, 512, 32), (1, 512, 37, 32), (1, 96, 16, 32), (1, 128, 9, 128), (2, 192, 33, 64), (3, 64, 1, 32),
    (4, 256, 48, 64), (5, 128, 17, 128), (8, 96, 24, 32), (13, 256, 70, 32), (32, 512, 100, 32), (33, 64, 31, 64),
    (1, 1536, 80, 32), (9, 384, 40, 128),
]


@pytest.mark.parametrize("loop", ["default", "avx2", "portable"])
@pytest.mark.parametrize("m,k,n,group", CASES4)
def test_4bit_loops_give_the_formula_bits(monkeypatch, pool, loop, m, k, n, group):
    """Every loop, packed at load (fc4) or per call (fc), on 1 and 2 threads: the same bits as the numpy formula."""
    _select(monkeypatch, loop)
    x, w, s, bias, _ = _operands(4, m, k, n, group, seed=m * 7 + k + n)
    x[0, :5] = 0  # zeros and a row range that does not start at 0
    packed = np.zeros(qd8.packed4_bytes(n, k, group), np.uint8)
    qd8.pack4(w, s, n, k, group, packed)
    parallelize, handle = _pool_args(pool)
    for b, lo, hi in [(bias, -np.inf, np.inf), (None, -np.inf, np.inf), (bias, -0.5, 0.75)]:
        ref = _exact4(x, w, s, b, group, lo, hi)
        for how in ("fc4", "fc"):
            out = np.full((m, n), np.nan, np.float32)
            if how == "fc4":
                qd8.fc4(x, packed, b, out, m, k, n, group, lo, hi, parallelize, handle)
            else:
                qd8.fc(x, w, s, b, out, m, k, n, group, 4, lo, hi, parallelize, handle)
            assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), (how, np.abs(out - ref).max())


def test_packed_filter_is_made_once_and_aligned():
    from edgeport_xnnpack._host_qd8 import packed_filter

    _, w, s, bias, _ = _operands(4, 1, 128, 20, 32, seed=3)
    q = Qd8Weights(w, s, bias, 4, 32, 128, 20)
    p = packed_filter(q)
    assert p.ctypes.data % 64 == 0 and p.size == qd8.packed4_bytes(20, 128, 32)
    assert packed_filter(q) is p


@pytest.mark.parametrize("bits,m,k,n,group", [(8, 1, 512, 200, 512), (8, 7, 96, 70, 96), (4, 6, 512, 300, 32)])
def test_two_threads_match_one(pool, bits, m, k, n, group):
    """Columns split over the pool's threads: the same bits as on the calling thread."""
    x, w, s, bias, _ = _operands(bits, m, k, n, group, seed=k + n)
    one, out = np.empty((m, n), np.float32), np.full((m, n), np.nan, np.float32)
    qd8.fc(x, w, s, bias, one, m, k, n, group, bits, -np.inf, np.inf)
    qd8.fc(x, w, s, bias, out, m, k, n, group, bits, -np.inf, np.inf, *_pool_args(pool))
    assert np.array_equal(one.view(np.uint32), out.view(np.uint32))


def test_zero_rows_and_constant_rows():
    x, w, s, bias, wf = _operands(4, 3, 64, 8, 32, seed=1)
    x[0] = 0
    x[1] = 2.5  # one value: the range widened to [0, 2.5]
    out = np.empty((3, 8), np.float32)
    qd8.fc(x, w, s, None, out, 3, 64, 8, 32, 4, -np.inf, np.inf)
    assert np.array_equal(out[0], np.zeros(8, np.float32))
    ref = 2.5 * wf.astype(np.float64).sum(axis=1)
    assert np.abs(out[1] - ref).max() <= 1e-6 * np.abs(ref).max()


@pytest.mark.parametrize("change,match", [
    (dict(k=63), "bad sizes"), (dict(group=48), "bad sizes"), (dict(bits=2), "bad sizes"), (dict(m=-1), "bad sizes"),
    (dict(out=np.empty((2, 9), np.float32)), "out has"), (dict(w=np.zeros((8, 31), np.uint8)), "w has"),
    (dict(s=np.ones(3, np.float32)), "scales has"), (dict(bias=np.ones(2, np.float32)), "bias has"),
])
def test_bad_arguments_raise(change, match):
    x, w, s, bias, _ = _operands(4, 2, 64, 8, 32, seed=2)
    args = dict(x=x, w=w, s=s, bias=bias, out=np.empty((2, 8), np.float32), m=2, k=64, n=8, group=32, bits=4)
    args.update(change)
    with pytest.raises(ValueError, match=match):
        qd8.fc(args["x"], args["w"], args["s"], args["bias"], args["out"], args["m"], args["k"], args["n"],
               args["group"], args["bits"], -np.inf, np.inf)
    with pytest.raises(TypeError):
        qd8.fc(x, w, s, bias, bytes(64), 2, 64, 8, 32, 4, -np.inf, np.inf)  # a read-only output


@pytest.mark.parametrize("change,match", [
    (dict(packed=np.zeros(10, np.uint8)), "packed has"), (dict(group=48), "bad sizes"),
    (dict(out=np.empty((2, 9), np.float32)), "out has"), (dict(x=np.zeros((2, 32), np.float32)), "x has"),
    (dict(bias=np.ones(3, np.float32)), "bias has"), (dict(pool=5), "without its parallelize"),
])
def test_fc4_bad_arguments_raise(change, match):
    x, w, s, bias, _ = _operands(4, 2, 64, 8, 32, seed=5)
    packed = np.zeros(qd8.packed4_bytes(8, 64, 32), np.uint8)
    qd8.pack4(w, s, 8, 64, 32, packed)
    args = dict(x=x, packed=packed, bias=bias, out=np.empty((2, 8), np.float32), group=32, pool=0)
    args.update(change)
    with pytest.raises(ValueError, match=match):
        qd8.fc4(args["x"], args["packed"], args["bias"], args["out"], 2, 64, 8, args["group"], -np.inf, np.inf, 0,
                args["pool"])
    with pytest.raises(ValueError, match="into has"):
        qd8.pack4(w, s, 8, 64, 32, np.zeros(5, np.uint8))
    with pytest.raises(ValueError, match="bad sizes"):
        qd8.packed4_bytes(8, 64, 40)


def test_executor_kernel_and_float32_paths_agree():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup
    from xnn_helpers import lower_edgeport, needs_xnnpack  # noqa: F401

    from edgeport.runtime import Runtime
    from edgeport_xnnpack import native

    if not native.is_available()[0]:
        pytest.skip(native.is_available()[1])
    torch.manual_seed(4)
    m = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 8)).eval()
    quantize_(m, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    x = torch.randn(5, 64)
    _, pte, _ = lower_edgeport(m, (x,))
    program = Runtime.get().load_program(pte)
    outs = {}
    for choice in ("auto", "xnnpack"):
        method = program.load_method("forward", backend_options={"XnnpackBackend": {"fully_connected": choice}})
        outs[choice] = method.execute([x.numpy()])[0]
    with torch.no_grad():
        ref = m(x).numpy()
    assert np.abs(outs["auto"] - outs["xnnpack"]).max() <= 1e-5 * np.abs(ref).max()
    assert np.abs(outs["auto"] - ref).max() <= 0.05 * np.abs(ref).max()
