"""The decomposition table ``to_edge`` uses: torch's core-ATen table plus the ops ExecuTorch's ``to_edge`` also
decomposes (``aten.linalg_vector_norm``: ``torch.norm``, ``F.normalize``), so that edgeport accepts what ExecuTorch
accepts."""

from __future__ import annotations

from typing import Any

import torch
from torch._decomp import get_decompositions

EXTRA_DECOMPOSED = (torch.ops.aten.linalg_vector_norm.default,)
"""Non-core ops torch's table keeps whole and ExecuTorch's ``to_edge`` decomposes."""


def edge_decompositions() -> Any:
    """A fresh table (callers may pop from it): torch's ``default_decompositions()`` plus :data:`EXTRA_DECOMPOSED`."""
    table = torch.export.default_decompositions()
    for op, decomposition in get_decompositions(list(EXTRA_DECOMPOSED)).items():
        table[op] = decomposition
    return table
