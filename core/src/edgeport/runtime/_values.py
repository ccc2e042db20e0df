"""Load-time reading and verification of a method's values.

Every tensor value becomes a :class:`TensorSpec` (dtype, sizes, dim order, planned placement or constant data,
the latter as a zero-copy read-only view of the program's constant segment); scalars and lists become the
Python objects kernels receive (:meth:`MethodValues.static_template`).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from edgeport.errors import ProgramError
from edgeport.program import schema as S

__all__ = ["MethodValues", "TensorInfo", "TensorSpec", "empty_view", "logical_view"]


@dataclass(frozen=True)
class TensorInfo:
    """Dtype and shape of a method input or output (``shape`` is the upper bound when ``dynamic``)."""

    dtype: np.dtype
    shape: tuple[int, ...]
    dynamic: bool = False
    memory_planned: bool = True
    dim_order: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize

    # executorch.runtime.TensorInfo-style accessors
    def sizes(self) -> tuple[int, ...]:
        return self.shape

    def is_memory_planned(self) -> bool:
        return self.memory_planned


@dataclass
class TensorSpec:
    """One tensor value of a method, as the program declares it."""

    index: int
    dtype: np.dtype
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    dynamic: bool
    mem_id: int  # 0: not planned
    offset: int
    nbytes: int
    constant: np.ndarray | None = None
    initial: memoryview | None = None  # initial data of a planned (mutable) tensor

    @property
    def contiguous_order(self) -> bool:
        return self.dim_order == tuple(range(len(self.sizes)))


def _in_logical_order(arr: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """``arr``, laid out in ``spec``'s dim order, seen with the logical dimension order."""
    if spec.contiguous_order:
        return arr
    inverse = [0] * len(spec.dim_order)
    for pos, d in enumerate(spec.dim_order):
        inverse[d] = pos
    return arr.transpose(inverse)


def logical_view(flat_or_buf: Any, spec: TensorSpec, offset: int = 0) -> np.ndarray:
    """A view of ``spec``'s tensor stored in ``flat_or_buf`` at byte ``offset``."""
    phys = tuple(spec.sizes[d] for d in spec.dim_order)
    return _in_logical_order(np.ndarray(phys, dtype=spec.dtype, buffer=flat_or_buf, offset=offset), spec)


def empty_view(spec: TensorSpec) -> np.ndarray:
    """A zero-filled tensor of ``spec`` in private memory."""
    phys = tuple(spec.sizes[d] for d in spec.dim_order)
    return _in_logical_order(np.zeros(phys, dtype=spec.dtype), spec)


class MethodValues:
    """The values of one execution plan: the kind of each, the spec of each tensor, list items.

    ``lp`` is the :class:`~edgeport.program.reader.LoadedPte` the plan comes from (constant and mutable data).
    Every defect raises ``ProgramError`` naming the value.
    """

    def __init__(self, plan: S.ExecutionPlan, lp: Any, where: str) -> None:
        self.where = where
        self.values = plan.values
        self.kinds: list[type] = [type(v.val) for v in self.values]
        self.arena_sizes = list(plan.non_const_buffer_sizes)  # entry 0 is reserved (never allocated)
        self.specs: dict[int, TensorSpec] = {}
        for i, ev in enumerate(self.values):
            if self.kinds[i] is S.Tensor:
                self.specs[i] = self._read_tensor(i, ev.val, lp)

    def err(self, msg: str) -> ProgramError:
        return ProgramError(f"{self.where}: {msg}")

    def items(self, idx: int) -> Any:
        """The value indices of list value ``idx`` (``-1`` for ``None`` in an optional tensor list)."""
        return self.values[idx].val.items

    def tensor_items(self, idx: int) -> list[int]:
        """The tensors value ``idx`` stands for: itself, the tensors of a tensor list, or none."""
        k = self.kinds[idx]
        if k is S.Tensor:
            return [idx]
        if k in (S.TensorList, S.OptionalTensorList):
            return [j for j in self.items(idx) if j >= 0 and self.kinds[j] is S.Tensor]
        return []

    def static_template(self) -> list[Any]:
        """One object per value slot: scalars, scalar lists and constant tensors; ``None`` for the rest (filled
        per execution context)."""
        kinds, specs = self.kinds, self.specs
        tpl: list[Any] = [None] * len(self.values)
        for i, ev in enumerate(self.values):
            k = kinds[i]
            v = ev.val
            if k is S.Int:
                tpl[i] = int(v.int_val)
            elif k is S.Double:
                tpl[i] = float(v.double_val)
            elif k is S.Bool:
                tpl[i] = bool(v.bool_val)
            elif k is S.String:
                tpl[i] = v.string_val
            elif k is S.DoubleList:
                tpl[i] = tuple(float(x) for x in v.items)
            elif k is S.BoolList:
                tpl[i] = tuple(bool(x) for x in v.items)
            elif k is S.Tensor and specs[i].constant is not None:
                tpl[i] = specs[i].constant
        for i, ev in enumerate(self.values):
            if kinds[i] is S.IntList:
                tpl[i] = tuple(tpl[j] for j in ev.val.items)
        return tpl

    def _read_tensor(self, i: int, t: S.Tensor, lp: Any) -> TensorSpec:
        at = f"values[{i}]"
        arenas = self.arena_sizes
        try:
            dtype = S.numpy_dtype(t.scalar_type)
        except ValueError as exc:
            raise self.err(f"{at}: {exc}") from None
        sizes = tuple(int(s) for s in t.sizes)
        dim_order = tuple(int(d) for d in t.dim_order) if len(t.dim_order) else tuple(range(len(sizes)))
        if sorted(dim_order) != list(range(len(sizes))):
            raise self.err(f"{at}: dim_order {list(dim_order)} does not match sizes {list(sizes)}")
        nbytes = prod(sizes) * dtype.itemsize
        dynamic = int(t.shape_dynamism) != 0
        spec = TensorSpec(i, dtype, sizes, dim_order, dynamic, 0, 0, nbytes)
        if t.allocation_info is not None:
            info = t.allocation_info
            mem_id = info.memory_id
            offset = info.memory_offset_low | (info.memory_offset_high << 32)
            if not 1 <= mem_id < len(arenas):
                raise self.err(f"{at}: memory_id {mem_id} out of range (non_const_buffer_sizes {arenas})")
            if offset + nbytes > arenas[mem_id]:
                raise self.err(f"{at}: planned memory [{offset}, {offset + nbytes}) runs past arena "
                               f"{mem_id} ({arenas[mem_id]} bytes)")
            if offset % dtype.itemsize:
                raise self.err(f"{at}: planned offset {offset} is not aligned to its {dtype} elements "
                               f"({dtype.itemsize} bytes)")
            spec.mem_id, spec.offset = mem_id, offset
            if t.data_buffer_idx > 0:
                spec.initial = lp.tensor_data(t, where=f"{self.where} {at}")
        elif (t.extra_tensor_info is not None
              and int(t.extra_tensor_info.location) == int(S.TensorDataLocation.EXTERNAL)):
            spec.constant = self._constant_view(lp.external_tensor(t, where=f"{self.where} {at}"), spec, at)
        elif t.data_buffer_idx > 0:
            data = lp.tensor_data(t, where=f"{self.where} {at}")
            spec.constant = self._constant_view(data, spec, at)
        return spec

    def _constant_view(self, data: memoryview, spec: TensorSpec, at: str) -> np.ndarray:
        if len(data) < spec.nbytes:
            raise self.err(f"{at}: constant needs {spec.nbytes} bytes, its buffer has {len(data)}")
        if spec.nbytes == 0:
            return empty_view(spec)
        arr = np.frombuffer(data, dtype=np.uint8, count=spec.nbytes)
        if arr.ctypes.data % spec.dtype.itemsize:
            arr = arr.copy()  # misaligned in memory: keep a private aligned copy
        view = logical_view(arr, spec)
        if view.flags.writeable:
            view.flags.writeable = False
        return view
