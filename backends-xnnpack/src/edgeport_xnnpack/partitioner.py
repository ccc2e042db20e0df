"""XnnpackPartitioner: the core capability partitioner driven by XnnpackBackend's one table.

Beyond the table's per-node constraints it checks what needs the program's signature: convolution, linear and
batch-norm parameters must be constants (XNNPACK packs weights when a runtime is created). Every rejected node's
reason is in :attr:`rejections` after :meth:`partition`.

Quantized graphs: a parameter may also be a ``dequantize`` of constants (an int8 weight with its scales), and a
``dequantize`` node is taken only when it reads constants or a quantize node that is taken too, so a delegate
never receives an int8 input.

torchao ``quantize_`` graphs (``torchao.choose_qparams_affine`` / ``quantize_affine`` / ``dequantize_affine``,
kept whole through :meth:`~XnnpackPartitioner.ops_to_not_decompose`): a linear whose weight is a
``dequantize_affine`` of constants is taken only as a whole dynamically quantized linear XNNPACK runs (see
:mod:`edgeport_xnnpack.preprocess.affine_quantized`); otherwise it and its quant nodes are left out with the
reason, and the portable kernels run their decomposition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
from edgeport.backend import CompileSpec, DelegationSpec
from edgeport_xnnpack.capabilities import ALL_CAPABILITIES, BACKEND_ID, register_quantized_ops
from edgeport_xnnpack.options import STATIC_SHAPES, XnnpackCompileOptions
from edgeport_xnnpack.preprocess.affine_quantized import (
    CHOOSE_A,
    DQA,
    QA,
    affine_linear_reason,
    affine_pattern_reason,
)

# op -> argument positions that must be constants (None = optional argument, allowed to be absent)
_CONSTANT_ARGS = {
    "aten.convolution.default": (1, 2),
    "aten.linear.default": (1, 2),
    "aten._native_batch_norm_legit_no_training.default": (1, 2, 3, 4),
}
register_quantized_ops()
_Q = "quantized_decomposed.quantize_per_tensor.default"
_DQ = ("quantized_decomposed.dequantize_per_tensor.default", "quantized_decomposed.dequantize_per_channel.default")
_AFFINE = (CHOOSE_A, QA, DQA)


class XnnpackPartitioner(CapabilityBasedPartitioner):
    """Delegates what :data:`~edgeport_xnnpack.capabilities.ALL_CAPABILITIES` supports to ``XnnpackBackend``.

    ``compile_specs`` may be a list of :class:`CompileSpec` or an :class:`XnnpackCompileOptions`. Each partition
    also gets the ``static_shapes`` compile spec (:class:`XnnpackCompileOptions`): ``true`` when no value it reads
    or computes has a symbolic dim, unless ``compile_specs`` fixes it for every partition.
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
        self._tensors: dict[str, torch.Tensor] = {}

    def _is_constant(self, a: object) -> bool:
        return isinstance(a, torch.fx.Node) and (
            (a.op == "placeholder" and a.name in self._constants) or a.op == "get_attr")

    def _is_static(self, a: object) -> bool:
        """A constant, or a dequantize of constants (a quantized weight)."""
        if self._is_constant(a):
            return True
        return (isinstance(a, torch.fx.Node) and a.op == "call_function" and op_name(a.target) in (*_DQ, DQA)
                and all(self._is_constant(x) for x in a.all_input_nodes) and self.check_node(a) is None)

    def _value_of(self, a: object) -> torch.Tensor | None:
        """The tensor of a constant placeholder, else ``None``."""
        if isinstance(a, torch.fx.Node) and a.op == "placeholder" and a.name in self._constants:
            return self._tensors.get(a.name)
        return None

    def _filter(self, node: torch.fx.Node) -> bool | str | None:
        name = op_name(node.target)
        for arg in (node, *node.all_input_nodes):
            val = arg.meta.get("val")
            if isinstance(val, torch.Tensor) and any(isinstance(d, int) and d == 0 for d in val.shape):
                return (f"{name}: {'its output' if arg is node else arg.name} has no elements (shape "
                        f"{list(val.shape)}); XNNPACK has no empty tensors")
        if name in _AFFINE:
            why = affine_pattern_reason(node, self._value_of)
            if why is not None:
                return why
        elif name == "aten.linear.default" and len(node.args) > 1 and isinstance(node.args[1], torch.fx.Node) and (
                op_name(node.args[1].target) == DQA):
            why = affine_linear_reason(node, self._value_of)
            if why is not None:
                return why
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
        self._tensors = _constant_tensors(exported_program, self._constants)
        self.node_filter = self._filter
        try:
            result = super().partition(exported_program)
        finally:
            self.node_filter = self._user_filter
        result = _drop_constant_partitions(result, self._constants)
        if not any(c.key == STATIC_SHAPES for c in self.compile_specs):
            _hint_static_shapes(result)
        return result

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        """Keep ``linear`` and ``hardswish`` whole so they reach the backend as one node each, and torchao's
        affine quant ops (when torchao defined them) that lead to a ``linear``, so its quantized linears can be
        recognized. Others (an embedding's weight-only dequantize) are decomposed as usual: kept whole and not
        delegated, they would force a second decomposition of the lowered program."""
        ops = [torch.ops.aten.linear.default, torch.ops.aten.hardswish.default]
        affine = []
        for name in ("choose_qparams_affine", "quantize_affine", "dequantize_affine"):
            try:
                affine.append(getattr(torch.ops.torchao, name).default)
            except (AttributeError, RuntimeError):  # torchao not imported: no graph can hold them
                pass
        if not affine:
            return ops, None
        kept = set(affine)

        def keep(node: torch.fx.Node) -> bool:
            return node.target not in kept or _feeds_linear(node, kept)

        return [*ops, *affine], keep


def _feeds_linear(node: torch.fx.Node, through: set[Any]) -> bool:
    """Whether ``node``'s value reaches an ``aten.linear`` through torchao affine quant ops (and getitems)."""
    import operator

    seen: set[torch.fx.Node] = set()
    todo = list(node.users)
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.target is torch.ops.aten.linear.default:
            return True
        if user.target in through or user.target is operator.getitem:
            todo.extend(user.users)
    return False


def _drop_constant_partitions(result: PartitionResult, constants: set[str]) -> PartitionResult:
    """Untag partitions that compute only from constants (a weight-norm's ``pow`` of a weight): every output would
    be a constant, nothing is left to compute per call, and the runtime folds them once at load."""
    derived: set[torch.fx.Node] = set()
    for node in result.tagged_exported_program.graph.nodes:
        if node.op == "placeholder" and node.name in constants or node.op == "get_attr":
            derived.add(node)
        elif node.op == "call_function" and node.all_input_nodes and all(a in derived for a in node.all_input_nodes):
            derived.add(node)
    members: dict[str, list[torch.fx.Node]] = {}
    for node in result.tagged_exported_program.graph.nodes:
        tag = node.meta.get("delegation_tag")
        if tag is not None and node.op == "call_function":
            members.setdefault(tag, []).append(node)
    for tag, nodes in members.items():
        if all(n in derived for n in nodes):
            for n in result.tagged_exported_program.graph.nodes:
                if n.meta.get("delegation_tag") == tag:
                    del n.meta["delegation_tag"]
            result.partition_tags.pop(tag, None)
    return result


def _hint_static_shapes(result: PartitionResult) -> None:
    """Add the ``static_shapes`` compile spec to each partition's :class:`DelegationSpec`: ``true`` when no node of
    the partition, nor any value it reads, has a symbolic dim in its ``meta["val"]`` (its inputs and outputs then
    never change shape), ``false`` otherwise -- also when a value has no ``meta["val"]`` (unknown shapes: ``false``
    keeps the shared operators, right at every shape)."""
    dynamic: set[str] = set()
    for node in result.tagged_exported_program.graph.nodes:
        tag = node.meta.get("delegation_tag")
        if tag is None or tag in dynamic:
            continue
        if any("val" not in n.meta or _has_symbolic_dim(n.meta["val"]) for n in (node, *node.all_input_nodes)):
            dynamic.add(tag)
    for tag, spec in list(result.partition_tags.items()):
        value = b"false" if tag in dynamic else b"true"
        result.partition_tags[tag] = DelegationSpec(spec.backend_id, [*spec.compile_specs,
                                                                      CompileSpec(STATIC_SHAPES, value)])


def _has_symbolic_dim(val: object) -> bool:
    """Whether a ``meta["val"]`` (a fake tensor, or a list/tuple of them) has a dim that is not a plain int."""
    if isinstance(val, torch.SymInt):
        return True
    if isinstance(val, torch.Tensor):
        return any(not isinstance(d, int) for d in val.shape)
    if isinstance(val, (list, tuple)):
        return any(_has_symbolic_dim(v) for v in val)
    return False


def _constant_tensors(ep: ExportedProgram, names: set[str]) -> dict[str, torch.Tensor]:
    sig = ep.graph_signature
    out: dict[str, torch.Tensor] = {}
    for spec in sig.input_specs:
        if spec.arg.name in names and isinstance(spec.target, str):
            t = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
            if isinstance(t, torch.Tensor):
                out[spec.arg.name] = t
    return out
