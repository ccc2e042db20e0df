"""Passes that turn a decomposed ATen graph into edgeport's edge dialect.

The edge dialect is core ATen with these normalizations, so that every op has a portable out-variant:

* view ops become their ``*_copy`` variants (``view`` → ``view_copy``, ``permute`` → ``permute_copy``, ...);
* a ``.Tensor`` overload called with a Python number as its second argument becomes the ``.Scalar`` overload
  (``mul.Tensor(x, 2)`` → ``mul.Scalar(x, 2)``) so no tensor constant has to be invented for the scalar;
* ``torch.sym_float(s)`` (``x.shape[1] * 0.5``) becomes ``s / 1``: Python's true division of sizes is
  ``executorch_prim::truediv``, which always yields a float, so the value is exactly ``float(s)``.

A symbolic size passed where the schema wants a tensor (``x.sum(1) / x.shape[1]`` under a dynamic dim,
``nonzero(x).shape[0]``) stays as it is in the edge program -- partitioners see what export wrote -- and becomes a
scalar argument when the program is converted to out variants (:func:`normalize_symbolic_arguments`): a runtime
reading a size where a tensor belongs reads the wrong kind of value (the stock runtime aborts).
"""

from __future__ import annotations

import numbers
import operator

import torch
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensor

aten = torch.ops.aten

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool, bool, int, float)


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


def is_symbolic_scalar(arg: object) -> bool:
    """Whether ``arg`` is a node computing a scalar (a symbolic size, or arithmetic on sizes), not a tensor."""
    return isinstance(arg, torch.fx.Node) and isinstance(arg.meta.get("val"), _SYMBOLIC)


def scalar_variant(op: OpOverload, args: tuple, symbolic: bool = False) -> OpOverload | None:
    """The ``.Scalar`` overload to use when a ``.Tensor`` overload gets a number (or, with ``symbolic``, a
    symbolic size) as its second argument."""
    if op.namespace != "aten" or op._overloadname not in ("Tensor", "Tensor_mode") or len(args) < 2:
        return None
    if isinstance(args[1], torch.fx.Node):
        if not (symbolic and is_symbolic_scalar(args[1])):
            return None
    elif not isinstance(args[1], numbers.Number):
        return None
    name = "Scalar" if op._overloadname == "Tensor" else "Scalar_mode"
    return getattr(op.overloadpacket, name, None)


def _scalar_dtype(val: object) -> torch.dtype:
    if isinstance(val, (torch.SymBool, bool)):
        return torch.bool
    if isinstance(val, (torch.SymInt, int)):
        return torch.int64
    return torch.get_default_dtype()


def _fake_mode(gm: torch.fx.GraphModule) -> object:
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, FakeTensor):
            return val.fake_mode
    return None


def _tensor_arguments(node: torch.fx.Node) -> list[tuple[int | str, object]]:
    """``(position or keyword, value)`` of each argument the schema types as a single Tensor."""
    found: list[tuple[int | str, object]] = []
    for i, arg in enumerate(node.target._schema.arguments):
        if not isinstance(arg.type, torch.TensorType):
            continue
        if i < len(node.args) and not arg.kwarg_only:
            found.append((i, node.args[i]))
        elif arg.name in node.kwargs:
            found.append((arg.name, node.kwargs[arg.name]))
    return found


def _number_dtype(node: torch.fx.Node, value: object) -> torch.dtype:
    """The dtype a Python number in a tensor argument keeps torch's promotion as a 0-dim tensor: a float takes
    the floating dtype of the op's tensor arguments (else the default), an int int64, a bool bool."""
    if isinstance(value, bool) or not isinstance(value, float):
        return _scalar_dtype(value)
    for _, other in _tensor_arguments(node):
        val = other.meta.get("val") if isinstance(other, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and val.dtype.is_floating_point:
            return val.dtype
    return torch.get_default_dtype()


def _wrap_symbolic_tensor_arguments(gm: torch.fx.GraphModule, node: torch.fx.Node, numbers: bool = False) -> bool:
    """Put a 0-dim ``aten.scalar_tensor`` in front of each tensor argument that holds a symbolic size (with
    ``numbers``: instead, each plain Python number, such as the ``-128`` of ``sub.Tensor(-128, x)`` a
    decomposition wrote)."""
    changed = False
    for where, value in _tensor_arguments(node):
        if numbers:  # the edge pass: plain numbers only (symbolic sizes wait for the out-variant pass)
            if not isinstance(value, (int, float)):
                continue
            dtype = _number_dtype(node, value)
        elif is_symbolic_scalar(value):
            dtype = _scalar_dtype(value.meta["val"])
        else:
            continue
        with gm.graph.inserting_before(node):
            tensor = gm.graph.call_function(aten.scalar_tensor.default, (value,), {"dtype": dtype})
        mode = _fake_mode(gm)
        if mode is not None:
            with mode:
                tensor.meta["val"] = torch.empty((), dtype=dtype)
        tensor.meta["stack_trace"] = node.meta.get("stack_trace")
        if isinstance(where, int):
            node.update_arg(where, tensor)
        else:
            node.update_kwarg(where, tensor)
        changed = True
    return changed


def normalize_edge_ops(gm: torch.fx.GraphModule) -> bool:
    """Apply the edge normalizations in place; returns whether the graph changed."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.sym_float and len(node.args) == 1 and not node.kwargs:
            node.target, node.args = operator.truediv, (node.args[0], 1)
            changed = True
        if node.op != "call_function" or not isinstance(node.target, OpOverload):
            continue
        replacement = copy_variant(node.target) or scalar_variant(node.target, node.args)
        if replacement is not None:
            node.target = replacement
            changed = True
        changed |= _wrap_symbolic_tensor_arguments(gm, node, numbers=True)
    if changed:
        gm.recompile()
    return changed


def normalize_symbolic_arguments(gm: torch.fx.GraphModule) -> bool:
    """Give every tensor argument holding a symbolic size a scalar form, in place: the ``.Scalar`` overload when
    the size is a ``.Tensor`` overload's second argument (``div.Tensor(x, s)`` → ``div.Scalar(x, s)``), else
    ``aten.scalar_tensor(s)`` (as ExecuTorch does). Returns whether the graph changed."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, OpOverload):
            continue
        replacement = scalar_variant(node.target, node.args, symbolic=True)
        if replacement is not None:
            node.target = replacement
            changed = True
        changed |= _wrap_symbolic_tensor_arguments(gm, node)
    if changed:
        gm.recompile()
    return changed
