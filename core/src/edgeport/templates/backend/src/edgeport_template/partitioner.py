"""TemplateBackend's partitioner: edgeport's capability partitioner configured with this backend's table."""

from __future__ import annotations

from collections.abc import Sequence

from edgeport import CapabilityBasedPartitioner, CompileSpec
from edgeport_template.capabilities import BACKEND_ID, CAPABILITIES
from edgeport_template.options import TemplateCompileOptions


class TemplatePartitioner(CapabilityBasedPartitioner):
    """Tags the float32 add/mul/relu/pad nodes of a program for ``TemplateBackend``.

    Args:
        compile_options: a :class:`TemplateCompileOptions` or a list of ``CompileSpec`` (checked here, so a typo
            fails before any lowering work); ``None`` for the defaults.
        min_partition_size: partitions with fewer compute nodes stay on the portable kernels.
        node_filter: an extra per-node veto (``False`` or a reason string rejects the node).

    After ``partition``, ``rejections`` says why each node was not delegated.
    """

    def __init__(
        self,
        compile_options: TemplateCompileOptions | Sequence[CompileSpec] | None = None,
        *,
        min_partition_size: int = 1,
        node_filter=None,
    ) -> None:
        if compile_options is None:
            compile_options = TemplateCompileOptions()
        elif not isinstance(compile_options, TemplateCompileOptions):
            compile_options = TemplateCompileOptions.from_compile_specs(list(compile_options))
        self.compile_options = compile_options
        super().__init__(
            BACKEND_ID,
            CAPABILITIES,
            compile_options.to_compile_specs(),
            min_partition_size=min_partition_size,
            node_filter=node_filter,
        )
