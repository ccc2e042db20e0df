"""Float32 dense convolutions on edgeport's indirect-GEMM kernel (``fully_connected="host-conv"``).

Oracles: libXNNPACK's own output for the same program and inputs (``fully_connected="xnnpack"``: the kernel must
equal it bit for bit, on its AVX-512 and its AVX2 micro-kernel, 1 and 2 threads) and eager PyTorch (tolerance).
"""

from __future__ import annotations

import numpy as np
import pytest
from xnn_helpers import RTOL, eager, lower_edgeport, needs_xnnpack, rel_err

torch = pytest.importorskip("torch")

from edgeport.runtime import Runtime  # noqa: E402
from edgeport_xnnpack import _host_conv, _host_gemm  # noqa: E402
from edgeport_xnnpack.options import XnnpackRuntimeOptions  # noqa: E402

LEVEL = _host_conv.kernel_level()
ISAS = [isa for isa, level in (("avx512", 2), ("avx2", 1)) if LEVEL >= level]
needs_kernel = pytest.mark.skipif(LEVEL == 0, reason="no C extension or no AVX2/FMA: the kernel does not run here")


class _Count:
    """Counts the convolutions that became host ops (every eligible one, however small)."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        real = _host_conv.conv_op

        def counting(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(_host_conv, "conv_op", counting)
        monkeypatch.setattr(_host_gemm, "MIN_MACS", 0)


def _convs() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from torch import nn

    torch.manual_seed(0)
    # a 7x7 stride-2 stem over 3 channels, 3x3 stride 1 and 2, a 5x5 with uneven pads, channel counts that are not
    # multiples of 16 or 32 (output tails), pixel counts that are not multiples of 6 or 7 (pixel tails), ReLU6 clamps
    model = nn.Sequential(nn.Conv2d(3, 40, 7, 2, 3, bias=False), nn.BatchNorm2d(40), nn.ReLU(),
                          nn.Conv2d(40, 40, 3, 1, 1), nn.ReLU6(), nn.Conv2d(40, 72, 3, 2, 1),
                          nn.ZeroPad2d((2, 1, 0, 2)), nn.Conv2d(72, 20, 5, 1, (2, 1)), nn.Hardtanh(-0.5, 0.5),
                          nn.Conv2d(20, 33, 1, 2)).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model, (torch.randn(2, 3, 45, 38),)


def _run(pte: bytes, args: tuple, choice: str, threads: int) -> np.ndarray:
    method = Runtime.get().load_program(pte).load_method(
        "forward", backend_options={"XnnpackBackend": {"fully_connected": choice, "num_threads": threads}})
    return method.execute([a.numpy() for a in args])[0]


def _host_runs_equal_libxnnpack(model: torch.nn.Module, args: tuple, monkeypatch) -> int:
    """Runs ``model``'s program with its convolutions on the host kernel at 1 and 2 threads, asserts the outputs
    equal libXNNPACK's bit for bit and eager's within tolerance; returns how many host convolution ops were made."""
    ref = eager(model, args)
    _, pte, _ = lower_edgeport(model, args)
    theirs = _run(pte, args, "xnnpack", 1)
    count = _Count(monkeypatch)
    for threads in (1, 2):
        ours = _run(pte, args, "host-conv", threads)
        np.testing.assert_array_equal(ours, theirs)
        assert rel_err(ours, ref) < RTOL
    return count.calls


@needs_xnnpack
@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_convolutions_equal_libxnnpack_bit_for_bit_and_eager(isa, monkeypatch):
    monkeypatch.setenv(_host_conv.ISA_ENV, isa)
    model, args = _convs()
    # per load: all five (the 7x7 stem over 3 channels on row taps, the strided 1x1)
    assert _host_runs_equal_libxnnpack(model, args, monkeypatch) == 2 * 5


@needs_xnnpack
@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_resnet18_with_its_convolutions_on_the_host_equals_libxnnpack(isa, monkeypatch):
    from xnn_zoo import resnet18

    monkeypatch.setenv(_host_conv.ISA_ENV, isa)
    model, args = resnet18(64)
    ref = eager(model, args)
    _, pte, _ = lower_edgeport(model, args)
    theirs = _run(pte, args, "xnnpack", 1)
    count = _Count(monkeypatch)
    ours = {threads: _run(pte, args, "auto", threads) for threads in (1, 2)}
    assert count.calls == 2 * 20  # per load: the stem, the 16 3x3 convolutions and the 3 strided 1x1 projections
    for out in ours.values():
        np.testing.assert_array_equal(out, theirs)
    assert rel_err(ours[1], ref) < RTOL


@needs_xnnpack
@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_large_filters_read_in_chunks_equal_libxnnpack_bit_for_bit(isa, monkeypatch):
    from torch import nn

    from edgeport_xnnpack import _gemm

    monkeypatch.setenv(_host_conv.ISA_ENV, isa)
    torch.manual_seed(1)
    # 256 -> 136 channels (a 40-channel panel tail) over 20x21 pixels: 60 tiles, more than one group of tiles per
    # item, and chunks of taps that do not divide the 9 taps; 600 -> 56: a chunk holds less than one tap
    model = nn.Sequential(nn.Conv2d(256, 136, 3, 1, 1), nn.ReLU(), nn.Conv2d(136, 600, 1),
                          nn.Conv2d(600, 56, 3, 2, 1), nn.Hardtanh(-0.7, 0.9)).eval()
    args = (torch.randn(1, 256, 20, 21),)
    nr = _host_conv._SHAPE[_host_conv.kernel_level()][1]
    for c, n in ((256, 136), (600, 56)):
        packed, _ = _host_conv.pack(np.zeros((n, 3, 3, c), np.float32), None, 9, c, n, nr)
        assert packed.nbytes > _gemm.CONV_LARGE_FILTER_BYTES  # the chunked path, not one pass per tile
        assert c * nr * 4 * 9 > _gemm.CONV_CHUNK_BYTES  # more than one chunk per panel
    assert _host_runs_equal_libxnnpack(model, args, monkeypatch) == 2 * 2  # the two 3x3 convolutions per load


def test_tap_offsets_point_at_the_pixels_numpy_indexes():
    # batch 2, 5x4 input, 3 channels, 3x3 kernel, stride 2, pads top 1 left 0 -> 3x2 output, 6 pixels per tile
    geometry = (2, 5, 4, 3, 3, 3, 2, 2, 1, 0, 3, 2)
    off = _host_conv.tap_offsets(geometry, 7)
    assert off.shape == (2, 9, 7)  # 12 pixels in tiles of 7: the second tile repeats its last pixel twice
    x = np.arange(2 * 5 * 4 * 3, dtype=np.int64).reshape(2, 5, 4, 3)
    padded = np.full((2, 7, 6, 3), -1, np.int64)  # pads: 1 top, 1 bottom (enough), 0 left, 2 right
    padded[:, 1:6, 0:4] = x
    flat = off.transpose(0, 2, 1).reshape(14, 9)
    for p in range(14):
        b, oy, ox = np.unravel_index(min(p, 11), (2, 3, 2))
        for t in range(9):
            ky, kx = divmod(t, 3)
            want = padded[b, oy * 2 + ky, ox * 2 + kx, 0]
            assert flat[p, t] == want  # the first channel's offset is its value; -1 in the padding


def test_row_offsets_point_at_each_kernel_rows_first_pixel_in_the_padded_input():
    # a stem: batch 2, 5x4 input, 3 channels, 3x3 kernel, stride 2, pads top 1 left 1 -> 3x2 output; rows of 9 floats
    geometry = (2, 5, 4, 3, 3, 3, 2, 2, 1, 1, 3, 2)
    hp, wp = _host_conv.padded_extent(geometry)
    assert (hp, wp) == (7, 5)  # rows 0..6 (top pad 1 + 5 + bottom 1), cols 0..4 (left pad 1 + 4, none right)
    off = _host_conv.row_offsets(geometry, 7)
    assert off.shape == (2, 3, 7)
    x = np.arange(2 * 5 * 4 * 3, dtype=np.float32).reshape(2, 5, 4, 3)
    padded = np.zeros((2, hp, wp, 3), np.float32)
    padded[:, 1:6, 1:5] = x
    flat_in = padded.reshape(-1)
    flat = off.transpose(0, 2, 1).reshape(14, 3)
    for p in range(14):
        b, oy, ox = np.unravel_index(min(p, 11), (2, 3, 2))
        for ky in range(3):
            want = padded[b, oy * 2 + ky, ox * 2:ox * 2 + 3].reshape(-1)  # the 3 kx taps' channels, (kx, c) order
            np.testing.assert_array_equal(flat_in[flat[p, ky]:flat[p, ky] + 9], want)


@needs_xnnpack
@needs_kernel
def test_a_stem_with_short_kernel_rows_stays_in_xnnpack(monkeypatch):
    from torch import nn

    count = _Count(monkeypatch)
    model, args = nn.Conv2d(3, 32, 3, 2, 1).eval(), (torch.randn(1, 3, 33, 33),)
    _, pte, _ = lower_edgeport(model, args)
    out = _run(pte, args, "host-conv", 1)  # MobileNetV2's stem: rows of 3 x 3 floats, fewer than MIN_CHANNELS
    assert count.calls == 0
    assert rel_err(out, eager(model, args)) < RTOL


@needs_kernel
@pytest.mark.parametrize("change, message", [
    ({"level": 3}, "kernel level 3 is not available"),
    ({"x_len": 2}, "bad sizes"),
    ({"w": np.zeros(10, np.float32)}, "packed filter holds 10 items"),
    ({"zero": np.zeros(2, np.float32)}, "zero row holds 2 items, 4 needed"),
    ({"offsets": np.zeros(162, np.int32)}, "tap offsets \\(int64\\) must be a C-contiguous buffer"),
    ({"offsets": np.full(162, 61, np.int64)}, "tap offset 61 outside an input of 64 floats"),
    ({"offsets": np.full(162, -2, np.int64)}, "tap offset -2 outside"),
    ({"out": np.zeros(8, np.float32)}, "output holds 8 items"),
    ({"lo": 1.0, "hi": 0.0}, "bad output range"),
    ({"pool": 7}, "pthreadpool_parallelize_1d"),
])
def test_kernel_refuses_bad_arguments_before_touching_memory(change, message):
    from edgeport_xnnpack import _gemm

    level = 1
    mr, nr = 6, 16
    # 4x4 input of 4 channels, 3x3 kernel, 8 output channels: 16 pixels, 9 taps, 3 tiles of 6
    kw = {"parallelize": 0, "pool": 0, "level": level, "x": np.zeros(64, np.float32), "x_len": 64,
          "w": np.zeros(9 * 4 * nr, np.float32), "b": np.zeros(nr, np.float32), "zero": np.zeros(4, np.float32),
          "offsets": np.zeros(3 * 9 * mr, np.int64), "out": np.zeros(16 * 8, np.float32), "m": 16, "taps": 9, "c": 4,
          "n": 8, "lo": -np.inf, "hi": np.inf, "threads": 1}
    _gemm.conv_packed(*kw.values())  # the unchanged arguments run
    kw.update(change)
    with pytest.raises((ValueError, TypeError, RuntimeError), match=message):
        _gemm.conv_packed(*kw.values())


def test_the_option_names_the_convolution_choice_and_refuses_unknown_ones():
    assert XnnpackRuntimeOptions(fully_connected="host-float+host-conv").fully_connected == "host-float+host-conv"
    for bad in ("host-conv+auto", "conv", "host-conv+"):
        with pytest.raises(ValueError, match="'host-conv' or a '\\+'-joined combination"):
            XnnpackRuntimeOptions(fully_connected=bad)


def test_the_isa_switch_refuses_unknown_values(monkeypatch):
    monkeypatch.setenv(_host_conv.ISA_ENV, "sse")
    with pytest.raises(ValueError, match="must be 'avx2', 'avx512' or unset"):
        _host_conv.kernel_level()


@needs_xnnpack
@needs_kernel
def test_auto_runs_convolutions_on_the_host_and_says_so():
    from edgeport.program import load_pte
    from edgeport_xnnpack.runtime import XnnpackExecutor

    model, args = torch.nn.Conv2d(32, 64, 3, 1, 1).eval(), (torch.randn(1, 32, 28, 28),)
    lp = load_pte(lower_edgeport(model, args)[1])
    ex = XnnpackExecutor(num_threads=1)
    h = ex.init(lp.delegate_data(0, 0), [], named_data=lp.named_data, runtime_options=XnnpackRuntimeOptions())
    try:
        assert "float32 convolutions" in h.summary["fully_connected"] and h.summary["host_steps"] >= 1
        (out,) = ex.execute(h, [args[0].numpy()])
        assert rel_err(out, eager(model, args)) < RTOL
    finally:
        ex.destroy(h)
