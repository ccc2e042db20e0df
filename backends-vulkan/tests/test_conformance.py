"""VulkanBackend runs edgeport's conformance suite; every case executes on the Vulkan device (lavapipe here)."""

from __future__ import annotations

import pytest

from edgeport.testing import BackendConformance
from edgeport_vulkan.options import VulkanCompileOptions
from edgeport_vulkan.partitioner import VulkanPartitioner


class TestVulkanConformance(BackendConformance):
    backend_id = "VulkanBackend"
    known_gaps: dict[str, str] = {}
    stock_runtime = False  # ExecuTorch 1.5.1's runtime wheel has no Vulkan delegate

    @pytest.fixture
    def compile_options(self):
        return VulkanCompileOptions()

    @pytest.fixture
    def partitioner(self, compile_options):
        return VulkanPartitioner(compile_options)
