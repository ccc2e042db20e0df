"""QnnBackend runs edgeport's conformance suite on the HTP (x86-64: Qualcomm's HTP emulator).

The emulator prepares each graph in ~0.1-0.3 s, so the default run takes one sample per op and dtype plus the model
zoo; ``-m slow`` adds every sample (``max_samples = 3``).
"""

from __future__ import annotations

import pytest

from edgeport.testing import BackendConformance


class TestQnnConformance(BackendConformance):
    backend_id = "QnnBackend"
    max_samples = 1
    known_gaps: dict[str, str] = {}
    stock_runtime = False  # ExecuTorch's runtime wheel has no QnnBackend for edgeport's blob format


@pytest.mark.slow
class TestQnnConformanceAllSamples(TestQnnConformance):
    max_samples = 3
