"""Fixtures of the Vulkan backend's tests: the shared device, or a skip when this machine has none.

Also puts this folder on sys.path so the tests can import their helpers (vk_models).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def device():
    from edgeport_vulkan import VulkanDevice, VulkanUnavailableError

    try:
        return VulkanDevice.get()
    except VulkanUnavailableError as exc:
        pytest.skip(f"no Vulkan device on this machine ({exc}); install mesa-vulkan-drivers libvulkan1 for lavapipe")
