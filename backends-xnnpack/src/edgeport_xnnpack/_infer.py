"""Shape inference over a blob graph for new input shapes, as newer XNNPACK's ``xnn_reshape_runtime`` does it.

Torch-free. A blob declares every value at its upper-bound dims; for a call with smaller inputs each node's
output dims follow from its input dims and parameters: a static reshape infers the ``new_shape`` entry that is 0
(ExecuTorch's mark of the dynamic dim) from the element count, a slice size of 0 keeps the input's dim (minus the
offset), binary operators broadcast, and so on. :func:`infer_dims` returns every value's dims or raises
:class:`ShapeError` naming the node whose shape cannot follow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from edgeport_xnnpack._shapes import broadcast, expected_output
from edgeport_xnnpack.schema.graph import CAT_INPUTS, XNode

Dims = tuple[int, ...]

_SAME = frozenset({
    "XNNSoftmax", "XNNSigmoid", "XNNFloor", "XNNCeiling", "XNNSquareRoot", "XNNHardswish", "XNNNegate", "XNNSquare",
    "XNNAbs", "XNNConvert", "XNNClamp", "XNNELU", "XNNLeakyReLU", "XNNTanh", "XNNExp", "XNNLog", "XNNSin", "XNNCos",
    "XNNReciprocalSquareRoot", "XNNGelu", "XNNCopy",
})
_BINARY = frozenset({"XNNAdd", "XNNSubtract", "XNNMultiply", "XNNDiv", "XNNMinimum", "XNNMaximum"})
_EXPECTED = frozenset({"XNNFullyConnected", "XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d",
                       "XNNMaxPooling2d", "XNNAvgPooling2d", "XNNGlobalAvgPooling2d", "XNNStaticResizeBilinear2D",
                       "XNNPReLU"})


class ShapeError(ValueError):
    """A node whose output shape cannot follow the new input shapes (``index``: its position in the blob)."""

    def __init__(self, index: int, node: XNode, message: str) -> None:
        super().__init__(f"xnodes[{index}] ({node.kind}): {message}")
        self.index, self.node = index, node


Rule = Callable[[Callable[[int], Dims]], "Dims | str"]


def infer_dims(nodes: Sequence[XNode], declared: Mapping[int, Dims], given: Mapping[int, Dims],
               outputs: Sequence[Sequence[int]] | None = None,
               rules: Sequence[Rule] | None = None) -> dict[int, Dims]:
    """Every value's dims when the external inputs have the ``given`` dims (value id -> dims); values no node
    produces (constants, and inputs not in ``given``) keep their ``declared`` dims. ``outputs``: each node's
    ``outputs()`` when the caller keeps them; ``rules``: :func:`node_rules` of ``nodes`` and ``declared`` when the
    caller keeps them (the same results as :func:`output_dims`, parameters read once)."""
    dims: dict[int, Dims] = dict(declared)
    dims.update(given)
    if outputs is None:
        outputs = [node.outputs() for node in nodes]
    get = dims.__getitem__
    for i, node in enumerate(nodes):
        try:
            out = rules[i](get) if rules is not None else output_dims(node, get, declared)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            if isinstance(exc, ShapeError):
                raise
            raise ShapeError(i, node, f"malformed parameters ({type(exc).__name__}: {exc})") from exc
        if isinstance(out, str):
            raise ShapeError(i, node, out)
        if any(d < 1 for d in out):
            raise ShapeError(i, node, f"output dims {list(out)} would be empty")
        for o in outputs[i]:
            dims[o] = out
    return dims


def output_dims(node: XNode, get: Callable[[int], Dims], declared: Mapping[int, Dims]) -> Dims | str:
    """The output dims of ``node`` from its inputs' (``get(value_id)``), or what prevents them."""
    k, g = node.kind, node.get
    if k in _SAME:
        return get(g("input_id"))
    if k in _BINARY:
        a, b = get(g("input1_id")), get(g("input2_id"))
        out = broadcast(a, b)
        return out if out is not None else f"shapes {list(a)} and {list(b)} do not broadcast"
    if k in _EXPECTED:
        return expected_output(node, get)
    if k == "XNNStaticReshape":
        return _reshape(node, get(g("input_id")), declared[g("output_id")])
    if k == "XNNStaticTranspose":
        x, perm = get(g("input_id")), [int(p) for p in g("perm")]
        if sorted(perm) != list(range(len(x))):
            return f"permutation {perm} does not match rank {len(x)}"
        return tuple(x[p] for p in perm)
    if k in CAT_INPUTS:
        return _concatenate(node, [get(g(f"input{j + 1}_id")) for j in range(CAT_INPUTS[k])])
    if k == "XNNStaticSlice":
        return _slice(node, get(g("input_id")))
    if k == "XNNStaticConstantPad":
        x, pre, post = get(g("input_id")), list(g("pre_paddings")), list(g("post_paddings"))
        if len(pre) != len(x) or len(post) != len(x):
            return f"pad needs {len(x)} pre and post paddings"
        return tuple(a + b + c for a, b, c in zip(x, pre, post, strict=True))
    if k == "XNNBatchMatrixMultiply":
        return _bmm(node, get(g("input1_id")), get(g("input2_id")))
    return f"no shape rule for {k}: its output cannot follow dynamic input shapes"


def node_rules(nodes: Sequence[XNode], declared: Mapping[int, Dims]) -> list[Rule]:
    """Each node's :func:`output_dims` as a function of the value dims (``get(value_id)``), its parameters read
    once: a specialization infers the dims of the same nodes again and again. The nodes must not change after."""
    return [_rule(node, declared) for node in nodes]


def _rule(node: XNode, declared: Mapping[int, Dims]) -> Rule:
    k, g = node.kind, node.get

    def generic(get: Callable[[int], Dims]) -> Dims | str:
        return output_dims(node, get, declared)

    try:
        if k in _SAME:
            i = g("input_id")
            return lambda get: get(i)
        if k in _BINARY:
            a, b = g("input1_id"), g("input2_id")

            def binary(get: Callable[[int], Dims]) -> Dims | str:
                x, y = get(a), get(b)
                out = broadcast(x, y)
                return out if out is not None else f"shapes {list(x)} and {list(y)} do not broadcast"
            return binary
        if k == "XNNStaticReshape":
            i, new = g("input_id"), [int(d) for d in g("new_shape")]
            declared_out = declared[g("output_id")]
            return lambda get: _reshape_to(new, get(i), declared_out)
        if k == "XNNStaticTranspose":
            i, perm = g("input_id"), [int(p) for p in g("perm")]
            rank = len(perm) if sorted(perm) == list(range(len(perm))) else -1

            def transpose(get: Callable[[int], Dims]) -> Dims | str:
                x = get(i)
                if len(x) != rank:
                    return f"permutation {perm} does not match rank {len(x)}"
                return tuple(x[p] for p in perm)
            return transpose
        if k == "XNNStaticSlice":
            i = g("input_id")
            return lambda get: _slice(node, get(i))
    except (KeyError, IndexError, TypeError, ValueError):
        pass  # malformed parameters: output_dims says so when the rule runs
    return generic


def _reshape(node: XNode, x: Dims, declared_out: Dims) -> Dims | str:
    return _reshape_to([int(d) for d in node.get("new_shape")], x, declared_out)


def _reshape_to(new: list[int], x: Dims, declared_out: Dims) -> Dims | str:
    if len(new) != len(declared_out):  # an older blob without new_shape: the declared dims
        new = list(declared_out)
    else:
        new = list(new)
    n = math.prod(x)
    holes = [j for j, d in enumerate(new) if d == 0]
    if len(holes) > 1:
        return f"new_shape {new} marks {len(holes)} dims to infer (XNNPACK infers at most one)"
    if holes:
        rest = math.prod(d for d in new if d)
        if rest == 0 or n % rest:
            return f"cannot reshape {list(x)} ({n} elements) into {new} (0 = inferred)"
        new[holes[0]] = n // rest
    elif math.prod(new) != n:
        return (f"static reshape to {new} of an input of {n} elements ({list(x)}): the blob marks no dim as "
                "dynamic (0 in new_shape), so this node only runs at its declared size")
    return tuple(new)


def _concatenate(node: XNode, xs: list[Dims]) -> Dims | str:
    axis = int(node.get("axis"))
    rank = len(xs[0])
    if axis >= rank or any(len(x) != rank for x in xs):
        return f"concatenate of {[list(x) for x in xs]} along axis {axis}"
    rest = {x[:axis] + x[axis + 1:] for x in xs}
    if len(rest) != 1:
        return f"concatenate inputs {[list(x) for x in xs]} differ outside axis {axis}"
    out = list(xs[0])
    out[axis] = sum(x[axis] for x in xs)
    return tuple(out)


def _slice(node: XNode, x: Dims) -> Dims | str:
    offsets, sizes = [int(v) for v in node.get("offsets")], [int(v) for v in node.get("sizes")]
    if len(offsets) != len(x) or len(sizes) != len(x):
        return f"slice offsets / sizes do not match the input rank {len(x)}"
    out = []
    for o, s, d in zip(offsets, sizes, x, strict=True):
        size = s if s else d - o  # 0: the rest of the (dynamic) dim
        if o + size > d or size < 1:
            return f"slice [{o}, +{s}) of a dim of {d} (input {list(x)})"
        out.append(size)
    return tuple(out)


def _bmm(node: XNode, a: Dims, b: Dims) -> Dims | str:
    if len(a) < 2 or len(b) < 2:
        return f"batch matrix multiply of {list(a)} x {list(b)}"
    k_b, n = (b[-1], b[-2]) if node.get("flags") & 1 else (b[-2], b[-1])
    if a[-1] != k_b:
        return f"batch matrix multiply inner sizes differ: {list(a)} x {list(b)}"
    try:
        batch = np.broadcast_shapes(a[:-2], b[:-2])
    except ValueError:
        return f"batch dims of {list(a)} and {list(b)} do not broadcast"
    return (*batch, a[-2], n)
