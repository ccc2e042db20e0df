"""Float32 fully-connected layers and 1x1 convolutions on the host BLAS (``XnnpackRuntimeOptions.fully_connected``).

Oracles: numpy's float64 matrix product for the C kernels (``edgeport_xnnpack._gemm``: OpenBLAS tiled on the pool,
and the packed AVX2/FMA micro-kernel), eager PyTorch for
whole programs (a Hugging Face BERT and ResNet built from small configs, and a MobileNetV2-style block) run with
every eligible product on the host, on 1 and 2 threads.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from xnn_helpers import RTOL, eager, lower_edgeport, needs_xnnpack, rel_err

torch = pytest.importorskip("torch")

from edgeport.runtime import Runtime  # noqa: E402
from edgeport_xnnpack import _host_gemm, native  # noqa: E402
from edgeport_xnnpack import _planner as xnn_planner  # noqa: E402
from edgeport_xnnpack._blas import blas_threads, cblas_address  # noqa: E402
from edgeport_xnnpack.options import XnnpackRuntimeOptions  # noqa: E402

AVX2_ONLY = {"avx", "avx2", "fma", "f16c", "sse4_2"}


def test_auto_picks_the_host_only_where_the_2022_kernels_are_slow(monkeypatch):
    monkeypatch.setattr(_host_gemm.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(_host_gemm, "kernel_available", lambda: True)
    monkeypatch.setattr(_host_gemm._host_qs8, "kernel_available", lambda: True)
    monkeypatch.setattr(_host_gemm._host_conv, "kernel_level", lambda: 2)
    resolve = _host_gemm.resolve
    # AVX2, no AVX-512: float32 products; dense convolutions wherever the conv kernel runs (the 2022 library's
    # igemm is 7x16 on AVX-512, ExecuTorch's 7x32)
    assert resolve("auto", AVX2_ONLY) == {"float", "conv"}
    assert resolve("auto", AVX2_ONLY | {"avx512f", "avx512bw"}) == {"conv"}  # its AVX-512 GEMMs are fine
    assert resolve("auto", AVX2_ONLY | {"avx512f", "avx512bw", "avx512_vnni"}) == {"int8", "conv"}  # no VNNI there
    assert resolve("auto", {"sse4_2"}) == set()
    assert resolve("host", AVX2_ONLY | {"avx512f"}) == {"float", "int8", "conv"}
    assert resolve("host-float") == {"float"} and resolve("host-int8") == {"int8"}
    assert resolve("host-conv") == {"conv"} and resolve("host-float+host-conv") == {"float", "conv"}
    assert resolve("xnnpack", AVX2_ONLY) == set()
    assert _host_gemm.describe(frozenset({"int8", "float"})) == "host (float32, int8)"
    assert _host_gemm.describe(frozenset()) == "xnnpack"
    for kinds in (set(), {"float"}, {"int8"}, {"conv"}, {"float", "int8"}, {"float", "conv"}, {"int8", "conv"},
                  {"float", "int8", "conv"}):
        assert resolve(_host_gemm.choice_for(frozenset(kinds))) == kinds
    monkeypatch.setattr(_host_gemm._host_qs8, "kernel_available", lambda: False)
    monkeypatch.setattr(_host_gemm._host_conv, "kernel_level", lambda: 0)
    assert resolve("host") == {"float"}
    assert resolve("auto", AVX2_ONLY) == {"float"}
    with pytest.raises(ValueError, match="'host-int8' needs a CPU with AVX512-VNNI"):
        resolve("host-int8")
    with pytest.raises(ValueError, match="'host-conv' needs an x86-64 CPU with AVX2 and FMA"):
        resolve("host-float+host-conv")
    monkeypatch.setattr(_host_gemm.platform, "machine", lambda: "aarch64")
    assert resolve("auto", AVX2_ONLY | {"avx512_vnni"}) == set()
    with pytest.raises(ValueError, match="fully_connected must be one of"):
        resolve("gpu")
    with pytest.raises(ValueError, match="fully_connected must be one of"):
        resolve("auto+host-conv")
    with pytest.raises(ValueError, match="'auto', 'xnnpack', 'host', 'host-float', 'host-int8', 'host-conv'"):
        XnnpackRuntimeOptions(fully_connected="blas")


gemm = pytest.importorskip("edgeport_xnnpack._gemm", reason="the optional C extension was not built")


def _blas() -> tuple[int, int, bool]:
    sgemm, sgemv = cblas_address("sgemm"), cblas_address("sgemv")
    if sgemm is None or sgemv is None:
        pytest.skip("numpy's BLAS is not OpenBLAS")
    return sgemm[0], sgemv[0], sgemm[1]


def _run(m: int, k: int, n: int, transpose_w: bool, bias: bool, lo: float, hi: float, pool) -> None:
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n) if transpose_w else (n, k), dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32) if bias else None
    out = np.full((m, n), np.nan, np.float32)
    sgemm, sgemv, ilp64 = _blas()
    handle = pool.handle if pool is not None else 0
    parallelize = 0
    if handle:
        import ctypes

        parallelize = ctypes.cast(pool.lib.pool.pthreadpool_parallelize_1d, ctypes.c_void_p).value
    get, set_ = blas_threads()
    before = get()
    set_(1)
    try:
        gemm.fully_connected(parallelize, handle, sgemm, sgemv, ilp64, a, w, b, out, m, k, n, transpose_w, lo, hi,
                             pool.num_threads if handle else 1)
    finally:
        set_(before)
    w64 = w.astype(np.float64) if transpose_w else w.astype(np.float64).T
    ref = a.astype(np.float64) @ w64 + (b.astype(np.float64) if bias else 0.0)
    ref = np.clip(ref, lo, hi)
    assert np.abs(out - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()) * math.sqrt(k)


@needs_xnnpack
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, k, n", [(1, 1280, 1000), (1, 7, 3), (5, 33, 17), (128, 64, 96), (300, 24, 20),
                                     (3, 16, 200)])
def test_kernel_matches_float64_matmul(m, k, n, threads):
    pool = native.shared_pools.acquire(threads) if threads > 1 else None
    try:
        for transpose_w, bias, lo, hi in [(False, True, -math.inf, math.inf), (True, False, 0.0, 6.0),
                                          (False, False, -0.5, math.inf), (True, True, -math.inf, 1.0)]:
            _run(m, k, n, transpose_w, bias, lo, hi, pool)
    finally:
        if pool is not None:
            native.shared_pools.release(pool)


@pytest.mark.parametrize("change, message", [
    ({"a": np.zeros((2, 3), np.float64)}, "input must be a C-contiguous float32"),
    ({"a": np.zeros((2, 2), np.float32)}, "input holds 4 floats, 6 needed"),
    ({"w": np.zeros((3, 4), np.float32)[:, ::2]}, "contiguous"),
    ({"b": np.zeros(3, np.float32)}, "bias holds 3 floats, 4 needed"),
    ({"out": np.zeros((2, 4), np.float32)[:, :3]}, "contiguous"),
    ({"out": b"\0" * 32}, "writable"),
    ({"lo": 1.0, "hi": 0.0}, "bad output range"),
    ({"sgemm": 0}, "null sgemm"),
    ({"pool": 1234, "parallelize": 0}, "pthreadpool_parallelize_1d"),
    ({"m": 0}, "bad sizes"),
])
def test_kernel_refuses_bad_arguments_before_touching_memory(change, message):
    sgemm, sgemv, ilp64 = _blas()
    args = {"parallelize": 0, "pool": 0, "sgemm": sgemm, "sgemv": sgemv, "a": np.zeros((2, 3), np.float32),
            "w": np.zeros((4, 3), np.float32), "b": np.zeros(4, np.float32), "out": np.zeros((2, 4), np.float32),
            "m": 2, "lo": -math.inf, "hi": math.inf}
    args.update(change)
    with pytest.raises((ValueError, TypeError, BufferError), match=message):
        gemm.fully_connected(args["parallelize"], args["pool"], args["sgemm"], args["sgemv"], ilp64, args["a"],
                             args["w"], args["b"], args["out"], args["m"], 3, 4, False, args["lo"], args["hi"], 1)


packed = pytest.mark.skipif(not (hasattr(gemm, "packed_available") and gemm.packed_available()),
                            reason="this CPU has no AVX2/FMA: the micro-kernel does not run")


@needs_xnnpack
@packed
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, k, n", [(6, 1, 1), (7, 33, 17), (13, 16, 96), (200, 24, 144), (49, 160, 40),
                                     (3, 8, 300)])
def test_packed_kernel_matches_float64_matmul(m, k, n, threads):
    pool = native.shared_pools.acquire(threads) if threads > 1 else None
    try:
        import ctypes

        parallelize = ctypes.cast(pool.lib.pool.pthreadpool_parallelize_1d, ctypes.c_void_p).value if pool else 0
        rng = np.random.default_rng(m + k + n)
        for transpose_w, bias, lo, hi in [(False, True, -math.inf, math.inf), (True, True, 0.0, 6.0),
                                          (False, False, -0.25, 0.25)]:
            a = rng.standard_normal((m, k), dtype=np.float32)
            w = rng.standard_normal((k, n) if transpose_w else (n, k), dtype=np.float32)
            b = rng.standard_normal(n, dtype=np.float32) if bias else None
            wp, bp = _host_gemm.pack_filter(w, b, k, n, transpose_w)
            out = np.full((m, n), np.nan, np.float32)
            gemm.packed_gemm(parallelize, pool.handle if pool else 0, a, wp, bp, out, m, k, n, lo, hi, threads)
            ref = a.astype(np.float64) @ (w.astype(np.float64) if transpose_w else w.astype(np.float64).T)
            ref = np.clip(ref + (b if bias else 0.0), lo, hi)
            assert np.abs(out - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()) * math.sqrt(k)
    finally:
        if pool is not None:
            native.shared_pools.release(pool)


@packed
@pytest.mark.parametrize("change, message", [
    ({"w": np.zeros(16 * 3 - 1, np.float32)}, "packed filter holds 47 floats, 48 needed"),
    ({"b": np.zeros(15, np.float32)}, "packed bias holds 15 floats, 16 needed"),
    ({"a": np.zeros(5, np.float32)}, "input holds 5 floats, 6 needed"),
    ({"out": np.zeros(3, np.float32)}, "output holds 3 floats, 4 needed"),
    ({"out": np.zeros(4, np.float64)}, "output must be a C-contiguous float32"),
    ({"pool": 99}, "pthreadpool_parallelize_1d"),
    ({"lo": math.nan}, "bad output range"),
    ({"k": 0}, "bad sizes"),
])
def test_packed_kernel_refuses_bad_arguments(change, message):
    args = {"pool": 0, "a": np.zeros(6, np.float32), "w": np.zeros(48, np.float32), "b": np.zeros(16, np.float32),
            "out": np.zeros(4, np.float32), "lo": -math.inf, "k": 3}
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=message):
        gemm.packed_gemm(0, args["pool"], args["a"], args["w"], args["b"], args["out"], 2, args["k"], 2, args["lo"],
                         math.inf, 1)


class _Count:
    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        real = xnn_planner.product_op

        def counting(*args, **kwargs):
            op = real(*args, **kwargs)
            self.calls += op is not None
            return op
        monkeypatch.setattr(xnn_planner, "product_op", counting)
        monkeypatch.setattr(_host_gemm, "MIN_MACS", 0)  # every eligible product, however small, on the host


def _models():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, attn_implementation="eager")).eval()
    ids = torch.randint(0, 64, (1, 12))

    class Bert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=x).last_hidden_state

    resnet = transformers.ResNetModel(transformers.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck", num_channels=3)).eval()

    class ResNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.resnet = resnet

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.resnet(pixel_values=x).pooler_output

    from torch import nn

    block = nn.Sequential(nn.Conv2d(8, 48, 1), nn.BatchNorm2d(48), nn.ReLU6(),
                          nn.Conv2d(48, 48, 3, 2, 1, groups=48), nn.ReLU6(), nn.Conv2d(48, 16, 1), nn.Flatten(),
                          nn.Linear(16 * 8 * 8, 10)).eval()
    return {"bert": (Bert().eval(), (ids,)), "resnet": (ResNet(), (torch.randn(1, 3, 32, 32),)),
            "mobilenet_block": (block, (torch.randn(1, 8, 16, 16),))}


@needs_xnnpack
@pytest.mark.skipif(not _host_gemm.kernel_available(), reason="no C extension or OpenBLAS: numpy form only")
@pytest.mark.parametrize("name", ["bert", "resnet", "mobilenet_block"])
def test_programs_with_products_on_the_host_match_eager(name, monkeypatch):
    model, args = _models()[name]
    ref = eager(model, args)
    _, pte, _ = lower_edgeport(model, args)
    count = _Count(monkeypatch)
    for threads in (1, 2):
        method = Runtime.get().load_program(pte).load_method(
            "forward", backend_options={"XnnpackBackend": {"fully_connected": "host-float", "num_threads": threads}})
        out = method.execute([a.numpy() for a in args])[0]
        assert rel_err(out, ref) < RTOL
    assert count.calls > 0, "no product ran on the host"


@needs_xnnpack
def test_numpy_form_without_the_extension_matches_eager(monkeypatch):
    model, args = _models()["mobilenet_block"]
    ref = eager(model, args)
    _, pte, _ = lower_edgeport(model, args)
    count = _Count(monkeypatch)
    monkeypatch.setattr(_host_gemm, "_gemm", None)
    method = Runtime.get().load_program(pte).load_method(
        "forward", backend_options={"XnnpackBackend": {"fully_connected": "host-float"}})
    assert rel_err(method.execute([a.numpy() for a in args])[0], ref) < RTOL
    assert count.calls > 0


@needs_xnnpack
@packed
def test_packed_products_do_not_keep_a_second_copy_of_the_filter():
    from edgeport.program import load_pte
    from edgeport_xnnpack.runtime import XnnpackExecutor

    model, args = torch.nn.Linear(256, 512).eval(), (torch.randn(16, 256),)
    lp = load_pte(lower_edgeport(model, args)[1])
    ex = XnnpackExecutor(num_threads=1)
    h = ex.init(lp.delegate_data(0, 0), [], named_data=lp.named_data,
                runtime_options=XnnpackRuntimeOptions(fully_connected="host-float"))
    try:
        assert h.summary["fully_connected"] == "host (float32)" and h.summary["host_steps"] == 1
        assert sum(a.nbytes for a in h.buffers.values()) < 256 * 512 * 4  # only the packed copy holds the filter
        (out,) = ex.execute(h, [args[0].numpy()])
        assert rel_err(out, eager(model, args)) < RTOL
    finally:
        ex.destroy(h)


def _int8_model():
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeport_xnnpack.quantizer import XnnpackQuantizer

    torch.manual_seed(0)
    # a MobileNet stem (3x3 stride 2, padded, 3 input channels: rows gathered by qs8_im2col, k 27 -> 28), a 5x5 conv
    # with uneven pads, 1x1 convs, a depthwise conv (stays in XNNPACK) and a linear layer
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1), torch.nn.ReLU6(), torch.nn.Conv2d(8, 48, 1),
                                torch.nn.ReLU6(), torch.nn.Conv2d(48, 48, 3, 1, 1, groups=48), torch.nn.Conv2d(48, 12, 1),
                                torch.nn.ZeroPad2d((2, 1, 0, 2)), torch.nn.Conv2d(12, 20, 5, 1, (2, 1)),
                                torch.nn.Flatten(), torch.nn.Linear(20 * 14 * 13, 32)).eval()
    args = (torch.randn(1, 3, 23, 24),)
    prepared = prepare_pt2e(torch.export.export(model, args).module(), XnnpackQuantizer())
    for _ in range(4):
        prepared(torch.randn(*args[0].shape))
    return convert_pt2e(prepared), args


@needs_xnnpack
@pytest.mark.skipif(not _host_gemm._host_qs8.kernel_available(), reason="this CPU has no AVX512-VNNI")
def test_int8_products_on_vnni_equal_libxnnpack_and_the_pt2e_model(monkeypatch):
    quantized, args = _int8_model()
    with torch.no_grad():
        ref = quantized(*args).numpy()
    _, pte, _ = lower_edgeport(quantized, args)
    outs = {}
    for choice in ("xnnpack", "host-int8"):
        count = _Count(monkeypatch)
        for threads in (1, 2):
            method = Runtime.get().load_program(pte).load_method(
                "forward", backend_options={"XnnpackBackend": {"fully_connected": choice, "num_threads": threads}})
            outs[choice, threads] = method.execute([a.numpy() for a in args])[0]
        # per load: three 1x1 products (one a rewritten linear) and two gathered convolutions
        assert count.calls == (2 * 5 if choice == "host-int8" else 0)
    for threads in (1, 2):  # the same integers as libXNNPACK computes
        np.testing.assert_array_equal(outs["host-int8", threads], outs["xnnpack", 1])
    step = np.diff(np.unique(ref)).min()  # the output's quantization step (its values are multiples of it)
    assert np.abs(outs["host-int8", 1] - ref).max() <= 1.01 * step  # within one output step of the pt2e model


@pytest.mark.skipif(not _host_gemm._host_qs8.kernel_available(), reason="this CPU has no AVX512-VNNI")
@pytest.mark.parametrize("change, message", [
    ({"k": 6}, "a multiple of 4"),
    ({"w": np.zeros(63, np.int8)}, "packed filter holds 63 items, 64 needed"),
    ({"bias": np.zeros(16, np.float32)}, "packed bias must be a C-contiguous buffer of format 'i'"),
    ({"scale": np.zeros(15, np.float32)}, "packed scales holds 15 items, 16 needed"),
    ({"out": np.zeros(4, np.uint8)}, "output must be a C-contiguous buffer of format 'b'"),
    ({"zo": 200}, "bad output zero point"),
    ({"pool": 7}, "pthreadpool_parallelize_1d"),
])
def test_int8_kernel_refuses_bad_arguments(change, message):
    args = {"pool": 0, "a": np.zeros(8, np.int8), "w": np.zeros(64, np.int8), "bias": np.zeros(16, np.int32),
            "scale": np.zeros(16, np.float32), "out": np.zeros(4, np.int8), "k": 4, "zo": 0}
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=message):
        gemm.qs8_packed_gemm(0, args["pool"], args["a"], args["w"], args["bias"], args["scale"], args["out"], 2,
                             args["k"], 2, args["zo"], -128, 127, 1)


def _im2col_reference(x: np.ndarray, kh: int, kw: int, sh: int, sw: int, pads: tuple[int, int, int, int],
                      zero: int, kp: int) -> np.ndarray:
    pt, pr, pb, pl = pads
    b, h, w, c = x.shape
    xp = np.full((b, h + pt + pb, w + pl + pr, c), zero, np.int8)
    xp[:, pt:pt + h, pl:pl + w] = x
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    rows = np.zeros((b, oh, ow, kp), np.int8)
    for ky in range(kh):
        for kx in range(kw):
            tap = (ky * kw + kx) * c
            rows[..., tap:tap + c] = xp[:, ky:ky + sh * (oh - 1) + 1:sh, kx:kx + sw * (ow - 1) + 1:sw]
    return rows.reshape(b * oh * ow, kp)


@pytest.mark.skipif(gemm is None or not hasattr(gemm, "qs8_im2col"), reason="the C extension was not built")
@pytest.mark.parametrize("shape, kernel, stride, pads", [
    ((1, 23, 24, 3), (3, 3), (2, 2), (1, 1, 1, 1)),    # a stem: patch rows of 27 bytes (+1 padding byte)
    ((2, 9, 7, 16), (3, 3), (1, 1), (1, 1, 1, 1)),     # batch 2, 16-byte taps
    ((1, 8, 8, 5), (5, 3), (1, 2), (2, 0, 1, 2)),      # uneven pads, rectangular kernel
    ((1, 4, 4, 40), (2, 2), (2, 2), (0, 0, 0, 0)),     # taps wider than 32 bytes
])
def test_im2col_gathers_the_patches_numpy_gathers(shape, kernel, stride, pads):
    x = np.random.default_rng(0).integers(-128, 128, shape, dtype=np.int8)
    (kh, kw), (sh, sw), (pt, pr, pb, pl) = kernel, stride, pads
    b, h, w, c = shape
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    kp = -(-kh * kw * c // 4) * 4
    rows = np.full((b * oh * ow, kp), 99, np.int8)
    gemm.qs8_im2col(x, rows, b, h, w, c, kh, kw, sh, sw, pt, pl, oh, ow, kp, -7)
    np.testing.assert_array_equal(rows, _im2col_reference(x, kh, kw, sh, sw, pads, -7, kp))


@pytest.mark.skipif(gemm is None or not hasattr(gemm, "qs8_im2col"), reason="the C extension was not built")
@pytest.mark.parametrize("change, message", [
    ({"dst": np.zeros(4 * 4 * 28 - 1, np.int8)}, "output holds 447 items, 448 needed"),
    ({"src": np.zeros(8 * 8 * 3 - 1, np.int8)}, "input holds 191 items, 192 needed"),
    ({"src": np.zeros(8 * 8 * 3, np.uint8)}, "input must be a C-contiguous buffer of format 'b'"),
    ({"kp": 26}, "bad geometry"),
    ({"zero": 300}, "bad geometry"),
    ({"oh": -1}, "bad geometry"),
    ({"pt": -1}, "bad geometry"),
])
def test_im2col_refuses_bad_arguments(change, message):
    args = {"src": np.zeros(8 * 8 * 3, np.int8), "dst": np.zeros(4 * 4 * 28, np.int8), "kp": 28, "zero": 0, "oh": 4,
            "pt": 1}
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=message):
        gemm.qs8_im2col(args["src"], args["dst"], 1, 8, 8, 3, 3, 3, 2, 2, args["pt"], 1, args["oh"], 4, args["kp"],
                        args["zero"])


@needs_xnnpack
@pytest.mark.parametrize("batch, host_steps", [(1, 0), (5, 0), (6, 1)])
def test_float_products_below_six_rows_stay_in_xnnpack(batch, host_steps):
    """A matrix-vector product (a classifier head at batch 1) stays in libXNNPACK even with "host-float"."""
    from edgeport.program import load_pte
    from edgeport_xnnpack.runtime import XnnpackExecutor

    model, args = torch.nn.Linear(1280, 1000).eval(), (torch.randn(batch, 1280),)
    lp = load_pte(lower_edgeport(model, args)[1])
    ex = XnnpackExecutor(num_threads=1)
    h = ex.init(lp.delegate_data(0, 0), [], named_data=lp.named_data,
                runtime_options=XnnpackRuntimeOptions(fully_connected="host-float"))
    try:
        assert h.summary["host_steps"] == host_steps
        assert rel_err(ex.execute(h, [args[0].numpy()])[0], eager(model, args)) < RTOL
    finally:
        ex.destroy(h)
