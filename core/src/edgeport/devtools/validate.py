"""Numerical validation per partition: ``validate`` and ``bisect``.

ExecuTorch cannot run lowered modules in Python; edgeport can. :func:`validate` runs

* the whole lowered program on edgeport's runtime against the edge program in eager PyTorch (where each delegate
  call runs its partition's original subgraph), and
* each delegate call alone, on the exact inputs that call receives in the eager run, through edgeport's runtime
  (a one-delegate program written from the partition's :class:`~edgeport.LoweredBackendModule`, i.e. the same blob,
  compile specs and named data as in the whole program) against its original subgraph in eager PyTorch on the
  same inputs. A quantized partition is therefore judged against its own q/dq subgraph: what it was asked to
  compute, with no error carried in from earlier partitions.

:func:`bisect` returns the first partition (in execution order) that diverges beyond a threshold that way.
Torch is imported when these functions are called, never when ``edgeport.devtools`` is imported.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeport.devtools.validate_intermediates import worst_node
from edgeport.devtools.validate_report import (
    DEFAULT_SQNR_THRESHOLD_DB,
    ErrorStats,
    PartitionValidation,
    ValidationReport,
    error_stats,
)

__all__ = ["DEFAULT_SQNR_THRESHOLD_DB", "ErrorStats", "PartitionValidation", "ValidationReport", "as_samples",
           "bisect", "check_inputs", "eager_delegate_backends", "eager_run", "validate", "validate_program"]

#: What the whole-program run can be given: ``.pte`` bytes, a path, or an ``ExecutorchProgramManager``.
PteSource = Any


@dataclass
class _Call:
    """One delegate call seen in an eager run: its graph node, lowered module, inputs and outputs."""

    node: str
    key: str
    inputs: list[Any]
    outputs: list[Any]


# -- inputs ---------------------------------------------------------------------------------------------------
def as_samples(calibration_inputs: Any) -> list[tuple[Any, ...]]:
    """One sample (a tensor, or a tuple/list of tensors) or several (a list of tuples/lists) -> list of tuples."""
    import torch

    if isinstance(calibration_inputs, torch.Tensor):
        return [(calibration_inputs,)]
    if not isinstance(calibration_inputs, (tuple, list)) or len(calibration_inputs) == 0:
        raise ValueError("calibration_inputs must be a tuple of inputs (one sample) or a non-empty list of such "
                         f"tuples (several samples), got {type(calibration_inputs).__name__}"
                         f"{' (empty)' if isinstance(calibration_inputs, (tuple, list)) else ''}")
    if all(isinstance(s, (tuple, list)) for s in calibration_inputs):
        return [tuple(s) for s in calibration_inputs]
    return [tuple(calibration_inputs)]


def _range(ep: Any, dim: Any) -> tuple[Any, Any]:
    """(lower, upper) of a symbolic size from ``ep.range_constraints`` (``None`` where unknown or unbounded)."""
    expr = getattr(getattr(dim, "node", None), "expr", None)
    vr = ep.range_constraints.get(expr) if ep is not None and expr is not None else None
    if vr is None:
        return None, None
    lo, hi = vr.lower, vr.upper
    return (int(lo) if lo.is_finite else None), (int(hi) if hi.is_finite else None)


def _describe(val: Any, ep: Any = None) -> str:
    shape = []
    for d in val.shape:
        if isinstance(d, int):
            shape.append(d)
            continue
        lo, hi = _range(ep, d)
        shape.append(f"{d} in [{lo}, {hi}]" if lo is not None and hi is not None else str(d))
    return f"shape {shape} {str(val.dtype).removeprefix('torch.')}".replace("'", "")


def check_inputs(ep: Any, sample: tuple[Any, ...], where: str = "") -> None:
    """Raise ``ValueError`` naming the input and what the program expects if ``sample`` does not fit ``ep``'s
    user inputs (count, tensor or not, dtype, rank, static sizes; symbolic sizes accept any value)."""
    import torch

    names = list(ep.graph_signature.user_inputs)
    by_name = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    vals = [by_name[n].meta.get("val") if n in by_name else None for n in names]
    at = f"{where}: " if where else ""
    if len(sample) != len(names):
        expected = ", ".join(f"{n} ({_describe(v, ep)})" if isinstance(v, torch.Tensor) else n
                             for n, v in zip(names, vals, strict=True))
        raise ValueError(f"{at}expected {len(names)} inputs ({expected}), got {len(sample)}")
    for i, (name, val, x) in enumerate(zip(names, vals, sample, strict=True)):
        if not isinstance(val, torch.Tensor):
            continue
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{at}input {i} ({name!r}) must be a torch.Tensor with {_describe(val, ep)}, "
                             f"got {type(x).__name__}")
        bad = x.dtype != val.dtype or x.dim() != val.dim() or any(
            (d != s) if isinstance(d, int) else not _in_range(_range(ep, d), s)
            for d, s in zip(val.shape, x.shape, strict=True))
        if bad:
            raise ValueError(f"{at}input {i} ({name!r}): expected {_describe(val, ep)}, got {_describe(x)}")


def _in_range(bounds: tuple[Any, Any], size: int) -> bool:
    lo, hi = bounds
    return (lo is None or size >= lo) and (hi is None or size <= hi)


# -- eager runs -----------------------------------------------------------------------------------------------
def _leaves(value: Any) -> list[Any]:
    from torch.utils._pytree import tree_leaves

    return [v for v in tree_leaves(value) if v is not None]


def _to_numpy(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().contiguous().cpu().numpy()
    return value


def eager_run(ep: Any, sample: tuple[Any, ...]) -> tuple[list[Any], list[_Call]]:
    """Run ``ep`` eagerly (each delegate call runs its original subgraph) and record every delegate call of its
    top-level graph: inputs and outputs, in execution order. Returns (flat outputs, calls)."""
    import torch

    from edgeport.aot.delegate_op import CALL_DELEGATE, lookup_lowered_module

    calls: list[_Call] = []

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            if n.op == "call_function" and n.target is CALL_DELEGATE:
                args = self.map_nodes_to_values(n.args, n)
                # a partition's standalone program holds the constants its backend handed back as arguments
                extra = len(lookup_lowered_module(args[0]).constant_inputs)
                inputs = list(args[1])[:len(args[1]) - extra]
                calls.append(_Call(n.name, args[0], [a.clone() if isinstance(a, torch.Tensor) else a
                                                     for a in inputs], list(result)))
            return result

    gm = ep.module()
    with torch.no_grad():
        out = _Recorder(gm).run(*_leaves(sample))
    return [o for o in _leaves(out)], calls


def _nested_delegate_calls(ep: Any) -> int:
    """Delegate calls inside submodules (control flow), which :func:`eager_run` does not see one by one."""
    from edgeport.aot.delegate_op import is_call_delegate

    return sum(1 for name, m in ep.graph_module.named_modules() if name and hasattr(m, "graph")
               for n in m.graph.nodes if is_call_delegate(n))


def eager_delegate_backends(ep: Any) -> list[str]:
    """Backend id of each lowered module ``ep`` calls (each once, submodules included), in graph order."""
    from edgeport.aot.delegate_op import is_call_delegate, lookup_lowered_module

    keys: dict[str, None] = {}
    for _, m in ep.graph_module.named_modules():
        graph = getattr(m, "graph", None)
        for n in graph.nodes if graph is not None else ():
            if is_call_delegate(n):
                keys.setdefault(n.args[0], None)
    return [lookup_lowered_module(k).backend_id for k in keys]


# -- runtime runs ---------------------------------------------------------------------------------------------
def _pte_bytes(pte: PteSource) -> Any:
    if hasattr(pte, "buffer"):
        return pte.buffer
    if isinstance(pte, (str, os.PathLike)):
        return os.fspath(pte)
    return pte


def _load(pte: PteSource, method: str) -> Any:
    from edgeport.runtime import Runtime

    return Runtime.get().load_program(_pte_bytes(pte)).load_method(method)


def _run_whole(pte: PteSource, method: str, samples: list[tuple[Any, ...]],
               references: list[list[Any]]) -> tuple[ErrorStats, str, Any]:
    """Run every sample on the runtime; returns (stats against the references, error text, the method)."""
    stats = ErrorStats()
    try:
        loaded = _load(pte, method)
        for sample, ref in zip(samples, references, strict=True):
            outs = loaded.execute([_to_numpy(x) for x in _leaves(sample)])
            stats.add(error_stats(outs, [_to_numpy(r) for r in ref]))
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return stats, f"{type(exc).__name__}: {exc}", None
    return stats, "", loaded


def _profile_notes(loaded: Any) -> list[str]:
    """What the run's method profile says about its delegates that the numbers depend on: a portable fallback
    taken, or an executor standing in for the hardware (its ``describe_execution``)."""
    if loaded is None:
        return []
    notes = []
    for d in loaded.profile.delegates:
        if d.status == "fallback":
            notes.append(f"whole program: delegate {d.index} ({d.backend_id}) ran on its portable fallback "
                         f"{d.fallback_method!r}: {d.reason}")
        elif d.execution:
            notes.append(f"whole program: delegate {d.index} ({d.backend_id}) ran on {d.execution}")
    return notes


def _lowered_names(ep: Any) -> dict[str, str]:
    """Delegate key -> the attribute (``lowered_module_N``) holding its lowered module in ``ep``'s graph module."""
    from edgeport.aot.lowered_module import LoweredBackendModule

    return {m.delegate_key: name for name, m in ep.graph_module.named_children()
            if isinstance(m, LoweredBackendModule)}


def _ops(lowered: Any) -> dict[str, int]:
    ops = Counter(str(n.target) for n in lowered.original_module.graph.nodes if n.op == "call_function"
                  and not str(n.target).startswith("<"))
    return dict(ops)


def _shapes(values: Sequence[Any]) -> list[list[int]]:
    return [list(v.shape) for v in values if hasattr(v, "shape")]


class _PartitionRunner:
    """Runs delegate calls alone through edgeport's runtime (one program per lowered module, loaded once)."""

    def __init__(self) -> None:
        self._methods: dict[str, Any] = {}

    def run(self, key: str, inputs: Sequence[Any]) -> list[Any]:
        from edgeport.aot.delegate_op import lookup_lowered_module

        method = self._methods.get(key)
        if method is None:
            method = _load(lookup_lowered_module(key).buffer(), "forward")
            self._methods[key] = method
        return method.execute([_to_numpy(x) for x in inputs])


def _check_partition(index: int, calls: list[_Call], runner: _PartitionRunner, names: dict[str, str],
                     thresholds: tuple[float | None, float | None, float]) -> PartitionValidation:
    """One partition (the ``index``-th delegate call) over every sample's recorded call."""
    from edgeport.aot.delegate_op import lookup_lowered_module

    first = calls[0]
    lowered = lookup_lowered_module(first.key)
    where = names.get(first.key)
    result = PartitionValidation(
        index=index, name=f"{first.node} ({where})" if where else first.node, backend_id=lowered.backend_id,
        ops=_ops(lowered), input_shapes=_shapes(first.inputs), output_shapes=_shapes(first.outputs),
        stats=ErrorStats())
    try:
        for call in calls:
            outs = runner.run(call.key, call.inputs)
            result.stats.add(error_stats(outs, [_to_numpy(o) for o in call.outputs]))
    except Exception as exc:  # noqa: BLE001 - reported in the table
        result.error = f"{type(exc).__name__}: {exc}"
        result.passed = False
        return result
    result.passed = result.stats.within(*thresholds)
    result.worst_node, result.worst_node_stats = worst_node(lowered, first.inputs)
    return result


def _edge_program(program_manager: Any, method: str) -> Any:
    ep_of = getattr(program_manager, "exported_program", None)
    if ep_of is None or not hasattr(program_manager, "to_executorch"):
        raise TypeError("validate needs the EdgeProgramManager that to_edge_transform_and_lower (or "
                        "to_edge(...).to_backend) returned, got "
                        f"{type(program_manager).__name__}; an ExecutorchProgramManager holds out-variant graphs "
                        "eager PyTorch cannot run: pass the edge manager, and the executorch one as pte=")
    return ep_of(method)


def _recorded(ep: Any, samples: list[tuple[Any, ...]]) -> tuple[list[list[Any]], list[list[_Call]]]:
    """Check and run every sample eagerly: (flat outputs per sample, per delegate call its recorded calls)."""
    for i, s in enumerate(samples):
        check_inputs(ep, s, f"sample {i}" if len(samples) > 1 else "")
    refs, per_call = [], []
    for s in samples:
        outs, calls = eager_run(ep, s)
        refs.append(outs)
        if not per_call:
            per_call = [[c] for c in calls]
        else:
            for group, c in zip(per_call, calls, strict=True):
                group.append(c)
    return refs, per_call


# -- public API -----------------------------------------------------------------------------------------------
def validate(program_manager: Any, calibration_inputs: Any, *, atol: float | None = None, rtol: float | None = None,
             sqnr_threshold_db: float = DEFAULT_SQNR_THRESHOLD_DB, method: str = "forward",
             pte: PteSource | None = None) -> ValidationReport:
    """Validate a lowered program numerically, as a whole and per partition.

    ``program_manager``: the ``EdgeProgramManager`` of the lowered program. ``calibration_inputs``: one sample (a
    tuple of tensors) or a list of samples. ``pte``: the program to run on the runtime (bytes, a path or an
    ``ExecutorchProgramManager``); default ``program_manager.to_executorch()``.

    A result passes when its SQNR is at least ``sqnr_threshold_db`` and, where given, its max abs error is at most
    ``atol`` and its max rel error (to the reference's largest magnitude) at most ``rtol``. Raises ``ValueError``
    for inputs that do not fit the program (naming the input and the expected shape and dtype).
    """
    ep = _edge_program(program_manager, method)
    samples = as_samples(calibration_inputs)
    refs, per_call = _recorded(ep, samples)
    thresholds = (atol, rtol, sqnr_threshold_db)
    whole, whole_error, loaded = _run_whole(pte if pte is not None else program_manager.to_executorch(), method,
                                            samples, refs)
    notes = _profile_notes(loaded)
    runner, names = _PartitionRunner(), _lowered_names(ep)
    partitions = [_check_partition(i, calls, runner, names, thresholds) for i, calls in enumerate(per_call)]
    if not per_call:
        notes.append(f"method {method!r} calls no delegate (the program was not lowered, or no partitioner "
                     "took anything): only the whole-program row is shown")
    nested = _nested_delegate_calls(ep)
    if nested:
        notes.append(f"{nested} delegate call(s) inside control-flow submodules are covered by the whole-program "
                     "row only")
    return ValidationReport(whole, not whole_error and whole.within(*thresholds), partitions, len(samples),
                            atol, rtol, sqnr_threshold_db, notes, whole_error)


def bisect(program_manager: Any, inputs: Any, *, threshold_db: float = DEFAULT_SQNR_THRESHOLD_DB,
           atol: float | None = None, rtol: float | None = None,
           method: str = "forward") -> PartitionValidation | None:
    """The first partition, in execution order, whose output diverges beyond the thresholds when it runs alone on
    the exact inputs it gets in the eager reference run (so errors of earlier partitions do not accumulate);
    ``None`` when every partition is within them. Stops at the first diverging partition."""
    ep = _edge_program(program_manager, method)
    _, per_call = _recorded(ep, as_samples(inputs))
    runner, names = _PartitionRunner(), _lowered_names(ep)
    for i, calls in enumerate(per_call):
        result = _check_partition(i, calls, runner, names, (atol, rtol, threshold_db))
        if not result.passed:
            return result
    return None


def validate_program(pte: PteSource, reference: Callable[..., Any], calibration_inputs: Any, *,
                     atol: float | None = None, rtol: float | None = None,
                     sqnr_threshold_db: float = DEFAULT_SQNR_THRESHOLD_DB, method: str = "forward") -> ValidationReport:
    """Whole-program validation only: ``pte`` on edgeport's runtime against ``reference(*inputs)`` in eager torch
    (e.g. the original ``nn.Module``). Per-partition rows need the lowered program: use :func:`validate`."""
    import torch

    samples = as_samples(calibration_inputs)
    with torch.no_grad():
        refs = [_leaves(reference(*s)) for s in samples]
    meta = None
    try:
        meta = _load(pte, method).metadata
    except Exception:  # noqa: BLE001,S110 - reported by _run_whole below
        pass
    if meta is not None:
        _check_against_meta(meta, samples)
    whole, whole_error, loaded = _run_whole(pte, method, samples, refs)
    thresholds = (atol, rtol, sqnr_threshold_db)
    notes = [*_profile_notes(loaded), "per-partition rows need the lowered program: give an EdgeProgramManager (edgeport.devtools.validate, "
             "or a --reference factory returning one)"]
    return ValidationReport(whole, not whole_error and whole.within(*thresholds), [], len(samples), atol, rtol,
                            sqnr_threshold_db, notes, whole_error)


def _check_against_meta(meta: Any, samples: list[tuple[Any, ...]]) -> None:
    """Check samples against a loaded method's declared inputs (count; a tensor's dtype, rank and sizes, which
    for a dynamic input are upper bounds)."""
    infos = list(meta.inputs)
    for si, s in enumerate(samples):
        flat = [_to_numpy(x) for x in _leaves(s)]
        at = f"sample {si}: " if len(samples) > 1 else ""
        if len(flat) != len(infos):
            raise ValueError(f"{at}the program takes {len(infos)} inputs, got {len(flat)}")
        for i, (x, info) in enumerate(zip(flat, infos, strict=True)):
            shape = getattr(info, "shape", None)
            if shape is None or not isinstance(x, np.ndarray):
                continue
            want = f"shape {list(shape)}{' (upper bounds)' if info.dynamic else ''} {info.dtype}"
            fits = (x.dtype == info.dtype and x.ndim == len(shape)
                    and all((s <= d) if info.dynamic else (s == d) for d, s in zip(shape, x.shape, strict=True)))
            if not fits:
                raise ValueError(f"{at}input {i}: expected {want}, got shape {list(x.shape)} {x.dtype}")
