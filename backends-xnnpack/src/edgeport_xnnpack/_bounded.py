"""Bounded dynamic dims in the partitioner's checks (torch-free: reads ``meta["val"]`` shapes and ``node.args``).

A dynamic dim is a ``SymInt`` in a tensor's shape. XnnpackPartitioner takes a node with dynamic dims when every
dim has a finite upper bound (the blob declares the bound; both runtimes run any size up to it) and the node's
lowering stays valid at every size: see :func:`dynamic_problem` for what is refused and why.
"""

from __future__ import annotations

from typing import Any

MAX_BOUND = 1 << 31

# ops whose lowering has fixed parameters that a dynamic dim would change (windows, channel layouts, folded
# weights): their tensors must be static
_STATIC_ONLY = ("aten.convolution.default", "aten._native_batch_norm_legit_no_training.default",
                "aten.max_pool2d_with_indices.default", "aten.max_pool2d.default", "aten.avg_pool2d.default",
                "aten.mean.dim", "aten._adaptive_avg_pool2d.default")
# views that may change the rank: XNNStaticReshape infers at most one dim (new_shape entry 0)
_RESHAPES = ("aten.view_copy.default", "aten._unsafe_view.default", "aten.squeeze_copy.dims",
             "aten.squeeze_copy.dim", "aten.unsqueeze_copy.default", "aten.select_copy.int")
# ops whose symbolic arguments (sizes) the lowering takes from the output's shape instead
_SYMBOLIC_ARGS_OK = ("aten.view_copy.default", "aten._unsafe_view.default", "aten.expand_copy.default")


def is_symbolic(d: Any) -> bool:
    return type(d) is not int


def upper_bound(d: Any) -> int | None:
    """The upper bound of a (symbolic) dim, ``None`` when it has none (or none that fits XNNPACK's sizes)."""
    if not is_symbolic(d):
        return int(d)
    try:
        node = d.node
        upper = node.shape_env.bound_sympy(node.expr).upper
        value = int(upper)
    except Exception:  # noqa: BLE001 - unbounded (int_oo), or not a torch SymInt
        return None
    return value if 0 < value < MAX_BOUND else None


def _tensors(val: Any) -> list[Any]:
    vals = val if isinstance(val, (tuple, list)) else [val]
    return [t for t in vals if hasattr(t, "shape")]


def dynamic_dims(shape: Any) -> list[int]:
    """Positions of the symbolic dims of ``shape``."""
    return [i for i, d in enumerate(shape) if is_symbolic(d)]


def unbounded_problem(node: Any, inputs: list[Any]) -> str | None:
    """Why the dynamic dims of ``node`` or its inputs cannot be lowered (no upper bound), else ``None``."""
    for v in (node, *inputs):
        for t in _tensors(v.meta.get("val")):
            for d in t.shape:
                if is_symbolic(d) and upper_bound(d) is None:
                    return (f"dynamic shape {list(t.shape)} of {v.name!r} has no upper bound: export with a bounded "
                            "dim, e.g. torch.export.Dim('seq', max=N)")
    return None


def _has_dynamic(node: Any, inputs: list[Any]) -> bool:
    return any(dynamic_dims(t.shape) for v in (node, *inputs) for t in _tensors(v.meta.get("val")))


def _symbolic_args(node: Any) -> list[str]:
    found: list[str] = []

    def visit(a: Any) -> None:
        if isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
        elif hasattr(a, "meta") and hasattr(a, "op"):
            val = a.meta.get("val")
            if isinstance(val, (int, float, bool)) or type(val).__name__ in ("SymInt", "SymFloat", "SymBool"):
                found.append(a.name)
        elif type(a).__name__ in ("SymInt", "SymFloat", "SymBool"):
            found.append(str(a))
    visit(list(node.args))
    visit(list(node.kwargs.values()))
    return found


def _last_dim_mean(node: Any) -> bool:
    """A mean over a static last dim only (a fully connected reduction: leading dims may be dynamic)."""
    if str(node.target) != "aten.mean.dim" or len(node.args) < 2 or not node.args[1]:
        return False
    src = _tensors(node.args[0].meta.get("val"))
    if not src or not len(src[0].shape) or is_symbolic(src[0].shape[-1]):
        return False
    r = len(src[0].shape)
    return [int(d) % r for d in node.args[1]] == [r - 1]


def dynamic_problem(node: Any, name: str) -> str | None:
    """Why ``node`` (op ``name``) cannot be delegated with its dynamic dims, ``None`` when it can (or has none).

    Refused: convolution, batch norm and pooling over dynamic dims (their lowering bakes the spatial sizes; a mean
    over a static last dim is a fully connected reduction and may have dynamic leading dims);
    a symbolic scalar argument except a view's or expand's sizes (the lowering reads those from the output);
    a reshape (view, squeeze, unsqueeze, select) whose output has more than one dynamic dim (XNNPACK's static
    reshape infers one); a slice along a dynamic dim; an expand that broadcasts.
    """
    sym = _symbolic_args(node)
    if sym and name not in _SYMBOLIC_ARGS_OK:
        return f"symbolic argument {', '.join(sym)} (only a view's sizes may be symbolic)"
    inputs = [a for a in node.all_input_nodes if hasattr(a, "meta")]
    if not _has_dynamic(node, inputs):
        return None
    if name in _STATIC_ONLY and not _last_dim_mean(node):
        return "over dynamic dims (its lowering bakes the spatial sizes into its parameters)"
    out = _tensors(node.meta.get("val"))
    src = _tensors(node.args[0].meta.get("val")) if node.args and hasattr(node.args[0], "meta") else []
    if name in _RESHAPES and out and src:
        o, i = out[0].shape, src[0].shape
        if len(dynamic_dims(o)) > 1 and not _same_shape(o, i):
            return (f"reshape to {list(o)}: more than one dynamic dim (XNNPACK's static reshape infers one; "
                    "ExecuTorch's partitioner refuses it too)")
    if name in ("aten.slice_copy.Tensor", "aten.select_copy.int") and src:
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if isinstance(dim, int) and is_symbolic(src[0].shape[dim % len(src[0].shape)]):
            return f"slice along the dynamic dim {dim} of {list(src[0].shape)}"
    if name == "aten.expand_copy.default" and out and src and not _same_shape(out[0].shape, src[0].shape):
        return "expand that broadcasts (only the no-op expand is supported)"
    return None


def _same_shape(a: Any, b: Any) -> bool:
    """Equal shapes, symbolic dims compared by their expressions."""
    return [str(d) for d in a] == [str(d) for d in b]
