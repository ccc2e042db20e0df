"""Registration of VulkanBackend (entry point, lazy imports, availability) and ``describe_blob``."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_registered_without_importing_torch_or_vulkan():
    code = ("import sys, edgeport\n"
            "from edgeport.registry import get_backend\n"
            "spec = get_backend('VulkanBackend')\n"
            "assert spec.capabilities().lookup('aten.linear.default')\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "assert 'vulkan' not in sys.modules, 'vulkan imported'\n"
            "print(spec.backend_id, spec.distribution)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["VulkanBackend", "edgeport-vulkan"]


def test_is_available_names_the_fix(monkeypatch):
    from edgeport_vulkan import plugin
    from edgeport_vulkan.device import VulkanDevice, VulkanUnavailableError

    ok, why = plugin._available()
    assert isinstance(ok, bool) and why

    def broken(cls):
        raise VulkanUnavailableError("no loader")

    monkeypatch.setattr(VulkanDevice, "get", classmethod(broken))
    ok, why = plugin._available()
    assert not ok and "apt-get install mesa-vulkan-drivers libvulkan1" in why


def test_describe_blob(device):
    import torch
    from vk_models import CNN, lower

    from edgeport.program import load_pte
    from edgeport_vulkan.describe import describe_blob
    from edgeport_vulkan.partitioner import VulkanPartitioner

    torch.manual_seed(0)
    blob = bytes(load_pte(lower(CNN(), (torch.randn(1, 3, 8, 8),), VulkanPartitioner())).delegate_data(0, 0))
    d = describe_blob(blob)
    assert d["operators"]["aten.convolution.default"] == 2 and d["inputs"] == 1 and d["outputs"] == 1
    assert d["inline_constant_bytes"] > 0 and d["named_constants"] == 0
    with pytest.raises(ValueError):
        describe_blob(b"\0\0\0\0VH00" + bytes(10))
