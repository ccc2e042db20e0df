"""XnnpackPartitioner: the core capability partitioner driven by XnnpackBackend's one table.

Beyond the table's per-node constraints it checks what needs the program's signature: convolution, linear and
batch-norm parameters must be constants (XNNPACK packs weights when a runtime is created). Every rejected node's
reason is in :attr:`rejections` after :meth:`partition`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.export import ExportedProgram

from edgeport.aot.capability_partitioner import (
    CapabilityBasedPartitioner,
    NodeFilter,
    constant_placeholder_names,
    op_name,
)
from edgeport.aot.partitioner import PartitionResult
from edgeport.backend import CompileSpec
from edgeport_xnnpack.capabilities import BACKEND_ID, CAPABILITIES
from edgeport_xnnpack.options import XnnpackCompileOptions

# op -> argument positions that must be constants (None = optional argument, allowed to be absent)
_CONSTANT_ARGS = {
    "aten.convolution.default": (1, 2),
    "aten.linear.default": (1, 2),
    "aten._native_batch_norm_legit_no_training.default": (1, 2, 3, 4),
}


class XnnpackPartitioner(CapabilityBasedPartitioner):
    """Delegates what :data:`~edgeport_xnnpack.capabilities.CAPABILITIES` supports to ``XnnpackBackend``.

    ``compile_specs`` may be a list of :class:`CompileSpec` or an :class:`XnnpackCompileOptions`.
    """

    def __init__(
        self,
        compile_specs: Sequence[CompileSpec] | XnnpackCompileOptions = (),
        *,
        min_partition_size: int = 1,
        node_filter: NodeFilter | None = None,
    ) -> None:
        if isinstance(compile_specs, XnnpackCompileOptions):
            specs = compile_specs.to_compile_specs()
        else:
            specs = list(compile_specs)
            XnnpackCompileOptions.from_compile_specs(specs)  # raises ValueError on unknown keys
        super().__init__(BACKEND_ID, CAPABILITIES, specs, min_partition_size=min_partition_size,
                         node_filter=node_filter)
        self._user_filter = node_filter
        self._constants: set[str] = set()

    def _filter(self, node: torch.fx.Node) -> bool | str | None:
        positions = _CONSTANT_ARGS.get(op_name(node.target), ())
        for i in positions:
            a = node.args[i] if i < len(node.args) else None
            if a is None:
                continue
            if not isinstance(a, torch.fx.Node) or not (
                (a.op == "placeholder" and a.name in self._constants) or a.op == "get_attr"
            ):
                name = getattr(a, "name", a)
                return f"{op_name(node.target)}: argument {i} ({name}) is not a constant (weights must be static)"
        if self._user_filter is not None:
            return self._user_filter(node)
        return None

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        self._constants = constant_placeholder_names(exported_program)
        self.node_filter = self._filter
        try:
            return super().partition(exported_program)
        finally:
            self.node_filter = self._user_filter

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        """Keep ``linear`` and ``hardswish`` whole so they reach the backend as one node each."""
        return [torch.ops.aten.linear.default, torch.ops.aten.hardswish.default], None
