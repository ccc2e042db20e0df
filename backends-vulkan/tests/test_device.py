"""VulkanDevice, buffers, kernels and raw dispatch."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from edgeport_vulkan import Kernel, VulkanDevice, dispatch

pytestmark = pytest.mark.usefixtures("device")


def test_device_info(device):
    info = device.info
    assert info.name and info.device_type in {"discrete-gpu", "integrated-gpu", "virtual-gpu", "cpu", "other"}
    assert info.max_push_constants_size >= 128
    assert min(info.max_workgroup_count) >= 65535
    assert VulkanDevice.get() is device


def test_buffer_roundtrip(device):
    with device.buffer(40) as buf:
        data = np.arange(10, dtype=np.float32)
        buf.write(data)
        np.testing.assert_array_equal(buf.read((2, 5)), data.reshape(2, 5))
        with pytest.raises(ValueError):
            buf.write(np.zeros(11, np.float32))
        with pytest.raises(ValueError):
            buf.read((11,))
    assert not buf.alive
    with pytest.raises(ValueError):
        device.buffer(0)


def test_raw_dispatch_fill(device):
    kernel = device.kernel("fill")
    assert isinstance(kernel, Kernel) and device.kernel("fill") is kernel
    assert (kernel.bindings, kernel.push_constant_size, kernel.local_size) == (1, 8, (256, 1, 1))
    n = 1000
    with device.buffer(n * 4) as buf:
        dispatch(kernel, [buf], struct.pack("<if", n, 2.5), (4, 1, 1))
        np.testing.assert_array_equal(buf.read((n,)), np.full(n, 2.5, np.float32))
        # several dispatches in one submission, ordered by barriers
        device.submit([(kernel, [buf], struct.pack("<if", n, 1.0), (1, 1, 1)),
                       (kernel, [buf], struct.pack("<if", n // 2, 7.0), (2, 1, 1))])
        out = buf.read((n,))
        assert (out[: n // 2] == 7.0).all() and (out[n // 2:] == 1.0).all()


def test_dispatch_validation(device):
    kernel = device.kernel("fill")
    with device.buffer(16) as buf:
        pc = struct.pack("<if", 4, 0.0)
        with pytest.raises(ValueError, match="buffers expected"):
            device.dispatch(kernel, [buf, buf], pc, (1, 1, 1))
        with pytest.raises(ValueError, match="push constants"):
            device.dispatch(kernel, [buf], pc + b"\0\0\0\0", (1, 1, 1))
        with pytest.raises(ValueError, match="workgroup counts"):
            device.dispatch(kernel, [buf], pc, (0, 1, 1))
        with pytest.raises(ValueError, match="workgroup counts"):
            device.dispatch(kernel, [buf], pc, (1 << 20, 1, 1))
    with pytest.raises(ValueError, match="live Buffers"):
        device.dispatch(kernel, [buf], pc, (1, 1, 1))
    with pytest.raises(ValueError, match="unknown shader"):
        device.kernel("nope")


def test_kernels_cached_per_specialization(device):
    relu, relu2, sig = device.kernel("unary", (0,)), device.kernel("unary", [0]), device.kernel("unary", (2,))
    assert relu is relu2 and relu is not sig and relu.spec == (0,)
    assert device.kernel("binary").interface.spec_constants == (0, 1)
    with pytest.raises(ValueError, match="specialization"):
        device.kernel("fill", (1,))


def test_quiet_without_xdg_runtime_dir():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    code = ("import numpy as np; from edgeport_vulkan import run_op; "
            "assert (run_op('relu', [np.array([-1.0, 2.0], np.float32)]) == [0, 2]).all()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
