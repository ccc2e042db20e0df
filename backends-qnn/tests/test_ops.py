"""QNN ops on the HTP backend (x86: Qualcomm's emulator) against numpy: fp32 and uint8 scale-offset."""

from __future__ import annotations

import time

import numpy as np

from edgeport_qnn.sdk import QuantParams

CONV_PARAMS = {"dilation": np.array([1, 1], np.uint32), "group": 1}


def conv_params(stride: int, pad: int) -> dict:
    return {"stride": np.array([stride, stride], np.uint32),
            "pad_amount": np.full((2, 2), pad, np.uint32), **CONV_PARAMS}


def quantize(real: np.ndarray, q: QuantParams, dtype=np.uint8) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(np.round(real / q.scales[0]) + q.zero_points[0], info.min, info.max).astype(dtype)


def test_elementwise_add_fp32(context, rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((2, 3, 4)).astype(np.float32)
    g = context.graph_builder("add")
    g.add_input("a", a.shape, np.float32)
    g.add_input("b", b.shape, np.float32)
    g.add_output("y", a.shape, np.float32)
    g.add_node("ElementWiseAdd", "add0", ["a", "b"], ["y"])
    graph = g.finalize()
    (y,) = graph.execute([a, b])
    assert y.dtype == np.float32 and y.shape == a.shape
    np.testing.assert_array_equal(y, a + b)
    (y2,) = g.execute([b, a])  # the builder runs its finalized graph too
    np.testing.assert_array_equal(y2, a + b)


def test_fully_connected_with_bias_then_relu_fp32(context, rng):
    x = rng.standard_normal((3, 16)).astype(np.float32)
    w = rng.standard_normal((6, 16)).astype(np.float32)  # [out, in]
    b = rng.standard_normal(6).astype(np.float32)
    g = context.graph_builder("fc_relu")
    g.add_input("x", x.shape, np.float32)
    g.add_static("w", w)
    g.add_static("b", b)
    g.add_output("y", (3, 6), np.float32)
    g.add_output("h_out", (3, 6), np.float32)
    g.add_node("FullyConnected", "fc0", ["x", "w", "b"], ["h_out"], {"keep_dims": False})
    g.add_node("Relu", "relu0", ["h_out"], ["y"])
    y, h = g.finalize().execute([x])
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + b
    np.testing.assert_allclose(h, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, np.maximum(ref, 0), rtol=1e-5, atol=1e-5)
    assert (y >= 0).all() and (y == 0).any()


def test_relu_fp32(context):
    x = np.array([[-2.5, -0.0, 0.0, 1.5, 3e38, -3e38, 1e-30, -1e-30]], np.float32)
    g = context.graph_builder("relu")
    g.add_input("x", x.shape, np.float32)
    g.add_output("y", x.shape, np.float32)
    g.add_node("Relu", "relu0", ["x"], ["y"])
    (y,) = g.finalize().execute([x])
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_conv2d_nhwc_fp32(context, rng, conv_reference):
    x = rng.standard_normal((1, 7, 7, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)  # [kh, kw, in, out]
    b = rng.standard_normal(4).astype(np.float32)
    g = context.graph_builder("conv")
    g.add_input("x", x.shape, np.float32)
    g.add_static("w", w)
    g.add_static("b", b)
    g.add_output("same", (1, 7, 7, 4), np.float32)
    g.add_output("strided", (1, 3, 3, 4), np.float32)
    g.add_node("Conv2d", "conv_same", ["x", "w", "b"], ["same"], conv_params(1, 1))
    g.add_node("Conv2d", "conv_s2", ["x", "w", "b"], ["strided"], conv_params(2, 0))
    graph = g.finalize()
    same, strided = graph.execute([x])
    np.testing.assert_allclose(same, conv_reference(x, w, b, 1, 1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(strided, conv_reference(x, w, b, 2, 0), rtol=1e-5, atol=1e-5)
    start = time.perf_counter()
    for _ in range(10):
        graph.execute([x])
    assert (time.perf_counter() - start) / 10 < 1.0  # measured ~1 ms per run on the emulator


def test_elementwise_add_uint8_exact(context, rng):
    q = QuantParams(0.1, 128)
    a = rng.integers(64, 192, (1, 32), dtype=np.uint8)
    b = rng.integers(64, 192, (1, 32), dtype=np.uint8)
    g = context.graph_builder("qadd")
    g.add_input("a", a.shape, np.uint8, q)
    g.add_input("b", b.shape, np.uint8, q)
    g.add_output("y", a.shape, np.uint8, q)
    g.add_node("ElementWiseAdd", "add0", ["a", "b"], ["y"])
    (y,) = g.finalize().execute([a, b])
    assert y.dtype == np.uint8
    np.testing.assert_array_equal(y, (a.astype(int) + b.astype(int) - 128).astype(np.uint8))


def test_requantizing_add_uint8_within_one_step(context, rng):
    qa, qb, qo = QuantParams(0.05, 100), QuantParams(0.08, 140), QuantParams(0.2, 120)
    a = rng.integers(0, 256, (4, 16), dtype=np.uint8)
    b = rng.integers(0, 256, (4, 16), dtype=np.uint8)
    g = context.graph_builder("qadd2")
    g.add_input("a", a.shape, np.uint8, qa)
    g.add_input("b", b.shape, np.uint8, qb)
    g.add_output("y", a.shape, np.uint8, qo)
    g.add_node("ElementWiseAdd", "add0", ["a", "b"], ["y"])
    (y,) = g.finalize().execute([a, b])
    real = (a.astype(np.float64) - 100) * 0.05 + (b.astype(np.float64) - 140) * 0.08
    assert np.abs(y.astype(int) - quantize(real, qo).astype(int)).max() <= 1


def test_fully_connected_uint8_with_int32_bias_exact(context, rng):
    qx, qw, qo = QuantParams(0.05, 128), QuantParams(0.02, 128), QuantParams(0.1, 100)
    x = rng.integers(0, 256, (2, 16), dtype=np.uint8)
    w = rng.integers(0, 256, (6, 16), dtype=np.uint8)
    b = rng.integers(-500, 500, 6).astype(np.int32)
    g = context.graph_builder("qfc")
    g.add_input("x", x.shape, np.uint8, qx)
    g.add_static("w", w, qw)
    g.add_static("b", b, QuantParams(0.05 * 0.02, 0))
    g.add_output("y", (2, 6), np.uint8, qo)
    g.add_node("FullyConnected", "fc0", ["x", "w", "b"], ["y"])
    (y,) = g.finalize().execute([x])
    real = ((x - 128.0) * 0.05) @ ((w - 128.0) * 0.02).T + b * 0.05 * 0.02
    np.testing.assert_array_equal(y, quantize(real, qo))


def test_conv2d_relu_uint8_exact_and_asymmetric_weights_close(context, rng, conv_reference):
    qx, qo = QuantParams(0.05, 128), QuantParams(0.1, 100)
    x = rng.integers(0, 256, (1, 5, 5, 2), dtype=np.uint8)
    w = rng.integers(0, 256, (3, 3, 2, 3), dtype=np.uint8)
    b = rng.integers(-200, 200, 3).astype(np.int32)
    results = {}
    for zw, max_error in ((128, 0), (120, 2)):  # HTP requantizes asymmetric weights: off by <= 2 steps
        g = context.graph_builder(f"qconv{zw}")
        g.add_input("x", x.shape, np.uint8, qx)
        g.add_static("w", w, QuantParams(0.02, zw))
        g.add_static("b", b, QuantParams(0.05 * 0.02, 0))
        g.add_output("y", (1, 3, 3, 3), np.uint8, qo)
        g.add_node("Conv2d", "conv0", ["x", "w", "b"], [("c", (1, 3, 3, 3), np.uint8, qo)], conv_params(1, 0))
        g.add_node("Relu", "relu0", ["c"], ["y"])
        (y,) = g.finalize().execute([x])
        real = conv_reference((x - 128.0) * 0.05, (w - float(zw)) * 0.02, b * 0.05 * 0.02)
        error = np.abs(y.astype(int) - quantize(np.maximum(real, 0), qo).astype(int)).max()
        assert error <= max_error, (zw, error)
        results[zw] = y
    assert results[128].shape == (1, 3, 3, 3)


def test_conv2d_int8_per_channel_weights(context, rng, conv_reference):
    qx, qo = QuantParams(0.05, 128), QuantParams(0.1, 100)
    scales = (0.01, 0.02, 0.03)
    x = rng.integers(0, 256, (1, 5, 5, 2), dtype=np.uint8)
    w = rng.integers(-127, 128, (3, 3, 2, 3), dtype=np.int8)
    b = rng.integers(-200, 200, 3).astype(np.int32)
    g = context.graph_builder("pcconv")
    g.add_input("x", x.shape, np.uint8, qx)
    g.add_static("w", w, QuantParams(scales, (0, 0, 0), axis=3))
    g.add_static("b", b, QuantParams(tuple(0.05 * s for s in scales), (0, 0, 0), axis=0))
    g.add_output("y", (1, 3, 3, 3), np.uint8, qo)
    g.add_node("Conv2d", "conv0", ["x", "w", "b"], ["y"], conv_params(1, 0))
    (y,) = g.finalize().execute([x])
    real = conv_reference((x - 128.0) * 0.05, w * np.array(scales), b * 0.05 * np.array(scales))
    assert np.abs(y.astype(int) - quantize(real, qo).astype(int)).max() <= 1
