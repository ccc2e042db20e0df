"""Constant subgraphs of float graphs (``TOSA-1.0+FP``), taken into delegates and folded at preprocess.

No quantizer runs on a float graph, so :mod:`edgeport_arm.fold` never sees it: Hugging Face's causal masks,
rotary ``cos`` / ``sin`` tables and position-id embeddings stay as int64 / bool work computed from buffers and
literals only. A partitioner may not rewrite the graph, so instead the TOSA FP partitioner *delegates* every
node computed from no graph input (whatever its op) when all its users are delegated too, and the lowering
evaluates it once with PyTorch (:func:`evaluate`) and emits the result as a TOSA constant. A folded node never
becomes a delegate input or output of its own: it is taken only together with the delegated nodes that read it.
Ops that read only their first argument's shape and dtype (``full_like``, ``new_zeros``, ...) fold too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.fx import Node

from edgeport_arm.fold import _impure
from edgeport_arm.preprocess.values import Const

__all__ = ["MAX_FOLDED_ELEMENTS", "SHAPE_ONLY", "constant_nodes", "evaluate"]

MAX_FOLDED_ELEMENTS = 1 << 22
_aten = torch.ops.aten
SHAPE_ONLY = frozenset({
    _aten.new_ones.default, _aten.new_zeros.default, _aten.new_full.default, _aten.zeros_like.default,
    _aten.ones_like.default, _aten.full_like.default,
})


def _tensors(val: Any) -> list[Any]:
    return list(val) if isinstance(val, (list, tuple)) else [val]


def _small_static(node: Node) -> bool:
    vals = _tensors(node.meta.get("val"))
    return bool(vals) and all(isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape)
                              and v.numel() <= MAX_FOLDED_ELEMENTS for v in vals)


def _is_getitem(node: Node) -> bool:
    return node.op == "call_function" and node.target.__name__ == "getitem"


def constant_nodes(graph: torch.fx.Graph, is_constant: Callable[[Node], bool]) -> list[Node]:
    """``call_function`` nodes (getitems included) computed from constants only, in graph order."""
    derived: set[Node] = set()
    out: list[Node] = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if _is_getitem(node):
            if node.args[0] in derived:
                derived.add(node)
                out.append(node)
            continue
        if _impure(node) or not _small_static(node):
            continue
        shape_only = node.target in SHAPE_ONLY
        ok = True
        for i, a in enumerate(node.all_input_nodes):
            if is_constant(a) or a in derived:
                continue
            val = a.meta.get("val")
            if shape_only and i == 0 and a is node.args[0] and isinstance(val, torch.Tensor) \
                    and val.dtype == torch.float32:
                continue  # only its shape and dtype are read: a float tensor the partition can take
            ok = False
            break
        if ok:
            derived.add(node)
            out.append(node)
    return out


def evaluate(node: Node, consts: dict[Node, Any]) -> Const | tuple[Const, ...] | None:
    """``node``'s value when every tensor it reads is in ``consts`` (shape-only reads need only metadata),
    else ``None``."""
    if node.op != "call_function" or _is_getitem(node) or _impure(node) or not _small_static(node):
        return None
    flat, spec = torch.utils._pytree.tree_flatten((node.args, node.kwargs))
    args: list[Any] = []
    for i, a in enumerate(flat):
        if not isinstance(a, Node):
            args.append(a)
        elif isinstance(consts.get(a), Const) and not consts[a].quantized:
            args.append(torch.from_numpy(np.ascontiguousarray(consts[a].data)))
        elif i == 0 and node.target in SHAPE_ONLY and isinstance(a.meta.get("val"), torch.Tensor):
            val = a.meta["val"]
            args.append(torch.zeros(tuple(int(d) for d in val.shape), dtype=val.dtype))
        else:
            return None
    a, kw = torch.utils._pytree.tree_unflatten(args, spec)
    try:
        with torch.no_grad():
            value = node.target(*a, **kw)
    except Exception:  # noqa: BLE001 - an op that cannot run eagerly is lowered (or refused) as usual
        return None
    if isinstance(value, torch.Tensor):
        return Const(value.detach().contiguous().numpy().copy())
    if isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value):
        return tuple(Const(v.detach().contiguous().numpy().copy()) for v in value)
    return None
