"""TemplateBackend runs edgeport's backend conformance suite.

What is tested comes from the capability table (capabilities.py): every claimed op x dtype x a few sample
shapes, plus edgeport's model zoo. Record a known gap as a strict xfail in ``known_gaps`` (``test_name[case id]``
or a case-id pattern -> reason); when the gap is fixed the test passes, and strict xfail makes you remove it.
"""

from __future__ import annotations

import pytest

from edgeport.testing import BackendConformance
from edgeport_template import TemplateCompileOptions, TemplatePartitioner


class TestTemplateConformance(BackendConformance):
    backend_id = "TemplateBackend"
    known_gaps: dict[str, str] = {}

    @pytest.fixture
    def compile_options(self):
        return TemplateCompileOptions(target="generic")

    @pytest.fixture
    def partitioner(self, compile_options):
        return TemplatePartitioner(compile_options)

    @pytest.fixture
    def tolerances(self):
        return {"float32": (1e-6, 1e-6)}  # (atol, rtol) per dtype for single ops; numpy float32 is exact here
