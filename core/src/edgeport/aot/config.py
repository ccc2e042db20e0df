"""Configuration objects of the AOT pipeline (ExecuTorch's ``EdgeCompileConfig`` / ``ExecutorchBackendConfig``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from edgeport.errors import SerializationError


@dataclass
class EdgeCompileConfig:
    """Options of the ATen → edge conversion.

    ``_check_ir_validity`` runs the edge verifier after conversion and after each transform.
    ``_skip_type_promotion`` is accepted for compatibility; edgeport keeps torch's type promotion as exported.
    ``_core_aten_ops_exception_list`` lists non-core ops allowed to stay in the graph (like ExecuTorch).
    ``preserve_ops`` are kept whole during decomposition (in addition to what partitioners ask for).
    """

    _check_ir_validity: bool = True
    _skip_type_promotion: bool = False
    _skip_dim_order: bool = False
    _core_aten_ops_exception_list: list[torch._ops.OpOverload] = field(default_factory=list)
    preserve_ops: list[torch._ops.OpOverload] = field(default_factory=list)


def _check_power_of_two(name: str, value: int | None) -> None:
    if value is None:
        return
    if not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise SerializationError(f"ExecutorchBackendConfig.{name} must be a positive power of two, got {value!r}")


@dataclass
class ExecutorchBackendConfig:
    """Options of the edge → program step (``EdgeProgramManager.to_executorch``).

    ``passes`` run first, on the edge graph. ``memory_planning_pass`` is any callable taking the list of
    :class:`edgeport.aot.memory_planning.TensorLifetime` objects and returning one offset per tensor (see
    ``GreedyMemoryPlanner``, the default). Alignments are powers of two. ``portable_fallbacks`` also writes, for
    every delegate, a method ``<method>__fallback_<n>`` that computes the partition with portable kernels, and
    names it in the delegate's ``edgeport.portable_fallback`` compile spec, so a runtime without the backend can
    run the program when the caller allows it (``load_method(..., allow_fallback=True)``).
    ``external_constants`` (ExecuTorch's name and meaning) moves constants out of the program into ``.ptd`` data
    files: ``True`` moves every parameter and buffer to ``_default_external_constant.ptd``; a callable maps each
    constant's placeholder node to a file tag (``<tag>.ptd``) or ``None`` (stays in the program). Write the files
    with ``ExecutorchProgramManager.write_tensor_data_to_file(outdir)``; load with
    ``Runtime.get().load_program(pte, data_path=...)``.
    """

    passes: Sequence[Callable[..., Any]] = field(default_factory=list)
    memory_planning_pass: Callable[..., Any] | None = None
    emit_stacktrace: bool = False
    extract_delegate_segments: bool = True
    extract_constant_segment: bool = True
    segment_alignment: int = 128
    constant_tensor_alignment: int | None = None
    delegate_alignment: int | None = None
    memory_alignment: int = 16
    portable_fallbacks: bool = False
    external_constants: bool | Callable[[Any], str | None] = False

    def __post_init__(self) -> None:
        _check_power_of_two("segment_alignment", self.segment_alignment)
        _check_power_of_two("constant_tensor_alignment", self.constant_tensor_alignment)
        _check_power_of_two("delegate_alignment", self.delegate_alignment)
        _check_power_of_two("memory_alignment", self.memory_alignment)
        if not (isinstance(self.external_constants, bool) or callable(self.external_constants)):
            raise ValueError("external_constants must be True, False or a callable (node -> file tag or None), "
                             f"got {self.external_constants!r}")
