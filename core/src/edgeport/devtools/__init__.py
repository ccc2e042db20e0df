"""Developer tools: delegation info, bundled programs, ETRecord, the Inspector, per-partition validation (ETDump:
``edgeport.devtools.etdump``).

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
from edgeport.devtools.etrecord import ETRecord, ETRecordError, parse_etrecord
from edgeport.devtools.graph_view import GraphReport
from edgeport.devtools.inspector import Inspector, InspectorError
from edgeport.devtools.validate import bisect, validate, validate_program
from edgeport.devtools.validate_report import (
    DEFAULT_SQNR_THRESHOLD_DB,
    ErrorStats,
    PartitionValidation,
    ValidationReport,
)

__all__ = [
    "BundledProgram", "BundledVerificationError", "LoadedBundledProgram", "MethodTestCase", "MethodTestSuite",
    "load_bundled_program", "serialize_from_bundled_program_to_flatbuffer",
    "ETRecord", "ETRecordError", "parse_etrecord", "Inspector", "InspectorError", "GraphReport",
    "validate", "bisect", "validate_program", "ValidationReport", "PartitionValidation", "ErrorStats",
    "DEFAULT_SQNR_THRESHOLD_DB",
    "DelegationBreakdown", "DelegationInfo", "PartitionInfo", "format_delegated_graph", "get_delegation_info",
]
