"""Repository-wide test fixtures: the seed tutorial's demo backend, registered as a user-script plugin."""

from __future__ import annotations

import pytest
import torch

from edgeport.testing.tutorial_backend import add_mul_partitioner, demo_backend_registered


@pytest.fixture
def demo_backend():
    with demo_backend_registered() as backend_id:
        yield backend_id


@pytest.fixture
def demo_partitioner(demo_backend):
    return add_mul_partitioner


@pytest.fixture
def seeded():
    torch.manual_seed(0)
