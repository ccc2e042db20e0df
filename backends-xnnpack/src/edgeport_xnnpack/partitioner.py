"""XnnpackPartitioner: the core capability partitioner driven by XnnpackBackend's one table.

Beyond the table's per-node constraints it checks what needs the program's signature: convolution, linear and
batch-norm parameters must be constants (XNNPACK packs weights when a runtime is created). Every rejected node's
reason is in :attr:`rejections` after :meth:`partition`.

Quantized graphs: a parameter may also be a ``dequantize`` of constants (an int8 weight with its scales), and a
``dequantize`` node is taken only when it reads constants or a quantize node that is taken too, so a delegate
never receives an int8 input.
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
from edgeport_xnnpack.capabilities import ALL_CAPABILITIES, BACKEND_ID, register_quantized_ops
from edgeport_xnnpack.options import XnnpackCompileOptions

# op -> argument positions that must be constants (None = optional argument, allowed to be absent)
_CONSTANT_ARGS = {
    "aten.convolution.default": (1, 2),
    "aten.linear.default": (1, 2),
    "aten._native_batch_norm_legit_no_training.default": (1, 2, 3, 4),
}
register_quantized_ops()
_Q = "quantized_decomposed.quantize_per_tensor.default"
_DQ = ("quantized_decomposed.dequantize_per_tensor.default", "quantized_decomposed.dequantize_per_channel.default")


class XnnpackPartitioner(CapabilityBasedPartitioner):
    """Delegates what :data:`~edgeport_xnnpack.capabilities.ALL_CAPABILITIES` supports to ``XnnpackBackend``.

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
        super().__init__(BACKEND_ID, ALL_CAPABILITIES, specs, min_partition_size=min_partition_size,
                         node_filter=node_filter)
        self._user_filter = node_filter
        self._constants: set[str] = set()

    def _is_constant(self, a: object) -> bool:
        return isinstance(a, torch.fx.Node) and (
            (a.op == "placeholder" and a.name in self._constants) or a.op == "get_attr")

    def _is_static(self, a: object) -> bool:
        """A constant, or a dequantize of constants (a quantized weight)."""
        if self._is_constant(a):
            return True
        return (isinstance(a, torch.fx.Node) and a.op == "call_function" and op_name(a.target) in _DQ
                and all(self._is_constant(x) for x in a.all_input_nodes) and self.check_node(a) is None)

    def _filter(self, node: torch.fx.Node) -> bool | str | None:
        name = op_name(node.target)
        for i in _CONSTANT_ARGS.get(name, ()):
            a = node.args[i] if i < len(node.args) else None
            if a is None:
                continue
            if not self._is_static(a):
                what = getattr(a, "name", a)
                return f"{name}: argument {i} ({what}) is not a constant (weights must be static)"
        if name in _DQ:
            src = node.args[0]
            if not self._is_constant(src) and not (
                isinstance(src, torch.fx.Node) and src.op == "call_function" and op_name(src.target) == _Q
                and self.check_node(src) is None
            ):
                return f"{name}: reads {getattr(src, 'name', src)}, neither a constant nor a delegated quantize"
            if name == _DQ[1] and not all(self._is_constant(x) for x in node.all_input_nodes):
                return f"{name}: per-channel dequantize of non-constants"
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
