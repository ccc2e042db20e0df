"""XnnpackBackend runs edgeport's conformance suite (``edgeport.testing.BackendConformance``)."""

from __future__ import annotations

import pytest

from edgeport.testing import BackendConformance
from edgeport_xnnpack import XnnpackCompileOptions, XnnpackPartitioner


class TestXnnpackConformance(BackendConformance):
    backend_id = "XnnpackBackend"
    known_gaps = {
        "model-transformer_encoder_layer": (
            "edgeport core: to_backend inserts a partition's call_delegate after a node that consumes one of its "
            "outputs (the attention's masking ops), so lowering fails with 'used before it has been defined'"
        ),
    }

    @pytest.fixture
    def compile_options(self):
        return XnnpackCompileOptions()

    @pytest.fixture
    def partitioner(self, compile_options):
        return XnnpackPartitioner(compile_options)
