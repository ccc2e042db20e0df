"""ExecuTorch's primitive ops on symbolic scalars (dynamic shapes) and views: ``executorch_prim::*``,
``aten::sym_size.int``, ``aten::sym_numel``."""

from __future__ import annotations

import math
import operator

import numpy as np

from edgeport.errors import RuntimeExecutionError
from edgeport.runtime.kernel_utils import normalize_dim
from edgeport.runtime.portable._common import kernel
from edgeport.runtime.portable.shape import infer_size


def _floordiv(a, b):
    if b == 0:
        raise RuntimeExecutionError("executorch_prim::floordiv: division by zero")
    return a // b


def _truediv(a, b):
    if b == 0:
        raise RuntimeExecutionError("executorch_prim::truediv: division by zero")
    return a / b


def _mod(a, b):
    if b == 0:
        raise RuntimeExecutionError("executorch_prim::mod: division by zero")
    return a % b


_BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": _floordiv, "truediv": _truediv,
    "mod": _mod, "eq": operator.eq, "gt": operator.gt, "lt": operator.lt, "ge": operator.ge, "le": operator.le,
    "sym_max": max, "sym_min": min,
}
_UNARY = {
    "neg": operator.neg, "ceil": math.ceil, "round": round, "trunc": math.trunc, "sym_float": float,
    "sym_int": int, "sym_not": operator.not_,
}

def _binary(fn, name):
    def prim(a, b):
        return fn(a, b)

    prim.__name__ = f"prim_{name}"
    return prim


def _unary(fn, name):
    def prim(a):
        return fn(a)

    prim.__name__ = f"prim_{name}"
    return prim


for _name, _fn in _BINARY.items():
    kernel(f"executorch_prim::{_name}.Scalar")(_binary(_fn, _name))
kernel("executorch_prim::mod.int")(_binary(_mod, "mod_int"))

for _name, _fn in _UNARY.items():
    kernel(f"executorch_prim::{_name}.Scalar")(_unary(_fn, _name))


@kernel("executorch_prim::sym_ite.Scalar")
def prim_sym_ite(b, t, f):
    return t if b else f


@kernel("aten::sym_size.int")
def sym_size_int(self, dim):
    return int(self.shape[normalize_dim(dim, self.ndim)])


@kernel("aten::sym_numel")
def sym_numel(self):
    return int(self.size)


@kernel("aten::sym_stride.int")
def sym_stride_int(self, dim):
    return int(self.strides[normalize_dim(dim, self.ndim)] // max(self.itemsize, 1))


@kernel("executorch_prim::et_view.default")
def et_view(self, size):
    """A view of ``self``'s memory with ``size`` (ExecuTorch emits it for views of dynamic-shape tensors)."""
    shape = infer_size(size, self.size)
    if not self.flags.c_contiguous:
        raise RuntimeExecutionError("et_view: the source tensor is not contiguous")
    return self.reshape(shape)


def et_copy_index(copy_to, copy_from, index):
    """``copy_to[index] = copy_from``, growing ``copy_to``'s leading dim to ``index + 1`` (torch.map loops)."""
    shape = (index + 1,) + tuple(copy_from.shape)
    n = int(np.prod(shape))
    base = copy_to.reshape(-1) if copy_to.flags.c_contiguous else None
    if base is None or n > base.size:
        if copy_to.shape[0] <= index:
            raise RuntimeExecutionError(f"et_copy_index: index {index} exceeds the planned size {copy_to.shape}")
        view = copy_to
    else:
        view = base[:n].reshape(shape)
    view[index] = copy_from
    return view


et_copy_index.mutates = (0,)  # the returned view replaces argument 0
kernel("executorch_prim::et_copy_index.tensor")(et_copy_index)
