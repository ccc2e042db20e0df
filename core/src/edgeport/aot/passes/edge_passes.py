"""Passes that turn a decomposed ATen graph into edgeport's edge dialect.

The edge dialect is core ATen with two normalizations that make every op have a portable out-variant:

* view ops become their ``*_copy`` variants (``view`` → ``view_copy``, ``permute`` → ``permute_copy``, ...);
* a ``.Tensor`` overload called with a Python number becomes the ``.Scalar`` overload (``mul.Tensor(x, 2)`` →
  ``mul.Scalar(x, 2)``) so no tensor constant has to be invented for the scalar.
"""

from __future__ import annotations

import numbers

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def copy_variant(op: OpOverload) -> OpOverload | None:
    """The ``*_copy`` variant of a view op, or None when there is none."""
    if not getattr(op, "is_view", False) or op.namespace != "aten":
        return None
    base = op._schema.name.split("::")[1]
    if base in ("_unsafe_view",):
        return aten.view_copy.default
    packet = getattr(aten, f"{base}_copy", None)
    if packet is None:
        return None
    return getattr(packet, op._overloadname, None)


def scalar_variant(op: OpOverload, args: tuple) -> OpOverload | None:
    """The ``.Scalar`` overload to use when a ``.Tensor`` overload gets a number as its second argument."""
    if op.namespace != "aten" or op._overloadname not in ("Tensor", "Tensor_mode") or len(args) < 2:
        return None
    if isinstance(args[1], torch.fx.Node) or not isinstance(args[1], numbers.Number):
        return None
    name = "Scalar" if op._overloadname == "Tensor" else "Scalar_mode"
    return getattr(op.overloadpacket, name, None)


def normalize_edge_ops(gm: torch.fx.GraphModule) -> bool:
    """Apply both normalizations in place; returns whether the graph changed."""
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, OpOverload):
            continue
        replacement = copy_variant(node.target) or scalar_variant(node.target, node.args)
        if replacement is not None:
            node.target = replacement
            changed = True
    if changed:
        gm.recompile()
    return changed
