"""edgeport's backend conformance suite (pytest).

Subclass :class:`BackendConformance` in a test module, set ``backend_id``, and override fixtures as needed::

    from edgeport.testing.conformance import BackendConformance

    class TestAcmeConformance(BackendConformance):
        backend_id = "AcmeBackend"

See :mod:`edgeport.testing.conformance.suite` for what is checked, ``samples`` for the per-op sample inputs and
``harness`` for the building blocks (usable without the base class).
"""

from __future__ import annotations

from edgeport.testing.conformance.harness import (
    CORRUPTIONS,
    DEFAULT_MODEL_TOLERANCES,
    DEFAULT_MODELS,
    DEFAULT_TOLERANCES,
    Case,
    LoweredCase,
    OpModule,
    PartitionRecord,
    RecordingPartitioner,
    corrupt_blob,
    lower_case,
    op_cases,
)
from edgeport.testing.conformance.samples import SAMPLES, Const, Sample, SampleMaker, make_tensor
from edgeport.testing.conformance.suite import BackendConformance

__all__ = [
    "CORRUPTIONS",
    "DEFAULT_MODELS",
    "DEFAULT_MODEL_TOLERANCES",
    "DEFAULT_TOLERANCES",
    "SAMPLES",
    "BackendConformance",
    "Case",
    "Const",
    "LoweredCase",
    "OpModule",
    "PartitionRecord",
    "RecordingPartitioner",
    "Sample",
    "SampleMaker",
    "corrupt_blob",
    "lower_case",
    "make_tensor",
    "op_cases",
]
