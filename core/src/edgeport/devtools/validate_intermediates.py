"""The worst node of a partition, where its backend exposes intermediate values.

A backend executor may offer ``intermediate_outputs(handle, inputs) -> Mapping[str, array]``: the value of each
node it computed, keyed by the node's name in the partition's original subgraph (the program its ``preprocess``
got). Where it does, each node is compared with the same node run in eager PyTorch on the same inputs, and the
one with the lowest SQNR is the partition's worst node. Where it does not, the table says so.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from edgeport.devtools.validate_report import ErrorStats, error_stats

__all__ = ["INTERMEDIATES_METHOD", "eager_intermediates", "worst_node"]

#: Name of the optional executor method that returns per-node values.
INTERMEDIATES_METHOD = "intermediate_outputs"


def _to_numpy(value: Any) -> Any:
    import torch

    return value.detach().contiguous().cpu().numpy() if isinstance(value, torch.Tensor) else value


def eager_intermediates(program: Any, inputs: Sequence[Any]) -> dict[str, Any]:
    """Node name -> value (numpy) of every tensor-valued ``call_function`` node of ``program`` run eagerly."""
    import torch

    values: dict[str, Any] = {}

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            if n.op == "call_function" and isinstance(result, torch.Tensor):
                values[n.name] = _to_numpy(result)
            return result

    with torch.no_grad():
        _Recorder(program.module()).run(*inputs)
    return values


def _init_kwargs(init: Any, named_data: Any) -> dict[str, Any]:
    try:
        params = inspect.signature(init).parameters
    except (TypeError, ValueError):
        return {}
    takes = "named_data" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())
    return {"named_data": named_data} if takes else {}


def _backend_intermediates(lowered: Any, executor: Any, inputs: Sequence[Any]) -> dict[str, Any]:
    """Initialise ``executor`` on the partition's serialized blob (with its named data) and ask for its values."""
    from edgeport.program.reader import load_pte

    loaded = load_pte(lowered.buffer())
    delegate = loaded.program.execution_plan[0].delegates[0]
    handle = executor.init(memoryview(loaded.delegate_data(0, 0)), list(delegate.compile_specs),
                           **_init_kwargs(executor.init, loaded.named_data))
    try:
        got = getattr(executor, INTERMEDIATES_METHOD)(handle, [_to_numpy(x) for x in inputs])
    finally:
        destroy = getattr(executor, "destroy", None)
        if callable(destroy):
            destroy(handle)
    return dict(got)


def worst_node(lowered: Any, inputs: Sequence[Any]) -> tuple[str, ErrorStats | None]:
    """(description, stats) of the node of ``lowered``'s partition with the lowest SQNR against eager PyTorch, or
    (``"n/a: <why>"``, ``None``) when the backend exposes no intermediates."""
    from edgeport.registry import get_backend

    backend_id = lowered.backend_id
    try:
        spec = get_backend(backend_id)
        executor = spec.executor() if spec.executor is not None else None
    except Exception as exc:  # noqa: BLE001 - the partition row already reports a backend that cannot run
        return f"n/a: {type(exc).__name__}: {exc}", None
    if not callable(getattr(executor, INTERMEDIATES_METHOD, None)):
        return f"n/a: {backend_id} exposes no intermediates", None
    try:
        got = _backend_intermediates(lowered, executor, inputs)
        ref = eager_intermediates(lowered.original_module, inputs)
    except Exception as exc:  # noqa: BLE001 - the per-node view is optional; say why it is missing
        return f"n/a: {backend_id} intermediates failed: {type(exc).__name__}: {exc}", None
    common = [name for name in ref if name in got]
    if not common:
        return f"n/a: {backend_id} exposed no value of a node of the original subgraph", None
    scored = [(name, error_stats([got[name]], [ref[name]])) for name in common]
    name, stats = min(scored, key=lambda t: (t[1].sqnr_db, -t[1].max_abs))
    return f"{name} (of {len(common)} nodes compared)", stats
