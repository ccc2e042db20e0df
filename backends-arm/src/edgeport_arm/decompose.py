"""Decompositions the Arm quantizers apply before annotating (``Quantizer.transform_for_annotation``).

An integer NPU has no softmax, layer norm or attention operator, so each is rewritten into primitives that the
quantizer annotates one by one (each gets its own int8 quantize / dequantize) and the lowering emits as TOSA INT
operators:

* ``softmax`` / ``_softmax`` / ``_safe_softmax`` -> ``amax``, ``sub``, ``exp``, ``sum``, ``reciprocal``, ``mul``
  (``_safe_softmax`` only differs on rows that are all ``-inf``, which a finite int8 input never has);
* ``layer_norm`` -> ``mean``, ``sub``, ``mul`` (square), ``mean``, ``add`` (eps), ``rsqrt``, ``mul``, then the
  affine ``mul`` / ``add``;
* ``scaled_dot_product_attention`` without dropout or causal flag -> reshape to 3-D, ``transpose``,
  ``bmm``, ``mul`` (scale), softmax as above, ``bmm``, reshape back. A boolean mask computed from constants
  alone that keeps every position (what Hugging Face models build when given no mask) is dropped: attending with
  it is exactly attending without one. Any other mask computed from constants alone (a decoder's causal mask)
  becomes an additive float constant (``-inf`` -> -256, see :mod:`edgeport_arm.fold`) added to the scores
  before softmax. Attention with a mask that depends on an input, or ``is_causal``, is left whole (float).

Also, a ``select`` of a transposed tensor becomes a ``select`` of the tensor itself when that leaves the other
dimensions in order (torch's multi-head attention splits q / k / v that way, through a rank-5 transpose that
costs an Ethos-U85 more cycles than the rest of the attention).

Works on a plain ``torch.export.export(...).module()``; the new nodes get ``meta["val"]`` from the graph's fake
tensors so that annotation sees their dtypes and shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx import GraphModule, Node

from edgeport_arm.fold import NEG_INF, POS_INF

__all__ = ["decompose_for_annotation"]

_aten = torch.ops.aten
_SOFTMAX = {_aten.softmax.int, _aten._softmax.default, _aten._safe_softmax.default}
_LAYER_NORM = {_aten.layer_norm.default}
_SDPA = {_aten.scaled_dot_product_attention.default}


def _val(a: Any) -> Any:
    return a.meta.get("val") if isinstance(a, Node) else a


class _Builder:
    """Inserts aten calls before a node, each with its fake-tensor ``meta['val']``."""

    def __init__(self, gm: GraphModule, anchor: Node) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.anchor = anchor
        vals = [v for n in gm.graph.nodes if isinstance(v := n.meta.get("val"), torch.Tensor)]
        self.mode = torch._guards.detect_fake_mode(vals)

    def __call__(self, target: Callable[..., Any], *args: Any) -> Node:
        with self.graph.inserting_before(self.anchor):
            node = self.graph.call_function(target, args)
        fake_args = [_val(a) for a in args]
        if self.mode is not None:
            with self.mode:
                node.meta["val"] = target(*fake_args)
        else:
            node.meta["val"] = target(*fake_args)
        node.meta["stack_trace"] = self.anchor.meta.get("stack_trace")
        node.meta["nn_module_stack"] = self.anchor.meta.get("nn_module_stack", {})
        return node


def _softmax(b: _Builder, x: Node, dim: int) -> Node:
    peak = b(_aten.amax.default, x, [dim], True)
    shifted = b(_aten.sub.Tensor, x, peak)
    e = b(_aten.exp.default, shifted)
    total = b(_aten.sum.dim_IntList, e, [dim], True)
    return b(_aten.mul.Tensor, e, b(_aten.reciprocal.default, total))


def _layer_norm(b: _Builder, x: Node, normalized: Sequence[int], weight: Any, bias: Any, eps: float) -> Node:
    rank = len(_val(x).shape)
    dims = list(range(rank - len(normalized), rank))
    centered = b(_aten.sub.Tensor, x, b(_aten.mean.dim, x, dims, True))
    var = b(_aten.mean.dim, b(_aten.mul.Tensor, centered, centered), dims, True)
    y = b(_aten.mul.Tensor, centered, b(_aten.rsqrt.default, b(_aten.add.Tensor, var, float(eps))))
    if weight is not None:
        y = b(_aten.mul.Tensor, y, weight)
    if bias is not None:
        y = b(_aten.add.Tensor, y, bias)
    return y


def _constant(gm: GraphModule, node: Any, budget: list[int]) -> Any:
    """``node``'s value when it depends on no graph input (evaluated eagerly), else ``None``."""
    if not isinstance(node, Node):
        return node
    budget[0] -= 1
    if budget[0] < 0 or node.op == "placeholder":
        return None
    if node.op == "get_attr":
        return getattr(gm, str(node.target), None)
    if node.op != "call_function":
        return None
    flat, spec = torch.utils._pytree.tree_flatten((node.args, node.kwargs))
    values = []
    for a in flat:
        v = _constant(gm, a, budget)
        if v is None and a is not None:
            return None
        values.append(v)
    args, kwargs = torch.utils._pytree.tree_unflatten(values, spec)
    with torch.no_grad():
        return node.target(*args, **kwargs)


def _mask_is_trivial(gm: GraphModule, mask: Any) -> bool:
    """A boolean mask computed from constants only (no graph input) that keeps every position: attending with
    it is exactly attending without a mask (Hugging Face models build such masks when given none)."""
    if mask is None:
        return True
    val = _val(mask)
    if not (isinstance(val, torch.Tensor) and val.dtype == torch.bool):
        return False
    value = _constant(gm, mask, [200])
    return isinstance(value, torch.Tensor) and value.dtype == torch.bool and bool(value.all())


def _additive_mask(b: _Builder, mask: Any, shape: Sequence[int]) -> Node | None | bool:
    """A constant mask (boolean, or float additive) as an additive float constant broadcast to the scores'
    ``shape`` (then flattened to ``[batch, q, k]``) (``-inf`` -> :data:`~edgeport_arm.fold.NEG_INF`); ``None`` for no mask at all;
    ``False`` when the mask depends on a graph input."""
    if _mask_is_trivial(b.gm, mask):
        return None
    value = _constant(b.gm, mask, [400])
    if not isinstance(value, torch.Tensor):
        return False
    if value.dtype == torch.bool:
        value = torch.where(value, 0.0, NEG_INF)
    elif not value.is_floating_point():
        return False
    try:  # shape: the scores' [..., q, k]; the result is [prod(...), q, k] as the 3-D bmm gives them
        value = torch.broadcast_to(value.float(), tuple(shape)).reshape(-1, *shape[-2:])
    except RuntimeError:
        return False
    value = torch.nan_to_num(value, posinf=POS_INF, neginf=NEG_INF).clamp(NEG_INF, POS_INF).contiguous()
    count = 0
    while hasattr(b.gm, name := f"_edgeport_mask_{count}"):
        count += 1
    b.gm.register_buffer(name, value)
    with b.graph.inserting_before(b.anchor):
        node = b.graph.get_attr(name)
    node.meta["val"] = torch.empty_like(value) if b.mode is None else b.mode.from_tensor(value)
    return node


def _attention(b: _Builder, node: Node) -> Node | None:
    q, k, v = node.args[:3]
    extra = dict(zip(("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"), node.args[3:]))
    extra.update(node.kwargs)
    if extra.get("dropout_p", 0.0) or extra.get("is_causal", False) or extra.get("enable_gqa", False):
        return None
    qs, ks, vs = (tuple(_val(t).shape) for t in (q, k, v))
    if any(not isinstance(d, int) for d in (*qs, *ks, *vs)) or qs[:-2] != ks[:-2] or ks[:-1] != vs[:-1]:
        return None  # dynamic or broadcast batch dimensions: left whole
    batch = math.prod(qs[:-2])
    scale = extra.get("scale")
    scale = 1.0 / math.sqrt(qs[-1]) if scale is None else float(scale)
    q3 = b(_aten.reshape.default, q, [batch, qs[-2], qs[-1]])
    k3 = b(_aten.reshape.default, k, [batch, ks[-2], ks[-1]])
    v3 = b(_aten.reshape.default, v, [batch, vs[-2], vs[-1]])
    mask = _additive_mask(b, extra.get("attn_mask"), (*qs[:-1], ks[-2]))
    if mask is False:
        return None
    scores = b(_aten.mul.Tensor, b(_aten.bmm.default, q3, b(_aten.transpose.int, k3, 1, 2)), scale)
    if mask is not None:
        scores = b(_aten.add.Tensor, scores, mask)
    out = b(_aten.bmm.default, _softmax(b, scores, 2), v3)
    return b(_aten.reshape.default, out, [*qs[:-1], vs[-1]])


_MOVES = {_aten.transpose.int, _aten.permute.default}
_VIEWS = {_aten.contiguous.default, _aten.clone.default, _aten.squeeze.dim, _aten.squeeze.dims,
          _aten.unsqueeze.default} | _MOVES


def _trace(node: Any) -> tuple[Node, list[int | None], bool] | None:
    """Follow transposes / permutes / squeezes / unsqueezes / contiguous back to the tensor they rearrange: that
    tensor, which of its dimensions each output dimension is (``None``: an inserted 1), and whether any data
    moved (a transpose or permute on the way)."""
    if not isinstance(node, Node) or node.op != "call_function" or node.target not in _VIEWS:
        return None
    chain = []
    while isinstance(node, Node) and node.op == "call_function" and node.target in _VIEWS:
        chain.append(node)
        node = node.args[0]
    if not isinstance(_val(node), torch.Tensor):
        return None
    dims: list[int | None] = list(range(len(_val(node).shape)))
    for n in reversed(chain):
        rank = len(dims)
        if n.target in (_aten.transpose.int,):
            a, b = int(n.args[1]) % rank, int(n.args[2]) % rank
            dims[a], dims[b] = dims[b], dims[a]
        elif n.target is _aten.permute.default:
            dims = [dims[int(p) % rank] for p in n.args[1]]
        elif n.target is _aten.unsqueeze.default:
            dims.insert(int(n.args[1]) % (rank + 1), None)
        elif n.target in (_aten.squeeze.dim, _aten.squeeze.dims):
            drop = n.args[1] if isinstance(n.args[1], (list, tuple)) else [n.args[1]]
            shape = _val(n.args[0]).shape
            drop = {int(d) % rank for d in drop if shape[int(d) % rank] == 1}
            dims = [d for i, d in enumerate(dims) if i not in drop]
    return node, dims, any(n.target in _MOVES for n in chain)


def _select_before_transpose(gm: GraphModule) -> bool:
    """``select`` of a transposed tensor -> ``select`` of the tensor itself (plus a reshape) when the remaining
    dimensions keep their order: the transpose (costly on an NPU, e.g. torch's q/k/v split in multi-head
    attention) disappears. Exact: only which elements are read changes, not their values."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _aten.select.int:
            continue
        traced = _trace(node.args[0])
        if traced is None or not traced[2]:
            continue
        base, dims, _ = traced
        d = int(node.args[1]) % len(dims)
        picked = dims[d]
        if picked is None:
            continue
        rest = [x for i, x in enumerate(dims) if i != d and x is not None]
        if rest != sorted(rest):
            continue  # the other dimensions move too: a transpose would still be needed
        b = _Builder(gm, node)
        out = b(_aten.select.int, base, picked, node.args[2])
        out = b(_aten.contiguous.default, b(_aten.reshape.default, out, list(_val(node).shape)))
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        changed = True
    return changed


def decompose_for_annotation(gm: GraphModule) -> GraphModule:
    """Rewrite softmax, layer norm and unmasked attention in ``gm`` into primitives, and selects of transposed
    tensors into selects of the tensors (in place; returns ``gm``)."""
    changed = _select_before_transpose(gm)
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        x = node.args[0] if node.args else None
        if not (isinstance(_val(x), torch.Tensor) and _val(x).dtype == torch.float32):
            continue
        b = _Builder(gm, node)
        new: Node | None = None
        if node.target in _SOFTMAX:
            half = node.target is _aten._softmax.default and len(node.args) > 2 and node.args[2]
            dtype = node.kwargs.get("dtype", node.args[2] if node.target is _aten.softmax.int and len(node.args) > 2
                                    else None)
            if not half and dtype in (None, torch.float32):
                new = _softmax(b, x, int(node.args[1]) % len(_val(x).shape))
        elif node.target in _LAYER_NORM:
            args = list(node.args) + [None] * (5 - len(node.args))
            eps = node.kwargs.get("eps", args[4] if args[4] is not None else 1e-5)
            new = _layer_norm(b, x, list(args[1]), node.kwargs.get("weight", args[2]),
                              node.kwargs.get("bias", args[3]), float(eps))
        elif node.target in _SDPA:
            new = _attention(b, node)
        if new is not None:
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
            changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm
