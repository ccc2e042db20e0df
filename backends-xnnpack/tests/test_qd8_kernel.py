"""The ``_qd8`` host kernel (dynamically quantized fully connected, qd8 x qc8w / qb4w).

Oracle: float64 products of the rows quantized by ``quantize_rows`` (XNNPACK's f32 -> qd8 arithmetic, checked
against ExecuTorch's runtime in test_dynamic_quant.py) and the exactly dequantized filters; both loops (AVX2 and
portable C) and, end to end, the executor's float32 path (``fully_connected="xnnpack"``) on the same program.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgeport_xnnpack._dynamic_quant import dequantize_blockwise, dequantize_filter, quantize_rows
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


@pytest.mark.parametrize("loop", ["default", "avx2", "portable"])
@pytest.mark.parametrize("bits,m,k,n,group", CASES)
def test_kernel_matches_the_quantized_reference(monkeypatch, loop, bits, m, k, n, group):
    """Every loop this CPU has (the default: AVX-512 VNNI where present; AVX2; portable C) against the reference."""
    if loop == "portable":
        monkeypatch.setenv("EDGEPORT_XNNPACK_QD8_PORTABLE", "1")
        assert qd8.simd() == "portable"
    elif loop == "avx2":
        monkeypatch.setenv("EDGEPORT_XNNPACK_QD8_AVX2", "1")
        assert qd8.simd() in ("avx2", "portable")
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
    (dict(k=63), "bad sizes"), (dict(group=48), "bad sizes"), (dict(bits=2), "bad sizes"),
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
