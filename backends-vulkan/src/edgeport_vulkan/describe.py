"""``edgeport inspect`` summary of a ``VulkanBackend`` blob (torch-free; ``ValueError`` on bad bytes)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from edgeport.errors import ProgramError
from edgeport_vulkan.schema import NAMED_DATA_OFFSET, VkTensor, parse_blob


def describe_blob(processed: Any) -> dict[str, Any]:
    try:
        blob = parse_blob(memoryview(processed).cast("B") if not isinstance(processed, bytes) else processed)
    except ProgramError as exc:
        raise ValueError(str(exc)) from None
    g = blob.graph
    tensors = [v.value for v in g.values if isinstance(v.value, VkTensor)]
    return {
        "format": "VH00 + VkGraph (ExecuTorch Vulkan delegate)",
        "version": g.version,
        "operators": dict(Counter(op.name for op in g.chain)),
        "values": len(g.values), "tensors": len(tensors),
        "inputs": len(g.input_ids), "outputs": len(g.output_ids),
        "constants": len(g.constants),
        "inline_constant_bytes": sum(c.length for c in g.constants if c.offset != NAMED_DATA_OFFSET),
        "named_constants": sum(1 for c in g.constants if c.offset == NAMED_DATA_OFFSET),
    }
