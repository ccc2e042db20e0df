"""Developer tools: delegation info and bundled programs (more to come: ETRecord, ETDump, the Inspector).

``edgeport.devtools`` imports neither torch nor executorch at import time."""

from __future__ import annotations

from edgeport.devtools.bundled_program import (
    BundledProgram,
    BundledVerificationError,
    LoadedBundledProgram,
    MethodTestCase,
    MethodTestSuite,
    load_bundled_program,
    serialize_from_bundled_program_to_flatbuffer,
)
from edgeport.devtools.delegation_info import (
    DelegationBreakdown,
    DelegationInfo,
    PartitionInfo,
    format_delegated_graph,
    get_delegation_info,
)

__all__ = [
    "BundledProgram", "BundledVerificationError", "LoadedBundledProgram", "MethodTestCase", "MethodTestSuite",
    "load_bundled_program", "serialize_from_bundled_program_to_flatbuffer",
    "DelegationBreakdown", "DelegationInfo", "PartitionInfo", "format_delegated_graph", "get_delegation_info",
]
