"""Constraints that capability tables share: the checks every backend's table would otherwise write again.

Torch-free, like :mod:`edgeport.node_helpers` they build on: each reads only ``node.args`` / ``node.kwargs`` /
``node.users`` and ``meta["val"]``. A constraint is ``node -> None | reason`` (``OpCapability.constraint``);
the reason says what in the node the backend cannot take. Plain checks are constraints as they are
(``OpCapability("aten.add.Tensor", F32, alpha_one)``); the factories (:func:`static_shapes`, :func:`max_rank`)
take what differs between backends, and :func:`first_problem` chains checks, the first reason winning::

    _static = static_shapes("AcmeNPU graphs are static (export without Dim)")
    _conv = first_problem(conv2d, _static)
    OpCapability("aten.convolution.default", ("float32",), _conv, "CONV2D / DEPTHWISE_CONV2D")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgeport.node_helpers import int_pair, node_arg, node_shape, node_value

__all__ = [
    "Constraint", "adaptive_avg_pool_1x1", "alpha_one", "avg_pool2d", "conv2d", "first_output_only",
    "first_problem", "gelu_erf_or_tanh", "max_pool2d", "max_rank", "no_half_to_float", "non_negative_padding",
    "positive_step", "static_shapes", "tensor_nodes", "unit_step",
]

Constraint = Callable[[Any], "str | None"]


def _name(n: Any) -> str:
    return str(getattr(n, "name", n))


def _label(check: Any) -> str:
    """A check's name for docs (``edgeport op-table``): a ``functools.partial`` shows its keywords."""
    if hasattr(check, "func"):
        keywords = ", ".join(f"{k}={v!r}" for k, v in check.keywords.items())
        return f"{_label(check.func)}({keywords})"
    return str(getattr(check, "__name__", "check"))


def tensor_nodes(node: Any) -> list[Any]:
    """``node`` and the nodes it reads, those whose (first) value is a tensor."""
    return [n for n in (node, *getattr(node, "all_input_nodes", ())) if hasattr(node_value(n), "shape")]


def first_problem(*checks: Constraint) -> Constraint:
    """One constraint running ``checks`` in order: the first reason found, or ``None``."""

    def check(node: Any) -> str | None:
        for c in checks:
            why = c(node)
            if why:
                return why
        return None

    check.__name__ = " + ".join(_label(c) for c in checks)
    return check


def static_shapes(why: str, *, max_rank: int | None = None, empty: str | None = None) -> Constraint:
    """Static shapes on the node and its tensor inputs (``why`` completes "dynamic shape on x: ..."); with
    ``max_rank``, no tensor of a higher rank; with ``empty`` (the reason), no tensor without elements."""

    def check(node: Any) -> str | None:
        for n in tensor_nodes(node):
            s = node_shape(n)
            if s is None:
                return f"dynamic shape on {_name(n)}: {why}"
            if max_rank is not None and len(s) > max_rank:
                return f"{_name(n)} has rank {len(s)} > {max_rank}"
            if empty is not None and 0 in s:
                return f"{_name(n)} {list(s)} has no elements: {empty}"
        return None

    check.__name__ = "static_shapes"
    return check


def max_rank(limit: int, note: str = "") -> Constraint:
    """No static-shaped tensor of the node or its inputs has a rank above ``limit`` (``note``: why, for the
    reason)."""

    def check(node: Any) -> str | None:
        for n in tensor_nodes(node):
            s = node_shape(n)
            if s is not None and len(s) > limit:
                return f"{_name(n)} has rank {len(s)} > {limit}" + (f" ({note})" if note else "")
        return None

    check.__name__ = f"max_rank_{limit}"
    return check


def alpha_one(node: Any) -> str | None:
    """``add`` / ``sub`` (Tensor or Scalar) without a scale on the second operand."""
    return "alpha != 1" if node_arg(node, 2, "alpha", 1) != 1 else None


def conv2d(node: Any, *, dilation: bool = True, groups: str = "depthwise", input_ranks: tuple[int, ...] = ()
           ) -> str | None:
    """A 2-D ``aten.convolution``: 4-D weight and static shapes, not transposed, no output padding. ``groups``:
    ``"depthwise"`` takes regular and depthwise convolutions only (one input channel per group), ``"any"`` every
    grouping; ``dilation=False`` refuses dilated ones; ``input_ranks`` (when given) the input ranks taken."""
    w, x = node_shape(node.args[1]), node_shape(node.args[0])
    if w is None or x is None or len(w) != 4 or (input_ranks and len(x) not in input_ranks):
        return "only 2-D convolutions (4-D weight) with static shapes"
    if node_arg(node, 6, "transposed", False):
        return "transposed convolution is not lowered"
    if any(int_pair(node_arg(node, 7, "output_padding", 0))):
        return "output_padding is set"
    g = int(node_arg(node, 8, "groups", 1))
    if groups == "depthwise" and g != 1 and not (g == x[1] and w[1] == 1):
        return f"grouped convolution (groups={g}) that is neither regular nor depthwise"
    if not dilation and int_pair(node_arg(node, 5, "dilation", 1)) != [1, 1]:
        return f"dilated convolution (dilation={int_pair(node_arg(node, 5, 'dilation', 1))})"
    return None


def first_output_only(node: Any, what: str = "") -> str | None:
    """Of a multi-output op (``max_pool2d_with_indices``, ``native_layer_norm``, batch norm), only the first
    output is read (``what`` names the others in the reason, e.g. ``"indices"``)."""
    used = sorted({int(u.args[1]) for u in getattr(node, "users", ())
                   if getattr(getattr(u, "target", None), "__name__", "") == "getitem" and u.args[1] != 0})
    if not used:
        return None
    which = f"the {what} output" if what else f"output {used}"
    return f"{which} of {_name(node)} is used; only the first output is lowered"


def max_pool2d(node: Any, *, dilation: bool = False, ceil_mode: bool = False) -> str | None:
    """``max_pool2d`` (``_with_indices`` too: its indices unused); by default neither dilated nor with
    ``ceil_mode=True``."""
    if not dilation and int_pair(node_arg(node, 4, "dilation", 1)) != [1, 1]:
        return "dilated max pooling"
    if not ceil_mode and node_arg(node, 5, "ceil_mode", False):
        return "ceil_mode=True"
    return first_output_only(node, "indices")


def avg_pool2d(node: Any, *, count_include_pad: bool = True) -> str | None:
    """``avg_pool2d`` without ``ceil_mode`` or ``divisor_override``; ``count_include_pad=False`` also refuses
    padding counted in the average (for hardware that averages the valid elements only)."""
    if node_arg(node, 4, "ceil_mode", False):
        return "ceil_mode=True"
    if node_arg(node, 6, "divisor_override") is not None:
        return "divisor_override is set"
    if (not count_include_pad and any(int_pair(node_arg(node, 3, "padding", 0)))
            and node_arg(node, 5, "count_include_pad", True)):
        return "padding counted in the average (count_include_pad=True); only the valid elements are averaged"
    return None


def adaptive_avg_pool_1x1(node: Any) -> str | None:
    """``_adaptive_avg_pool2d`` to 1x1 (a global average)."""
    size = node_arg(node, 1, "output_size")
    return None if int_pair(size) == [1, 1] else f"adaptive average pooling to {list(size)}, not 1x1"


def non_negative_padding(node: Any) -> str | None:
    """``constant_pad_nd`` that pads (a negative entry crops)."""
    return "negative padding (cropping)" if any(int(p) < 0 for p in node.args[1]) else None


def positive_step(node: Any) -> str | None:
    """``slice_copy`` with an integer step of 1 or more."""
    step = node_arg(node, 4, "step", 1)
    return None if isinstance(step, int) and step >= 1 else f"slice step {step!r} (positive steps only)"


def unit_step(node: Any) -> str | None:
    """``slice_copy`` with step 1."""
    step = node_arg(node, 4, "step", 1)
    return None if step == 1 else f"slice step {step!r} (step 1 only)"


def no_half_to_float(node: Any) -> str | None:
    """``_softmax`` / ``_log_softmax`` without ``half_to_float``."""
    return "half_to_float=True" if node_arg(node, 2, "half_to_float", False) else None


def gelu_erf_or_tanh(node: Any) -> str | None:
    """``gelu`` in its exact (erf) or tanh form."""
    approximate = node_arg(node, 1, "approximate", "none")
    return None if approximate in ("none", "tanh") else f"gelu approximate={approximate!r}"
