"""``CoreMLPartitioner``: the core capability partitioner driven by the Core ML table (ExecuTorch's arguments).

A node is delegated when the table accepts it (op, dtypes, constraint), it is not in
``skip_ops_for_coreml_delegation``, and coremltools' own ``is_torch_fx_node_supported`` agrees. Every rejected
node's reason is in :attr:`rejections` after :meth:`partition`. ``lower_full_graph=True`` raises
``LoweringError`` on the first node (in graph order) that would stay outside Core ML.

``take_over_constant_data`` and ``take_over_mutable_buffer`` are accepted with ExecuTorch's defaults and checks.
In edgeport weights always end up inside the delegate (a constant the core leaves untagged is duplicated into
each delegate that reads it), so ``take_over_constant_data=False`` changes nothing. ``take_over_mutable_buffer``
(default ``True``) hands a mutated buffer to the partition that reads it and computes its new value, when the
deployment target has Core ML state (iOS18 and newer): the buffer becomes a state of the Core ML model and leaves
the program (the core's capability partitioner option of the same name). Below iOS18 the buffer stays a program
buffer, read and written around the delegate.

Each partition is converted by coremltools as it is tagged (``verify_conversion=True``, the default; the result
is cached, so ``preprocess`` does not convert it again): when coremltools fails, the node that makes it fail is
rejected with coremltools' words (:mod:`edgeport_coreml.verify`) and the graph is tagged again, so a conversion
failure shrinks the partition instead of failing the lowering. After ``max_refusals`` such rounds, every node of a
partition that still fails is rejected.

pt2e ``quantize_per_tensor`` / ``dequantize_per_tensor`` / ``dequantize_per_channel`` nodes are claimed by the
table's own rules (coremltools converts them as patterns and its probe says no); activation quantization needs an
iOS17+ target, per-channel dequantization constant inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner, op_name
from edgeport.aot.partitioner import PartitionResult
from edgeport.backend import CompileSpec
from edgeport.errors import LoweringError
from edgeport_coreml.capabilities import KNOWN_BAD, QUANT_OPS, capabilities
from edgeport_coreml.options import COREML_BACKEND_ID, CoreMLCompileSpec
from edgeport_coreml.verify import refuse_unconvertible


def _frontend_supports(node: torch.fx.Node) -> bool | None:
    try:
        from coremltools.converters.mil.frontend.torch import is_torch_fx_node_supported
    except ImportError:
        return None
    try:
        return bool(is_torch_fx_node_supported(node))
    except Exception:  # noqa: BLE001 - the probe itself failing means "not supported"
        return False


class CoreMLPartitioner(CapabilityBasedPartitioner):
    """Delegates what coremltools converts to ``CoreMLBackend``.

    ``compile_specs``: a list of ``CompileSpec`` (``CoreMLBackend.generate_compile_specs(...)``) or a
    :class:`~edgeport_coreml.options.CoreMLCompileSpec`; ``None`` means ExecuTorch's defaults (all compute
    units, float16, ``.mlpackage``).
    """

    def __init__(self, compile_specs: Sequence[CompileSpec] | CoreMLCompileSpec | None = None, *,
                 skip_ops_for_coreml_delegation: Sequence[str] | None = None, lower_full_graph: bool = False,
                 take_over_mutable_buffer: bool = True, take_over_constant_data: bool = True,
                 min_partition_size: int = 1, verify_conversion: bool = True, max_refusals: int = 8) -> None:
        if isinstance(compile_specs, CoreMLCompileSpec):
            options = compile_specs
        else:
            options = CoreMLCompileSpec.from_compile_specs(list(compile_specs or []))
        skip = [str(s) for s in (skip_ops_for_coreml_delegation or [])]
        if lower_full_graph:
            if skip:
                raise ValueError("lower_full_graph=True lowers every node: skip_ops_for_coreml_delegation must be "
                                 "empty")
            if not take_over_constant_data or not take_over_mutable_buffer:
                raise ValueError("lower_full_graph=True needs take_over_constant_data=True and "
                                 "take_over_mutable_buffer=True")
        specs = list(compile_specs) if isinstance(compile_specs, (list, tuple)) else options.to_compile_specs()
        super().__init__(COREML_BACKEND_ID, capabilities(), specs, min_partition_size=min_partition_size,
                         node_filter=self._filter)
        self.compile_options = options
        self.skip_ops_for_coreml_delegation = skip
        self.lower_full_graph = lower_full_graph
        #: the core partitioner's switch: only targets with Core ML state can own a buffer
        self.take_over_mutable_buffer = take_over_mutable_buffer and options.deployment_target_value >= 9
        self.take_over_constant_data = take_over_constant_data
        self.verify_conversion = verify_conversion
        self.max_refusals = max_refusals
        self._constants: set[str] = set()
        self._refused: dict[str, str] = {}  # node name -> coremltools' error (this partition() call)

    def _filter(self, node: torch.fx.Node) -> bool | str:
        name = op_name(node.target)
        short = str(getattr(node.target, "__name__", "")).lower()
        if name in self.skip_ops_for_coreml_delegation or short in self.skip_ops_for_coreml_delegation:
            return f"{name}: listed in skip_ops_for_coreml_delegation"
        if node.name in self._refused:
            return f"{name}: {self._refused[node.name]}"
        if name in KNOWN_BAD:
            return f"{name}: {KNOWN_BAD[name]}"
        if name in QUANT_OPS:
            return self._quant_filter(node, name)
        if _frontend_supports(node) is False:
            return f"{name}: coremltools' torch frontend has no converter for it"
        return True

    def _quant_filter(self, node: torch.fx.Node, name: str) -> bool | str:
        """pt2e quantize / dequantize nodes: converted by coremltools as patterns, checked here."""
        if name.endswith("dequantize_per_channel.default"):
            loose = [a.name for a in node.args[:3] if isinstance(a, torch.fx.Node) and a.name not in self._constants]
            if loose:
                return f"{name}: {loose} are not constants of the program (Core ML needs constant weights)"
        elif self.compile_options.deployment_target_value < 8:
            return (f"{name}: activation quantize / dequantize need minimum_deployment_target iOS17 or newer "
                    f"(the compile specs ask for value {self.compile_options.deployment_target_value}); with iOS16 "
                    "use weight-only quantization (CoreMLQuantizer.int8_weight_only())")
        return True

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        sig = exported_program.graph_signature
        self._constants = {*sig.inputs_to_parameters, *sig.inputs_to_buffers, *sig.inputs_to_lifted_tensor_constants}
        self._refused = {}
        result = super().partition(exported_program)
        rounds = 0
        while self.verify_conversion and result.partition_tags:
            refused = refuse_unconvertible(exported_program, self.compile_options,
                                           whole_partitions=rounds >= self.max_refusals)
            if not refused:
                break
            self._refused.update(refused)
            rounds += 1
            result = super().partition(exported_program)
        if self.lower_full_graph and self.rejections:
            for node in exported_program.graph.nodes:
                if node.name in self.rejections:
                    raise LoweringError(
                        f"{COREML_BACKEND_ID}: lower_full_graph=True, but {node.name} "
                        f"({op_name(node.target)}) cannot be lowered: {self.rejections[node.name]}. Pass "
                        "lower_full_graph=False to run unsupported nodes outside Core ML, or rewrite the model.")
        if self.lower_full_graph and len(result.partition_tags) > 1:
            raise LoweringError(f"{COREML_BACKEND_ID}: lower_full_graph=True, but the graph splits into "
                                f"{len(result.partition_tags)} partitions")
        return result

    def ops_to_not_decompose(self, ep: ExportedProgram) -> tuple[list[Any], Any]:
        """Keep ``linear``, ``hardswish``, ``hardsigmoid`` and ``gelu`` whole: each is one Core ML op.

        ``max_pool2d`` is not kept whole: it has no out-variant, so a program with portable fallbacks could not
        carry it; ``max_pool2d_with_indices`` (values only) converts to the same ``max_pool``."""
        aten = torch.ops.aten
        return [aten.linear.default, aten.hardswish.default, aten.hardsigmoid.default, aten.gelu.default], None
