"""Fixtures of the QNN tests: one HTP backend per session; everything skips when Qualcomm's libraries are absent."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from edgeport_qnn.sdk.locate import INSTALL_HINT, qnn_available

sys.path.insert(0, str(Path(__file__).parent))  # the tests' helpers (qnn_models)


@pytest.fixture(scope="session")
def requires_qnn():
    """Skip (saying how to install them) when Qualcomm's QNN libraries are absent."""
    if not qnn_available():
        pytest.skip(f"QNN libraries not found; to run these tests, {INSTALL_HINT}")


@pytest.fixture(scope="session")
def backend(requires_qnn):
    from edgeport_qnn.sdk import QnnBackend

    with QnnBackend.load("htp") as b:
        yield b


@pytest.fixture
def context(backend):
    with backend.create_context() as c:
        yield c


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def conv2d_nhwc_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int = 1, pad: int = 0):
    """Float64 reference convolution: x [n, h, w, c], w [kh, kw, c, o] (QNN's layouts)."""
    x = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    kh, kw, _, o = w.shape
    oh = (x.shape[1] - kh) // stride + 1
    ow = (x.shape[2] - kw) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, o))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :]
            out[:, i, j, :] = np.einsum("nhwc,hwco->no", patch, w.astype(np.float64))
    return out + (0 if b is None else b.astype(np.float64))


@pytest.fixture
def conv_reference():
    return conv2d_nhwc_reference
