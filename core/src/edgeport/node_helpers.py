"""Torch-free helpers for capability-table constraints: what a graph node holds, without importing torch.

A constraint (``OpCapability.constraint``) receives a ``torch.fx.Node`` but runs in modules that must stay
importable without torch; these read only ``node.args`` / ``node.kwargs`` / ``node.meta["val"]``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["int_pair", "node_arg", "node_shape", "node_value"]


def node_value(node: Any) -> Any:
    """The node's (first) ``meta["val"]`` (a fake tensor, a SymInt, ...), or ``None``."""
    val = getattr(node, "meta", {}).get("val")
    if isinstance(val, (tuple, list)):
        val = val[0] if val else None
    return val


def node_shape(node: Any) -> tuple[int, ...] | None:
    """The static shape of the node's (first) tensor value; ``None`` when unknown or symbolic."""
    dims = getattr(node_value(node), "shape", None)
    if dims is None or any(type(d) is not int for d in dims):
        return None
    return tuple(dims)


def node_arg(node: Any, index: int, name: str, default: Any = None) -> Any:
    """Argument ``index`` of the call, given positionally or as keyword ``name``."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def int_pair(v: Any) -> list[int]:
    """A 2-D kernel / stride / padding argument as two ints (torch allows one int for both)."""
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in v] * (2 if len(v) == 1 else 1)
