"""Developer tools: delegation info (more to come: ETRecord, ETDump, the Inspector, bundled programs)."""

from __future__ import annotations

from edgeport.devtools.delegation_info import (
    DelegationBreakdown,
    DelegationInfo,
    PartitionInfo,
    format_delegated_graph,
    get_delegation_info,
)

__all__ = [
    "DelegationBreakdown", "DelegationInfo", "PartitionInfo", "format_delegated_graph", "get_delegation_info",
]
