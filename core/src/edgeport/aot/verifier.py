"""The edge-dialect verifier: checks a graph only holds what the later stages can handle, with clear messages."""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch
from torch._ops import OpOverload

from edgeport.aot.delegate_op import CALL_DELEGATE
from edgeport.errors import VerificationError

_SYM_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod,
            operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge, operator.neg}


def _is_size_function(target: object) -> bool:
    """``torch.sym_max``, ``math.floor`` and the like: Python functions export records on symbolic sizes."""
    return getattr(target, "__module__", None) in ("torch", "math", "builtins", "torch.fx.experimental.sym_node")


def _is_core(op: OpOverload) -> bool:
    return torch.Tag.core in op.tags or torch.Tag.view_copy in op.tags


def _who_claims(op: str) -> str:
    """Which installed backends list ``op`` in their capability table (the partitioner to try), as advice."""
    from edgeport.registry import list_backends

    claiming = []
    for spec in list_backends():
        try:
            table = spec.capabilities() if spec.capabilities is not None else None
        except Exception:  # noqa: BLE001 - advice only: a broken table is reported elsewhere
            continue
        if table is not None and table.lookup(op) is not None:
            claiming.append(spec.backend_id)
    if claiming:
        return (f"installed backends that claim it: {', '.join(claiming)} -- pass that backend's partitioner to "
                "to_edge_transform_and_lower (it keeps the op whole through ops_to_not_decompose); or ")
    return "no installed backend claims it (`edgeport backends` lists them); "


def verify_edge_graph(
    gm: torch.fx.GraphModule, *, method: str = "forward", allowed: Iterable[OpOverload] = ()
) -> None:
    """Raise :class:`VerificationError` naming the first offending node when the graph is not valid edge IR.

    Valid: core ATen ops (and their ``*_copy`` / out-variant-able forms), ``aten.sym_size.int``, symbolic
    arithmetic on sizes, ``getitem``, ``call_delegate``, and the ops in ``allowed`` (those a partitioner asked to
    keep, or listed in ``EdgeCompileConfig._core_aten_ops_exception_list``). Every computing node needs
    ``meta["val"]``.
    """
    allowed_set = set(allowed)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        where = f"method {method!r}, node {node.name!r}"
        if node.op == "get_attr":
            continue
        if node.op != "call_function":
            raise VerificationError(f"{where}: unsupported node kind {node.op!r}; export must produce a flat graph")
        target = node.target
        if target is operator.getitem or target in _SYM_OPS or target is CALL_DELEGATE:
            pass
        elif isinstance(target, OpOverload):
            if target.namespace == "aten" and (_is_core(target) or target is torch.ops.aten.sym_size.int):
                pass
            elif target in allowed_set:
                pass
            elif target.namespace in ("quantized_decomposed",):
                pass
            else:
                raise VerificationError(
                    f"{where}: operator {target} is not in core ATen and no partitioner kept it; "
                    f"{_who_claims(str(target))}add it to EdgeCompileConfig._core_aten_ops_exception_list or "
                    "register a decomposition"
                )
            if target.is_view:
                raise VerificationError(f"{where}: view op {target} must be replaced by its _copy variant")
        elif _is_size_function(target):
            raise VerificationError(
                f"{where}: {getattr(target, '__name__', target)!r} on symbolic sizes is not supported (edgeport "
                "emits +, -, *, //, /, %, comparisons and negation of sizes); compute it from those, or make the "
                "dimension static")
        else:
            raise VerificationError(f"{where}: call target {target!r} is not an operator overload")
        if "val" not in node.meta:
            raise VerificationError(f"{where}: missing meta['val']; re-run the pass that created this node")
