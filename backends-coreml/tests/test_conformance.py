"""CoreMLBackend (float32) runs edgeport's conformance suite: every claimed op is partitioned, lowered by
coremltools, written and read back; execution is skipped off macOS (Core ML runs on macOS 13+/iOS 16+)."""

from __future__ import annotations

import pytest

from edgeport.testing import BackendConformance
from edgeport_coreml import CoreMLCompileSpec, CoreMLPartitioner


@pytest.mark.slow
class TestCoreMLConformance(BackendConformance):
    backend_id = "CoreMLBackend"
    known_gaps: dict[str, str] = {}
    stock_runtime = False  # ExecuTorch 1.5.1's Linux runtime wheel has no CoreMLBackend

    @pytest.fixture
    def compile_options(self):
        return CoreMLCompileSpec(compute_precision="float32", minimum_deployment_target="iOS16")

    @pytest.fixture
    def partitioner(self, compile_options):
        return CoreMLPartitioner(compile_options)
