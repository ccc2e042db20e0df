"""Planned memory of a method: the value-slot layout, the arenas, and the execution contexts built on them.

Each context owns one zero-initialised ``uint8`` arena per ``memory_id``; every planned tensor value is a numpy
view into its arena at its planned offset, shaped with its planned (for dynamic shapes: upper-bound) sizes and
laid out in its ``dim_order``. A planned dynamic tensor also has a "capacity" slot that keeps the upper-bound
view (kernels receive it as their out argument) while the value slot holds a view with the actual shape.
The output of a delegate call run as a view (:mod:`._views`) has no memory of its own: its slot is a reshaped view
of the call's input. The out tensor of a persistent expand (:mod:`._kvexpand`) has memory of its own outside the
arenas, and its tracker a slot of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from edgeport.errors import RuntimeExecutionError
from edgeport.program import schema as S
from edgeport.runtime._kvexpand import ExpandTracker
from edgeport.runtime._values import MethodValues, empty_view, logical_view

__all__ = ["Context", "MemoryLayout"]


class Context:
    """The memory of one run: the arenas and the value slots (views into them, scalars, lists)."""

    __slots__ = ("arenas", "vals")

    def __init__(self, arenas: list[np.ndarray], vals: list[Any]) -> None:
        self.arenas = arenas
        self.vals = vals


class MemoryLayout:
    """Where each value lives in a context: one slot per value, then the extra slots.

    ``capacity`` maps a planned dynamic tensor to its upper-bound slot, ``tensorlist_capacity`` a tensor list
    over such tensors to the list of their upper-bound views; ``none_slot`` is always ``None`` (given for
    optional out arguments nobody reads). ``template`` holds the objects every context starts from
    (:meth:`MethodValues.static_template`, after constant folding).
    """

    def __init__(self, mv: MethodValues, template: list[Any], views: Iterable[tuple[int, int]] = (),
                 persistent: Iterable[tuple[tuple[int, int], int]] = ()) -> None:
        self.mv = mv
        self.template = template
        #: (input, output) of delegate calls run as views: the output's slot is a reshaped view of the input's
        self.views = [(i, o, mv.specs[o].sizes) for i, o in views]
        self.num_values = len(mv.values)
        self.capacity: dict[int, int] = {}
        slot = self.num_values
        for i, sp in mv.specs.items():
            if sp.dynamic and sp.mem_id:
                self.capacity[i] = slot
                slot += 1
        self.tensorlist_capacity: dict[int, int] = {}
        for i, ev in enumerate(mv.values):
            if mv.kinds[i] is S.TensorList and any(j in self.capacity for j in ev.val.items):
                self.tensorlist_capacity[i] = slot
                slot += 1
        #: persistent expands (:mod:`._kvexpand`): (chain, instruction) -> the slot of its tracker; their out
        #: tensors get memory of their own, outside the arenas
        self.tracker_slot: dict[tuple[int, int], int] = {}
        self.private: list[int] = []
        for at, out in persistent:
            self.tracker_slot[at] = slot
            self.private.append(out)
            slot += 1
        self.none_slot = slot
        self.num_slots = slot + 1

    def arena_extent(self) -> list[int]:
        """Bytes each arena needs: up to the end of its highest planned tensor (never more than declared)."""
        sizes = self.mv.arena_sizes
        need = [0] * len(sizes)
        for sp in self.mv.specs.values():
            if sp.mem_id:
                need[sp.mem_id] = max(need[sp.mem_id], sp.offset + sp.nbytes)
        return [min(n, size) for n, size in zip(need, sizes)]

    def new_context(self) -> Context:
        """Fresh arenas (planned tensors at their initial data, else zero) and the value slots over them."""
        try:
            return self._new_context()
        except (MemoryError, ValueError, OverflowError) as exc:
            raise RuntimeExecutionError(f"{self.mv.where}: cannot allocate the method's memory: {exc}") from exc

    def _new_context(self) -> Context:
        mv, capacity = self.mv, self.capacity
        arenas = [np.zeros(0, np.uint8)] + [np.zeros(size, dtype=np.uint8) for size in self.arena_extent()[1:]]
        vals: list[Any] = list(self.template) + [None] * (self.num_slots - self.num_values)
        for i, sp in mv.specs.items():
            if sp.constant is not None:
                continue
            if sp.mem_id:
                view = logical_view(arenas[sp.mem_id], sp, sp.offset) if sp.nbytes else empty_view(sp)
                if sp.initial is not None:
                    np.copyto(view, logical_view(np.frombuffer(sp.initial, np.uint8), sp))
            else:
                view = empty_view(sp)  # unplanned: private memory, replaced when an input binds it
            vals[i] = view
            if i in capacity:
                vals[capacity[i]] = view
        for i in self.private:  # C-ordered, statically planned (runtime._kvexpand)
            sp = mv.specs[i]
            vals[i] = np.zeros(tuple(sp.sizes), dtype=sp.dtype)
        for slot in self.tracker_slot.values():
            vals[slot] = ExpandTracker()
        for i, o, sizes in self.views:
            vals[o] = vals[i].reshape(sizes)  # C-ordered, statically planned: a view of the same memory
        for i, ev in enumerate(mv.values):
            k = mv.kinds[i]
            if k is S.TensorList:
                vals[i] = [vals[j] for j in ev.val.items]
                if i in self.tensorlist_capacity:
                    vals[self.tensorlist_capacity[i]] = [vals[capacity.get(j, j)] for j in ev.val.items]
            elif k is S.OptionalTensorList:
                vals[i] = [None if j < 0 else vals[j] for j in ev.val.items]
        return Context(arenas, vals)
