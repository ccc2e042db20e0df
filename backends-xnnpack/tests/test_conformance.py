"""XnnpackBackend runs edgeport's conformance suite (``edgeport.testing.BackendConformance``)."""

from __future__ import annotations

import pytest

from edgeport.testing import BackendConformance
from edgeport_xnnpack import XnnpackCompileOptions, XnnpackPartitioner


class TestXnnpackConformance(BackendConformance):
    backend_id = "XnnpackBackend"
    known_gaps: dict[str, str] = {}

    @pytest.fixture
    def compile_options(self):
        return XnnpackCompileOptions()

    @pytest.fixture
    def partitioner(self, compile_options):
        return XnnpackPartitioner(compile_options)
