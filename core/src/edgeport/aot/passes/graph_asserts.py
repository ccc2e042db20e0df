"""Assertion nodes ``torch.export`` leaves in the graph: checked at lowering where the graph can decide them, then
removed (none of them is core ATen, and neither runtime has a kernel for them).

What happens to each kind (ExecuTorch's ``to_edge`` / ``to_executorch`` erase them all without a check):

* ``aten._assert_tensor_metadata`` (``.to(dtype)`` in GPT-2, T5, Llama): checked against the dtype and static
  sizes the graph carries for its tensor -- the shapes and dtypes the program will run with; method inputs are
  checked against them at run time by the runtimes -- and refused when it cannot hold.
* ``aten._assert_scalar`` (a condition on symbolic sizes or on a value read with ``.item()``): a condition that is
  always false is refused; one that is always true goes. One that depends on run-time values (e.g. ``u0 <= 10`` for
  the length of ``nonzero``'s output) cannot be checked here and no runtime has a kernel to check it: it goes, as
  in ExecuTorch. Where such a bound sizes a tensor, memory is planned for it and both runtimes refuse to resize a
  tensor past its planned bound, so a violation is an error at run time, not an overrun.
* ``aten._assert_async`` (data checks such as ``one_hot``'s "class values must be non-negative"): they depend on
  tensor contents; removed, as in ExecuTorch, with the nodes that only computed their condition.
* ``aten.sym_constrain_range`` / ``sym_constrain_range_for_size`` (``torch._check_is_size``): they only inform
  export's value ranges, which the exported program keeps (``range_constraints``) and memory planning reads.
* the ``_functional_*`` forms of these (dependency tokens) likewise.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from edgeport.errors import ExportError

aten = torch.ops.aten

_METADATA = aten._assert_tensor_metadata.default
_SCALAR = {aten._assert_scalar.default, aten._functional_assert_scalar.default}
_DATA = {aten._assert_async.default, aten._assert_async.msg, aten._functional_assert_async.msg}
_RANGES = {aten.sym_constrain_range.default, aten.sym_constrain_range_for_size.default,
           aten._functional_sym_constrain_range.default, aten._functional_sym_constrain_range_for_size.default}
ASSERT_OPS: frozenset[Any] = frozenset({_METADATA, *_SCALAR, *_DATA, *_RANGES})
"""Every op :func:`remove_graph_asserts` handles."""


def _same_dims(expected: Any, actual: Any) -> bool:
    if expected is None:
        return True
    if len(expected) != len(actual):
        return False
    for e, a in zip(expected, actual):
        if isinstance(e, int) and isinstance(a, int) and e != a:
            return False  # symbolic sizes are checked by export's own range constraints
    return True


def _check_metadata(node: torch.fx.Node, method: str) -> None:
    tensor = node.args[0]
    val = tensor.meta.get("val") if isinstance(tensor, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return
    size = node.kwargs.get("size", node.args[1] if len(node.args) > 1 else None)
    dtype = node.kwargs.get("dtype", node.args[3] if len(node.args) > 3 else None)
    problems = []
    if dtype is not None and dtype != val.dtype:
        problems.append(f"dtype {val.dtype} where {dtype} is asserted")
    if not _same_dims(size, tuple(val.shape)):
        problems.append(f"shape {list(val.shape)} where {list(size)} is asserted")
    if problems:
        raise ExportError(
            f"method {method!r}, node {node.name!r}: aten._assert_tensor_metadata fails on {tensor.name!r}: "
            f"{'; '.join(problems)}. The model asserts metadata its own graph does not have; export it again "
            "with inputs of the dtype and shape it expects")


def _known(cond: Any) -> bool | None:
    """The condition's value when the graph decides it (a constant, or a symbolic condition export's value ranges
    prove or refute), else None."""
    val = cond.meta.get("val") if isinstance(cond, torch.fx.Node) else cond
    if isinstance(val, (bool, int)):
        return bool(val)
    if isinstance(val, torch.SymBool):
        if statically_known_true(val):
            return True
        if statically_known_true(torch.sym_not(val)):
            return False
    return None


def _check_scalar(node: torch.fx.Node, method: str) -> None:
    if _known(node.args[0]) is False:
        message = node.args[1] if len(node.args) > 1 else node.kwargs.get("assert_msg", "")
        raise ExportError(
            f"method {method!r}, node {node.name!r}: the model asserts a condition that never holds for the shapes "
            f"it was exported with ({message}); export it again with example inputs (and dynamic_shapes) the "
            "model accepts")


def _erase_unused_producers(graph: torch.fx.Graph, nodes: list[Any]) -> None:
    """Erase the call nodes among ``nodes`` (and their producers) that nothing uses any more."""
    pending = [n for n in nodes if isinstance(n, torch.fx.Node)]
    while pending:
        node = pending.pop()
        if node.op != "call_function" or node.users or node.graph is not graph or node.is_impure():
            continue
        producers = list(node.all_input_nodes)
        graph.erase_node(node)
        pending.extend(producers)


def remove_graph_asserts(gm: torch.fx.GraphModule, method: str) -> int:
    """Check (see the module's docstring) and erase every assertion node of ``gm`` and its subgraphs, with the
    nodes that only computed their conditions; returns how many assertions went."""
    removed = 0
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        graph = module.graph
        found = [n for n in graph.nodes if n.op == "call_function" and n.target in ASSERT_OPS]
        for node in found:
            if node.target is _METADATA:
                _check_metadata(node, method)
            elif node.target in _SCALAR:
                _check_scalar(node, method)
        for node in reversed(found):  # the _functional_ forms chain tokens: later users are gone first
            if node.users:
                raise ExportError(f"method {method!r}, node {node.name!r}: the result of {node.target} is used "
                                  f"by {[u.name for u in node.users]}; edgeport cannot remove this assertion")
            inputs = list(node.all_input_nodes)
            graph.erase_node(node)
            _erase_unused_producers(graph, inputs)
            removed += 1
        if found:
            module.recompile()
    return removed
