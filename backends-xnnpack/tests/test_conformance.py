"""XnnpackBackend runs edgeport's conformance suite (``edgeport.testing.BackendConformance``)."""

from __future__ import annotations

import pytest

from edgeport.testing import BackendConformance
from edgeport_xnnpack import XnnpackCompileOptions, XnnpackPartitioner


class TestXnnpackConformance(BackendConformance):
    backend_id = "XnnpackBackend"
    known_gaps: dict[str, str] = {}
    stock_runtime = True  # ExecuTorch 1.5.1 has XnnpackBackend: every case also runs on its runtime

    @pytest.fixture
    def compile_options(self):
        return XnnpackCompileOptions()

    @pytest.fixture
    def partitioner(self, compile_options):
        return XnnpackPartitioner(compile_options)
