"""Helpers for kernel authors (the portable library uses them; other kernel libraries may too).

The kernel calling convention of edgeport's runtime
---------------------------------------------------
A kernel registered for ``"ns::op.overload"`` (an out variant, e.g. ``"aten::add.out"``) is called with the
values of the op's schema arguments, in schema order, *including* its out argument(s):

* tensors are numpy arrays; out tensors are preallocated views into the method's planned memory, shaped with
  the planned (for dynamic shapes: upper-bound) shape and dtype;
* ``int``/``float``/``bool``/``str`` scalars are Python values, ``None`` for an absent optional;
* ``int[]`` arguments are tuples of ints, ``Tensor[]`` lists of arrays, ``Tensor?[]`` lists of arrays or ``None``.

The kernel writes its result into the out array(s) and returns them (a tuple for several outs). When the
result is smaller than the planned shape (dynamic shapes), it returns a view of the same memory with the actual
shape — :func:`resize` builds that view. The number of positional parameters of the kernel is how the runtime
splits a ``KernelCall``'s argument list into schema arguments and returned values; a kernel that cannot be
introspected sets ``fn.num_args``.

Optional attributes of a kernel function: ``num_args`` (see above); ``optional_outs``, positions of out
arguments the kernel accepts as ``None`` when the program never reads them (the runtime then skips their
memory, e.g. the indices of ``max_pool2d_with_indices``); ``pure = False`` for kernels whose result is not a
function of their inputs (random numbers), which are never constant-folded at load; ``mutates``, positions of
arguments the kernel replaces by returned values; ``shape_only``, positions of tensor arguments of which the
kernel reads only the shape and dtype (``aten::copy.out``'s ``self``).

Ops that return a value instead of writing an out tensor (``executorch_prim::add.Scalar``,
``aten::sym_size.int``, ``executorch_prim::et_view.default``) return it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from math import prod

import numpy as np

from edgeport.errors import RuntimeExecutionError

__all__ = ["resize", "store", "normalize_dim", "normalize_dims", "check_fits", "broadcast_shape"]


@lru_cache(maxsize=1024)
def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """``np.broadcast_shapes(*shapes)``, cached (a program's shapes repeat every run; bounded)."""
    return np.broadcast_shapes(*shapes)


@lru_cache(maxsize=4096)
def _numel(shape: tuple[int, ...]) -> int:
    """The number of elements of ``shape``, -1 when a size is negative (cached: a program's shapes repeat)."""
    return -1 if shape and min(shape) < 0 else prod(shape)


def resize(out: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """A view of ``out``'s memory with ``shape`` (same dim order); ``out`` itself when the shape is unchanged.

    Raises :class:`RuntimeExecutionError` when ``shape`` needs more elements than the planned buffer holds.
    """
    if type(shape) is not tuple:
        shape = tuple(map(int, shape))
    if out.shape == shape:
        return out
    n = _numel(shape)
    if n > out.size or n < 0:
        if n < 0:
            raise RuntimeExecutionError(f"an output cannot have the negative shape {list(shape)}")
        raise RuntimeExecutionError(
            f"an output needs shape {list(shape)} ({n} elements) but its planned buffer has shape "
            f"{list(out.shape)} ({out.size} elements); the program's upper bounds are too small for this input"
        )
    if out.flags.c_contiguous:  # the common case: a prefix of the planned memory (any rank)
        return out.reshape(-1)[:n].reshape(shape)
    if len(shape) != out.ndim:  # rank changes only for contiguous tensors
        raise RuntimeExecutionError(f"cannot resize a non-contiguous output of rank {out.ndim} to {shape}")
    # non-default dim order: keep the physical order implied by the strides
    order = sorted(range(out.ndim), key=lambda d: (-out.strides[d], d))
    base = _physical_flat(out, order)
    phys_shape = tuple(shape[d] for d in order)
    phys = base[:n].reshape(phys_shape)
    inverse = [0] * len(order)
    for i, d in enumerate(order):
        inverse[d] = i
    return phys.transpose(inverse)


def _physical_flat(out: np.ndarray, order: list[int]) -> np.ndarray:
    phys = out.transpose(order)
    if not phys.flags.c_contiguous:
        raise RuntimeExecutionError("cannot resize an output that is not dense in memory")
    return phys.reshape(-1)


def check_fits(out: np.ndarray, shape: Sequence[int], what: str = "an output") -> None:
    """Raise before computing a result of ``shape`` that cannot fit ``out``'s planned memory (so that a hostile
    size in a program fails fast instead of allocating a huge temporary)."""
    n = prod(int(s) for s in shape)
    if any(int(s) < 0 for s in shape) or n > out.size:
        raise RuntimeExecutionError(
            f"{what} of shape {list(shape)} does not fit its planned buffer of {out.size} elements")


def store(out: np.ndarray, value: object) -> np.ndarray:
    """Copy ``value`` (an array or scalar) into ``out``, resizing for dynamic shapes; returns the written view."""
    if isinstance(value, np.ndarray):
        if value.shape != out.shape:
            out = resize(out, value.shape)
        np.copyto(out, value, casting="unsafe")
        return out
    out[...] = value
    return out


def normalize_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise RuntimeExecutionError(f"dimension {dim} is out of range for a tensor of rank {ndim}")
    return dim % n


def normalize_dims(dims: Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """Reduction dims: ``None`` or empty means every dim."""
    if dims is None or len(dims) == 0:
        return tuple(range(ndim))
    return tuple(sorted({normalize_dim(d, ndim) for d in dims}))
