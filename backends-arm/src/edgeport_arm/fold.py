"""Graph clean-ups the Arm quantizers apply before annotating, so that decoders quantize whole.

* **Constant folding.** Everything computed from no graph input -- Hugging Face's causal masks and rotary
  ``cos`` / ``sin`` tables (built from ``arange`` and buffers; with a static export they are the same on every
  call), ops that read only an input's shape or dtype (``new_ones``, ``zeros_like``, ...) -- is evaluated once
  and becomes a constant buffer. An integer NPU has no int64 or bool datapath for those position and mask
  ops; as constants they cost nothing. (ExecuTorch's Arm quantizer folds constants before annotating too.)
* **Infinite constants.** ``-inf`` / ``+inf`` and float32's limits in a folded float constant (an additive
  attention mask) become -256 / +256, ExecuTorch's ``quantize_inf`` defaults: an int8 tensor cannot hold
  ``-inf``, and a mask of -256 already sends ``exp`` below int8's resolution after softmax's max subtraction.
  The pt2e model sees the same constant, so it stays the oracle of the integer graph.
* **No-op casts.** ``to(float32)`` of a float32 tensor (RMSNorm's upcasts) is dropped: it would sit between
  two quantized ops without parameters of its own.
* **addmm with constant weights** (Hugging Face's GPT-2 ``Conv1D``) becomes ``linear`` with the transposed
  weight, so it quantizes and lowers as a fully connected layer (int8 weights per output channel, int32 bias).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import GraphModule, Node

__all__ = ["NEG_INF", "POS_INF", "fold_for_annotation"]

_aten = torch.ops.aten
NEG_INF, POS_INF = -256.0, 256.0
_MAX_FOLDED_ELEMENTS = 1 << 22
# ops whose result depends only on their first argument's shape and dtype
_SHAPE_ONLY = {_aten.new_ones.default, _aten.new_zeros.default, _aten.new_full.default, _aten.new_empty.default,
               _aten.zeros_like.default, _aten.ones_like.default, _aten.full_like.default, _aten.empty_like.default}
_NO_OP_CASTS = {_aten.to.dtype, _aten.to.dtype_layout, _aten._to_copy.default}
_IMPURE_PREFIXES = ("_assert", "sym_constrain", "_print")


def _impure(node: Node) -> bool:
    name = getattr(node.target, "__name__", str(node.target))
    return name.startswith(_IMPURE_PREFIXES) or "rand" in name or "dropout" in name or "bernoulli" in name


def _stand_in(node: Any) -> Any:
    """A real tensor with ``node``'s shape and dtype (for ops that read only those), else ``None``."""
    val = node.meta.get("val") if isinstance(node, Node) else None
    if not isinstance(val, torch.Tensor) or not all(isinstance(d, int) for d in val.shape):
        return None
    return torch.zeros(tuple(val.shape), dtype=val.dtype)


def _evaluate(gm: GraphModule) -> dict[Node, Any]:
    """The value of every node computed from constants only (params, buffers, literals)."""
    values: dict[Node, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            values[node] = getattr(gm, str(node.target), None) if "." not in str(node.target) else \
                operator.attrgetter(str(node.target))(gm)
            continue
        if node.op != "call_function" or _impure(node):
            continue
        flat, spec = torch.utils._pytree.tree_flatten((node.args, node.kwargs))
        args: list[Any] = []
        for i, a in enumerate(flat):
            if not isinstance(a, Node):
                args.append(a)
            elif a in values:
                args.append(values[a])
            elif i == 0 and node.target in _SHAPE_ONLY and (stand_in := _stand_in(a)) is not None:
                args.append(stand_in)
            else:
                break
        else:
            a, kw = torch.utils._pytree.tree_unflatten(args, spec)
            try:
                with torch.no_grad():
                    values[node] = node.target(*a, **kw)
            except Exception:  # an op that cannot run eagerly here stays in the graph, as it was
                continue
    return values


def _finite(t: torch.Tensor) -> torch.Tensor:
    if not t.is_floating_point():
        return t
    limit = torch.finfo(t.dtype)
    t = torch.nan_to_num(t, posinf=POS_INF, neginf=NEG_INF)
    return torch.where(t <= limit.min, NEG_INF, torch.where(t >= limit.max, POS_INF, t)).to(t.dtype)


def _fold(gm: GraphModule) -> bool:
    values = _evaluate(gm)
    changed = False
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node not in values:
            continue
        value = values[node]
        live = [u for u in node.users if u not in values and not _impure(u)]
        if not live or not isinstance(value, torch.Tensor) or value.numel() > _MAX_FOLDED_ELEMENTS:
            continue
        while hasattr(gm, name := f"_edgeport_folded_{count}"):
            count += 1
        gm.register_buffer(name, _finite(value.detach().clone().contiguous()))
        with gm.graph.inserting_before(node):
            const = gm.graph.get_attr(name)
        const.meta["val"] = node.meta.get("val")
        for user in live:
            user.replace_input_with(node, const)
        changed = True
    # assertions about folded tensors check metadata that can no longer change
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and _impure(node) and not node.users and any(
                a in values for a in node.all_input_nodes):
            gm.graph.erase_node(node)
            changed = True
    return changed


def _drop_no_op_casts(gm: GraphModule) -> bool:
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _NO_OP_CASTS or not node.args:
            continue
        src, out = node.args[0], node.meta.get("val")
        src_val = src.meta.get("val") if isinstance(src, Node) else None
        if not (isinstance(src_val, torch.Tensor) and isinstance(out, torch.Tensor)):
            continue
        extra = {k: v for k, v in node.kwargs.items() if k not in ("dtype", "layout", "device", "copy")}
        if src_val.dtype == out.dtype and tuple(src_val.shape) == tuple(out.shape) and not extra \
                and node.kwargs.get("memory_format") is None:
            node.replace_all_uses_with(src)
            gm.graph.erase_node(node)
            changed = True
    return changed


def _addmm_to_linear(gm: GraphModule) -> bool:
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _aten.addmm.default or len(node.args) != 3:
            continue
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            continue
        bias, x, w = node.args
        if not all(isinstance(a, Node) and a.op == "get_attr" for a in (bias, w)):
            continue
        weight = operator.attrgetter(str(w.target))(gm)
        bias_t = operator.attrgetter(str(bias.target))(gm)
        if weight.dim() != 2 or bias_t.dim() != 1 or bias_t.shape[0] != weight.shape[1]:
            continue
        name = f"{str(w.target).replace('.', '_')}_transposed"
        if not hasattr(gm, name):
            gm.register_parameter(name, torch.nn.Parameter(weight.detach().t().contiguous(), requires_grad=False))
        with gm.graph.inserting_before(node):
            wt = gm.graph.get_attr(name)
            linear = gm.graph.call_function(_aten.linear.default, (x, wt, bias))
        wt.meta["val"] = torch.empty(tuple(weight.shape[::-1]), dtype=weight.dtype)
        linear.meta = dict(node.meta)
        node.replace_all_uses_with(linear)
        gm.graph.erase_node(node)
        changed = True
    return changed


def fold_for_annotation(gm: GraphModule) -> GraphModule:
    """Fold constants, make folded infinities finite, drop no-op casts, turn constant-weight ``addmm`` into
    ``linear`` (in place; returns ``gm``)."""
    changed = _fold(gm)
    changed = _drop_no_op_casts(gm) or changed
    changed = _addmm_to_linear(gm) or changed
    if changed:
        gm.graph.eliminate_dead_code()
        gm.delete_all_unused_submodules()
        gm.recompile()
    return gm

