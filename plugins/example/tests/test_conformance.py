"""ExampleBackend runs edgeport's conformance suite (``edgeport.testing.BackendConformance``)."""

from __future__ import annotations

import pytest

from edgeport.testing import BackendConformance
from edgeport_example import ExampleCompileOptions, ExamplePartitioner


class TestExampleConformance(BackendConformance):
    backend_id = "ExampleBackend"
    known_gaps = {}

    @pytest.fixture
    def compile_options(self):
        return ExampleCompileOptions(max_value=4)

    @pytest.fixture
    def partitioner(self, compile_options):
        return ExamplePartitioner(compile_options)
