"""Argument handling of ``XnnpackExecutor.execute`` (torch-free): the inputs as float32 arrays (declared dims,
or other shapes for the specializer to check) and the arrays the outputs are computed into."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeport.errors import RuntimeExecutionError
from edgeport_xnnpack.capabilities import BACKEND_ID

if TYPE_CHECKING:
    from edgeport_xnnpack._specialize import Plan
    from edgeport_xnnpack._steps import XnnpackHandle

_F32 = np.dtype(np.float32)


def same_but_unit_dims(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    """Whether ``shape`` and ``dims`` differ only by size-1 dimensions (same elements in the same order: a view).

    ExecuTorch's runtime hands a lifted scalar constant to the delegate as a 0-d tensor where the blob declares
    ``[1]``; its XNNPACK delegate reshapes external values per call, so it accepts that, and so do we.
    """
    return tuple(d for d in shape if d != 1) == tuple(d for d in dims if d != 1)


def input_arrays(handle: XnnpackHandle, inputs: Sequence[Any]) -> tuple[list[np.ndarray], bool]:
    """The inputs as C-contiguous float32 arrays, and whether all have the declared dims (an input differing
    only by size-1 dims is reshaped to them). Other shapes are left for the specializer to check."""
    arrays = []
    declared = True
    k = 0
    for _, dims in handle.inputs:
        a = inputs[k]
        if type(a) is not np.ndarray:
            a = np.asarray(a)
        if a.dtype is not _F32 and a.dtype != _F32:
            raise RuntimeExecutionError(f"{BACKEND_ID}: input {k} must be float32 of shape {list(dims)}, "
                                        f"got {a.dtype} {list(a.shape)}")
        if a.shape != dims:
            if same_but_unit_dims(a.shape, dims):  # e.g. ExecuTorch's 0-d lifted scalar where the blob says [1]
                a = a.reshape(dims)
            else:
                declared = False
                handle.specializer.check(k, a.shape)  # raises the expected shape for out-of-bound inputs
        arrays.append(a if a.flags.c_contiguous else np.ascontiguousarray(a))
        k += 1
    return arrays, declared


def results_for(plan: XnnpackHandle | Plan, out: Sequence[np.ndarray | None] | None) -> list[np.ndarray]:
    """The arrays the outputs are computed into: ``out``'s entries (checked), fresh arrays for ``None``; ``out``
    itself when it is a list without ``None`` entries of the right shapes (the runtime's call, checked inline)."""
    outputs = plan.outputs
    if type(out) is list and len(out) == len(outputs):
        k = 0
        for _, dims in outputs:
            a = out[k]
            if type(a) is not np.ndarray or a.dtype is not _F32 or a.shape != dims:
                return _outputs(plan, out)  # None entries, or raises
            f = a.flags
            if not (f.c_contiguous and f.writeable):
                return _outputs(plan, out)  # raises
            k += 1
        return out
    return _outputs(plan, out)


def _prefix_view(a: Any, dims: tuple[int, ...]) -> np.ndarray | None:
    """``dims`` over the first elements of ``a`` -- the runtime's planned array at its upper bound (same rank,
    every dim at least as large) for an output of a specialization with smaller dims -- or None when ``a`` is not
    such an array: the result is then computed in place."""
    if type(a) is not np.ndarray or a.dtype is not _F32 or not (a.flags.c_contiguous and a.flags.writeable):
        return None
    if a.ndim != len(dims) or any(d > b for d, b in zip(dims, a.shape)):
        return None
    n = 1
    for d in dims:
        n *= d
    return a.reshape(-1)[:n].reshape(dims)


def _outputs(plan: XnnpackHandle | Plan, out: Sequence[np.ndarray | None] | None) -> list[np.ndarray]:
    if out is None:
        return [np.empty(dims, np.float32) for _, dims in plan.outputs]
    if type(out) is list and len(out) == len(plan.outputs) and not hasattr(plan, "specializer"):  # a specialization
        views = [_prefix_view(a, dims) for a, (_, dims) in zip(out, plan.outputs)]
        if all(v is not None for v in views):
            return views  # type: ignore[return-value]
    if len(out) != len(plan.outputs):
        raise RuntimeExecutionError(f"{BACKEND_ID}: out has {len(out)} entries, the delegate has "
                                    f"{len(plan.outputs)} outputs")
    results = out if type(out) is list else list(out)
    k = 0
    for _, dims in plan.outputs:
        a = out[k]
        if a is None:
            if results is out:
                results = list(out)
            results[k] = np.empty(dims, np.float32)
        elif type(a) is not np.ndarray or a.dtype is not _F32 and a.dtype != _F32 or a.shape != dims \
                or not (a.flags.c_contiguous and a.flags.writeable):
            got = (f"{a.dtype} {list(a.shape)}, C-contiguous={a.flags.c_contiguous}, writeable={a.flags.writeable}"
                   if isinstance(a, np.ndarray) else type(a).__name__)
            raise RuntimeExecutionError(f"{BACKEND_ID}: out[{k}] must be a writable C-contiguous float32 array of "
                                        f"shape {list(dims)}, got {got}")
        k += 1
    return results
