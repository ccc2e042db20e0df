"""``aten._assert_tensor_metadata``: checked once at lowering, then removed (it is not core ATen).

``torch.export`` leaves these assertions where a model converts dtypes (``.to(torch.float32)`` in GPT-2, T5,
Llama). ExecuTorch's ``to_edge`` erases them without a check. edgeport checks each one against the value the
graph carries for its tensor -- the exported program's shapes and dtypes are what the program will run with
(method inputs are checked against them at run time) -- and raises :class:`~edgeport.errors.ExportError` naming
the node when the assertion could not hold; otherwise the node goes.
"""

from __future__ import annotations

from typing import Any

import torch

from edgeport.errors import ExportError

_TARGET = torch.ops.aten._assert_tensor_metadata.default


def _same_dims(expected: Any, actual: Any) -> bool:
    if expected is None:
        return True
    if len(expected) != len(actual):
        return False
    for e, a in zip(expected, actual):
        if isinstance(e, int) and isinstance(a, int) and e != a:
            return False  # symbolic sizes are checked by export's own range constraints
    return True


def check_and_remove_metadata_asserts(gm: torch.fx.GraphModule, method: str) -> int:
    """Check and erase every ``_assert_tensor_metadata`` node of ``gm`` and its subgraphs; returns how many."""
    removed = 0
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        graph = module.graph
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not _TARGET:
                continue
            tensor = node.args[0]
            val = tensor.meta.get("val") if isinstance(tensor, torch.fx.Node) else None
            if isinstance(val, torch.Tensor):
                size = node.kwargs.get("size", node.args[1] if len(node.args) > 1 else None)
                dtype = node.kwargs.get("dtype", node.args[3] if len(node.args) > 3 else None)
                problems = []
                if dtype is not None and dtype != val.dtype:
                    problems.append(f"dtype {val.dtype} where {dtype} is asserted")
                if not _same_dims(size, tuple(val.shape)):
                    problems.append(f"shape {list(val.shape)} where {list(size)} is asserted")
                if problems:
                    raise ExportError(
                        f"method {method!r}, node {node.name!r}: aten._assert_tensor_metadata fails on "
                        f"{tensor.name!r}: {'; '.join(problems)}. The model asserts metadata its own graph "
                        "does not have; export it again with inputs of the dtype and shape it expects")
            graph.erase_node(node)
            removed += 1
        if removed:
            module.recompile()
    return removed
