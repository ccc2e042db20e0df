"""ExampleBackend's partitioner: the core capability partitioner configured with ExampleBackend's table."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.export import ExportedProgram

from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner, NodeFilter
from edgeport.backend import CompileSpec
from edgeport_example.capabilities import BACKEND_ID, CAPABILITIES
from edgeport_example.options import ExampleCompileOptions


class ExamplePartitioner(CapabilityBasedPartitioner):
    """Delegates float32 add/mul/sub/sin/relu/mm/addmm/2-D permute_copy/linear to ``ExampleBackend``.

    ``compile_specs`` may be a list of :class:`CompileSpec` or an :class:`ExampleCompileOptions`; they are
    checked here, so a typo fails before any lowering work.
    """

    def __init__(
        self,
        compile_specs: Sequence[CompileSpec] | ExampleCompileOptions = (),
        *,
        min_partition_size: int = 1,
        node_filter: NodeFilter | None = None,
    ) -> None:
        if isinstance(compile_specs, ExampleCompileOptions):
            specs = compile_specs.to_compile_specs()
        else:
            specs = list(compile_specs)
            ExampleCompileOptions.from_compile_specs(specs)  # raises ValueError on unknown keys
        super().__init__(
            BACKEND_ID, CAPABILITIES, specs, min_partition_size=min_partition_size, node_filter=node_filter
        )

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        """Keep ``aten.linear.default`` whole, so a Linear reaches the backend as one op."""
        return [torch.ops.aten.linear.default], None
