"""TOSABackend (TOSA-1.0+FP) runs edgeport's conformance suite; the reference model executes every case."""

from __future__ import annotations

import pytest

from edgeport.testing import BackendConformance
from edgeport_arm import TosaCompileSpec, TOSAPartitioner


class TestTosaConformance(BackendConformance):
    backend_id = "TOSABackend"
    known_gaps: dict[str, str] = {}
    stock_runtime = False  # ExecuTorch 1.5.1's runtime wheel has no TOSABackend

    @pytest.fixture
    def compile_options(self):
        return TosaCompileSpec("TOSA-1.0+FP")

    @pytest.fixture
    def partitioner(self, compile_options):
        return TOSAPartitioner(compile_options)
