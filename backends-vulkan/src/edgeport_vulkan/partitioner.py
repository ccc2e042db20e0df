"""``VulkanPartitioner``: the core capability partitioner driven by :mod:`edgeport_vulkan.capabilities`.

Every node the table rejects keeps its reason in :attr:`rejections` after :meth:`partition`. Weights of
``convolution`` / ``linear`` / ``layer_norm`` need not be constants (they are ordinary tensors on the device).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.export import ExportedProgram

from edgeport.aot.capability_partitioner import (
    CapabilityBasedPartitioner,
    NodeFilter,
    constant_placeholder_names,
    op_name,
)
from edgeport.aot.partitioner import PartitionResult
from edgeport_vulkan.capabilities import capabilities
from edgeport_vulkan.capabilities_typed import fp16_refusal
from edgeport_vulkan.options import BACKEND_ID, VulkanCompileOptions

_BATCH_NORM = "aten._native_batch_norm_legit_no_training.default"


class VulkanPartitioner(CapabilityBasedPartitioner):
    """Delegates what the Vulkan shader library supports to ``VulkanBackend``.

    ``compile_options``: a :class:`VulkanCompileOptions`, or a dict of ExecuTorch-style options
    (``{"force_fp16": True}``).
    """

    def __init__(self, compile_options: VulkanCompileOptions | dict[str, Any] | None = None, *,
                 min_partition_size: int = 1, node_filter: NodeFilter | None = None) -> None:
        if compile_options is None:
            options = VulkanCompileOptions()
        elif isinstance(compile_options, dict):
            known = {"force_fp16", "require_dynamic_shapes"}
            unknown = sorted(set(compile_options) - known)
            if unknown:
                raise ValueError(f"VulkanPartitioner: unknown compile options {unknown}; known: {sorted(known)}")
            options = VulkanCompileOptions(**compile_options)
        elif isinstance(compile_options, VulkanCompileOptions):
            options = compile_options
        else:
            raise TypeError(f"VulkanPartitioner takes VulkanCompileOptions or a dict, got "
                            f"{type(compile_options).__name__}")
        self.compile_options = options
        self._user_filter = node_filter
        self._constants: set[str] = set()
        super().__init__(BACKEND_ID, capabilities(), options.to_compile_specs(),
                         min_partition_size=min_partition_size, node_filter=self._filter)

    def _filter(self, node: torch.fx.Node) -> bool | str | None:
        if self.compile_options.require_dynamic_shapes:
            return ("require_dynamic_shapes=True: edgeport's Vulkan executor plans static shapes only, so nothing "
                    "is delegated")
        if self.compile_options.force_fp16:
            why = fp16_refusal(node, op_name(node.target))
            if why is not None:
                return why
        if op_name(node.target) == _BATCH_NORM:
            for i in (1, 2, 3, 4):  # weight, bias, running mean / var: folded into a scale and shift at load
                a = node.args[i] if i < len(node.args) else None
                if a is not None and not (isinstance(a, torch.fx.Node) and (
                        a.op == "get_attr" or (a.op == "placeholder" and a.name in self._constants))):
                    return f"{_BATCH_NORM}: argument {i} ({getattr(a, 'name', a)}) is not a constant"
        if self._user_filter is not None:
            return self._user_filter(node)
        return None

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        self._constants = constant_placeholder_names(exported_program)
        return super().partition(exported_program)

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        """Keep ``linear``, ``hardswish``, ``gelu`` and ``max_pool2d`` whole: one shader dispatch each."""
        aten = torch.ops.aten
        return [aten.linear.default, aten.hardswish.default, aten.gelu.default, aten.max_pool2d.default], None
