"""Fixtures of the Vulkan backend's tests: the shared device, or a skip when this machine has none."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def device():
    from edgeport_vulkan import VulkanDevice, VulkanUnavailableError

    try:
        return VulkanDevice.get()
    except VulkanUnavailableError as exc:
        pytest.skip(f"no Vulkan device on this machine ({exc}); install mesa-vulkan-drivers libvulkan1 for lavapipe")
