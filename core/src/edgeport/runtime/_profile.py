"""What a loaded method runs on and how its runs went: :class:`MethodProfile` and :class:`DelegateInfo`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DelegateInfo", "MethodProfile"]


@dataclass
class DelegateInfo:
    """How one delegate of a method runs: on its backend's executor or on a portable fallback method."""

    index: int
    backend_id: str
    status: str  # "backend" or "fallback"
    reason: str = ""
    fallback_method: str | None = None
    runtime_options: Any = None  # the backend's RuntimeOptions given at load (backend_options=), if any
    # what actually executes the delegate, from the executor's optional ``describe_execution(handle)`` (e.g. a
    # reference model standing in for an NPU); empty when the executor does not say
    execution: str = ""


@dataclass
class MethodProfile:
    """What a loaded method runs on: the kernel library of each op, each delegate's executor, any fallback.

    A portable fallback taken for an unavailable backend is listed in ``fallbacks`` (and a warning is issued);
    it is never silent. ``runs`` counts completed executions; ``last_run_seconds`` is the last one's wall time.
    """

    method: str
    kernel_libraries: dict[str, str] = field(default_factory=dict)
    overridden_kernels: dict[str, str] = field(default_factory=dict)
    delegates: list[DelegateInfo] = field(default_factory=list)
    num_instructions: int = 0
    folded_instructions: int = 0
    #: kernel calls that copy an earlier call's identical result instead of running (see ``runtime._cse``)
    reused_calls: int = 0
    #: kernel calls folded into a fused operation at load (see ``runtime._fuse``), not run on their own
    fused_calls: int = 0
    #: delegate calls that only reshape, run as views of their input at load (see ``runtime._views``)
    viewed_delegates: int = 0
    #: ``expand_copy`` calls whose result persists across runs, refreshed by rows (see ``runtime._kvexpand``)
    persistent_expands: int = 0
    runs: int = 0
    last_run_seconds: float = 0.0
    #: with ``method.time_ops = True``: seconds and calls per op (kernel name or ``delegate N: backend``)
    op_seconds: dict[str, float] = field(default_factory=dict)
    op_calls: dict[str, int] = field(default_factory=dict)

    @property
    def fallbacks(self) -> list[DelegateInfo]:
        return [d for d in self.delegates if d.status == "fallback"]

    def __getitem__(self, key: str) -> Any:  # dict-style access for quick inspection
        return getattr(self, key)
