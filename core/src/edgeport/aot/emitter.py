"""Emitter: turns execution-dialect programs (out variants, planned memory) into the program schema.

The layout of what it writes follows the conventions the ExecuTorch runtime expects (see
``edgeport.program.schema``): one value table per method, kernel calls on out-variant operators with every
schema argument followed by the returned value(s), delegate calls with inputs then outputs.
"""

from __future__ import annotations

import numbers
import operator
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._ops import OpOverload
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from edgeport.aot.debug_handles import DEBUG_HANDLE, node_handles
from edgeport.aot.delegate_op import CALL_DELEGATE, lookup_lowered_module
from edgeport.aot.passes.out_variants import SCALAR_OPS, alloc, executorch_name
from edgeport.backend import PORTABLE_FALLBACK_SPEC
from edgeport.errors import SerializationError, UnsupportedOperatorError
from edgeport.program import schema as S

_SYM_PRIM = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.floordiv: "floordiv",
    operator.truediv: "truediv", operator.mod: "mod", operator.eq: "eq", operator.gt: "gt", operator.lt: "lt",
    operator.ge: "ge", operator.le: "le", operator.neg: "neg",
}


def scalar_type(dtype: torch.dtype) -> S.ScalarType:
    return S.scalar_type_from_name(str(dtype))


@dataclass
class PlannedTensor:
    """Where a planned tensor lives: ``shape`` at its upper bound, ``dynamic`` when any dim is symbolic."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    dynamic: bool


DEFAULT_EXTERNAL_TAG = "_default_external_constant"
"""The file tag (``<tag>.ptd``) of constants moved out by ``external_constants=True`` (ExecuTorch's name)."""


@dataclass
class ProgramTables:
    """Program-wide tables shared by all methods: constants and delegate blobs (deduplicated)."""

    constant_buffer: list[S.Buffer] = field(default_factory=lambda: [S.Buffer(b"")])
    constant_index: dict[int, int] = field(default_factory=dict)
    delegate_data: list[S.BackendDelegateInlineData] = field(default_factory=list)
    named_data: list[tuple[str, Any]] = field(default_factory=list)  # (which delegate, its data_store_output)
    keep_alive: list[Any] = field(default_factory=list)
    #: ``ExecutorchBackendConfig.external_constants``: False, True, or node -> file tag or None
    external_constants: Any = False
    #: tag -> fully qualified name -> (bytes, dtype, sizes) of constants written to ``<tag>.ptd``
    external_data: dict[str, dict[str, tuple[bytes, torch.dtype, list[int], int]]] = field(default_factory=dict)
    external_count: int = 0
    #: initial values of mutated buffers (ExecuTorch's ``mutable_data``; entry 0 = no data)
    mutable_buffer: list[S.Buffer] = field(default_factory=lambda: [S.Buffer(b"")])

    def external_tag(self, node: torch.fx.Node, fqn: str) -> str | None:
        """The ``.ptd`` tag of a constant placeholder, or None to keep it in the program (ExecuTorch's rules:
        ``True`` moves every parameter, buffer and non-lifted constant; a callable decides per node)."""
        rule = self.external_constants
        if rule is False or rule is None or "_lifted_tensor" in node.name:
            return None
        tag = DEFAULT_EXTERNAL_TAG if rule is True else rule(node)
        if tag is not None and (not isinstance(tag, str) or not tag):
            raise SerializationError(f"external_constants returned {tag!r} for {fqn!r}: expected a file tag (str) "
                                     "or None")
        return tag

    def external(self, tag: str, fqn: str, tensor: torch.Tensor) -> int:
        """Record ``tensor`` under ``fqn`` in ``<tag>.ptd``; returns the index ExecuTorch writes as data_buffer_idx."""
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        group = self.external_data.setdefault(tag, {})
        old = group.get(fqn)
        if old is not None and old[0] != data:
            raise SerializationError(f"constant {fqn!r} has different values in two methods; both would be written "
                                     f"under that name to {tag}.ptd: give the methods' modules distinct names")
        if old is None:
            old = group[fqn] = (data, tensor.dtype, [int(d) for d in tensor.shape], self.external_count)
            self.external_count += 1
        return old[3]

    def mutable(self, tensor: torch.Tensor) -> int:
        """Record the initial value of a mutated buffer; returns its ``data_buffer_idx`` (one entry per method's
        buffer: each loaded method starts from it)."""
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        self.mutable_buffer.append(S.Buffer(data))
        return len(self.mutable_buffer) - 1

    def constant(self, tensor: torch.Tensor) -> int:
        key = id(tensor)
        if key not in self.constant_index:
            data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            self.constant_buffer.append(S.Buffer(data))
            self.constant_index[key] = len(self.constant_buffer) - 1
            self.keep_alive.append(tensor)
        return self.constant_index[key]


_FRAME = re.compile(r'File "(.*?)", line (\d+), in (.*?)\n([^\n]*)')


def frames_of(stack_trace: str | None) -> list[S.Frame]:
    """The frames of a node's ``meta["stack_trace"]`` (file, line, function, source line), outermost first."""
    if not stack_trace:
        return []
    return [S.Frame(f, int(line), name, text.strip()) for f, line, name, text in _FRAME.findall(stack_trace)]


class MethodEmitter:
    """Emits one method. ``plan`` maps storage-owning nodes to their :class:`PlannedTensor`."""

    def __init__(self, name: str, ep: ExportedProgram, plan: dict[torch.fx.Node, PlannedTensor], arena: int,
                 tables: ProgramTables, fallbacks: dict[str, str] | None = None, emit_stacktrace: bool = False,
                 state: dict[torch.fx.Node, str] | None = None) -> None:
        self.name, self.ep, self.plan, self.arena, self.tables = name, ep, plan, arena, tables
        self.state = state or {}  # mutated buffers: placeholder -> fully qualified name
        self.fallbacks = fallbacks or {}  # delegate key -> name of its portable fallback method
        self.values: list[S.EValue] = []
        self.instructions: list[S.Instruction] = []
        self.operators: list[S.Operator] = []
        self.operator_index: dict[tuple[str, str], int] = {}
        self.delegates: list[S.BackendDelegate] = []
        self.delegate_index: dict[str, int] = {}
        self.node_value: dict[torch.fx.Node, Any] = {}
        #: ExecuTorch's per-method debug maps (see :mod:`edgeport.aot.debug_handles`), keyed by instruction index
        self.debug_handle_map: dict[int, int | list[int]] = {}
        self.delegate_map: dict[int, dict[str, Any]] = {}
        self.instruction_id_to_num_outs_map: dict[int, int] = {}
        self._current: torch.fx.Node | None = None
        #: ``Chain.stacktrace`` (``ExecutorchBackendConfig.emit_stacktrace``): one frame list per instruction
        self.stacktraces: list[S.FrameList] | None = [] if emit_stacktrace else None

    # -- values --------------------------------------------------------------------------------------
    def _add(self, val: Any) -> int:
        self.values.append(S.EValue(val))
        return len(self.values) - 1

    def _tensor_value(self, meta: torch.Tensor, *, planned: PlannedTensor | None = None, data_idx: int = 0) -> int:
        if planned is not None:
            sizes, dynamic = list(planned.shape), planned.dynamic
            alloc_info = S.AllocationDetails(1, planned.offset & 0xFFFFFFFF, planned.offset >> 32)
        else:
            sizes, dynamic, alloc_info = [int(s) for s in meta.shape], False, None
        return self._add(S.Tensor(
            scalar_type=scalar_type(meta.dtype),
            storage_offset=0,
            sizes=sizes,
            dim_order=list(range(len(sizes))),
            requires_grad=False,
            data_buffer_idx=data_idx,
            allocation_info=alloc_info,
            layout=0,
            shape_dynamism=S.TensorShapeDynamism.DYNAMIC_BOUND if dynamic else S.TensorShapeDynamism.STATIC,
        ))

    def _scalar(self, value: Any) -> int:
        if isinstance(value, torch.fx.Node):
            return self._node(value)
        if isinstance(value, bool):
            return self._add(S.Bool(value))
        if isinstance(value, numbers.Integral):
            return self._add(S.Int(int(value)))
        if isinstance(value, numbers.Real):
            return self._add(S.Double(float(value)))
        if isinstance(value, torch.dtype):
            return self._add(S.Int(int(scalar_type(value))))
        if isinstance(value, (torch.layout, torch.memory_format, torch.device)):
            return self._add(S.Null())
        if isinstance(value, str):
            return self._add(S.String(value))
        raise UnsupportedOperatorError(f"cannot emit argument value {value!r} of type {type(value).__name__}")

    def _node(self, node: torch.fx.Node) -> int:
        if node not in self.node_value:
            raise SerializationError(f"method {self.name!r}: node {node.name!r} used before it was emitted")
        value = self.node_value[node]
        if isinstance(value, list):
            raise SerializationError(f"method {self.name!r}: node {node.name!r} is a tuple; use getitem")
        return value

    def _argument(self, arg: torch._C.Argument, value: Any) -> int:
        jit_type = arg.type
        if value is None:
            return self._add(S.Null())
        kind = jit_type.kind()
        if kind == "OptionalType":
            jit_type = jit_type.getElementType()
            kind = jit_type.kind()
        if kind == "ListType":
            elem = jit_type.getElementType()
            ekind = elem.kind()
            items = list(value)
            if ekind == "TensorType":
                return self._add(S.TensorList([self._node(v) for v in items]))
            if ekind == "OptionalType":
                return self._add(S.OptionalTensorList([-1 if v is None else self._node(v) for v in items]))
            if ekind in ("IntType", "SymIntType"):
                return self._add(S.IntList([self._scalar(v) for v in items]))
            if ekind == "FloatType":
                return self._add(S.DoubleList([float(v) for v in items]))
            if ekind == "BoolType":
                return self._add(S.BoolList([bool(v) for v in items]))
            raise UnsupportedOperatorError(f"argument {arg.name}: list of {elem} is not supported")
        if kind == "TensorType":
            if not isinstance(value, torch.fx.Node):
                raise UnsupportedOperatorError(f"argument {arg.name}: expected a tensor, got {value!r}")
            return self._node(value)
        if kind == "FloatType":
            return self._add(S.Double(float(value)))
        if kind == "BoolType":
            return self._add(S.Bool(bool(value)))
        return self._scalar(value)

    # -- instructions --------------------------------------------------------------------------------
    def _operator(self, name: str, overload: str) -> int:
        key = (name, overload)
        if key not in self.operator_index:
            self.operators.append(S.Operator(name, overload))
            self.operator_index[key] = len(self.operators) - 1
        return self.operator_index[key]

    def _kernel(self, name: str, overload: str, args: list[int]) -> None:
        op_index = self._operator(name, overload)
        handle = self._current.meta.get(DEBUG_HANDLE) if self._current is not None else None
        if isinstance(handle, int):
            self.debug_handle_map[len(self.instructions)] = handle
        if self.stacktraces is not None:
            trace = self._current.meta.get("stack_trace") if self._current is not None else None
            self.stacktraces.append(S.FrameList(frames_of(trace)))
        self.instructions.append(S.Instruction(S.KernelCall(op_index, args)))

    def _emit_op(self, node: torch.fx.Node) -> None:
        op: OpOverload = node.target
        schema = op._schema
        if op is torch.ops.aten._to_copy.out:
            self._emit_to_copy(node)
            return
        args: list[int] = []
        outs: list[int] = []
        list_items: list[int] | None = None
        positional = list(node.args)
        for i, arg in enumerate(schema.arguments):
            if i < len(positional) and not arg.kwarg_only:
                value = positional[i]
            elif arg.name in node.kwargs:
                value = node.kwargs[arg.name]
            elif arg.has_default_value():
                value = arg.default_value
            else:
                raise UnsupportedOperatorError(f"node {node.name!r}: missing argument {arg.name!r} of {op}")
            index = self._argument(arg, value)
            args.append(index)
            if arg.alias_info is not None and arg.alias_info.is_write:
                outs.append(index)
                if arg.type.kind() == "ListType":  # a Tensor[] out: getitem reads its elements
                    list_items = [self._node(v) for v in value]
        if op in SCALAR_OPS:
            ret = self._add(S.Int(0))
            args.append(ret)
            self.node_value[node] = ret
        elif len(outs) == 1 and list_items is not None:
            args.append(self._add(S.TensorList(list_items)))
            self.node_value[node] = list_items
        elif len(outs) == 1:
            args.append(outs[0])
            self.node_value[node] = outs[0]
        else:
            args.append(self._add(S.TensorList(outs)))
            self.node_value[node] = outs
        name, overload = executorch_name(schema), schema.overload_name  # ExecuTorch writes "" for default
        self._kernel(name, overload, args)

    def _emit_to_copy(self, node: torch.fx.Node) -> None:
        src = self._node(node.args[0])
        out = self._node(node.kwargs["out"])
        rank = len(node.meta["val"].shape)
        dim_order = self._add(S.IntList([self._add(S.Int(i)) for i in range(rank)]))
        non_blocking = self._add(S.Bool(bool(node.kwargs.get("non_blocking", False))))
        self._kernel("dim_order_ops::_to_dim_order_copy", "out", [src, non_blocking, dim_order, out, out])
        self.node_value[node] = out

    def _emit_sym(self, node: torch.fx.Node) -> None:
        name = _SYM_PRIM.get(node.target)
        if name is None:
            raise UnsupportedOperatorError(f"node {node.name!r}: symbolic op {node.target} is not supported")
        args = [self._scalar(a) for a in node.args]
        ret = self._add(S.Int(0))
        self._kernel(f"executorch_prim::{name}", "Scalar", [*args, ret])
        self.node_value[node] = ret

    def _emit_delegate(self, node: torch.fx.Node) -> None:
        key, inputs = node.args
        lowered = lookup_lowered_module(key)
        if key not in self.delegate_index:
            self.tables.delegate_data.append(S.BackendDelegateInlineData(lowered.processed_bytes))
            ref = S.BackendDelegateDataReference(S.DataLocation.INLINE, len(self.tables.delegate_data) - 1)
            specs = list(lowered.compile_specs)
            if key in self.fallbacks:
                specs.append(S.CompileSpec(PORTABLE_FALLBACK_SPEC, self.fallbacks[key].encode()))
            self.delegates.append(S.BackendDelegate(lowered.backend_id, ref, specs))
            self.tables.named_data.append((f"delegate {len(self.delegates) - 1} ({lowered.backend_id}) of method "
                                           f"{self.name!r}", lowered.named_data_store_output))
            self.delegate_index[key] = len(self.delegates) - 1
        outputs = sorted((u for u in node.users if u.target is operator.getitem), key=lambda u: u.args[1])
        out_ids = []
        for user in outputs:
            out_ids.append(self._tensor_value(user.meta["val"], planned=self.plan[user]))
            self.node_value[user] = out_ids[-1]
        arg_ids = [self._node(i) for i in inputs] + out_ids
        instruction = len(self.instructions)
        self.debug_handle_map[instruction] = node_handles(lowered.original_module)
        self.instruction_id_to_num_outs_map[instruction] = len(lowered.output_metas())
        self.delegate_map[instruction] = {"name": lowered.backend_id,
                                          "delegate_map": dict(lowered.meta.get("debug_handle_map") or {})}
        if self.stacktraces is not None:  # the innermost frame of each node the delegate carries out
            frames = [f[-1] for n in lowered.original_module.graph.nodes if n.op == "call_function"
                      if (f := frames_of(n.meta.get("stack_trace")))]
            self.stacktraces.append(S.FrameList(frames))
        self.instructions.append(S.Instruction(S.DelegateCall(self.delegate_index[key], arg_ids)))
        self.node_value[node] = out_ids

    # -- method --------------------------------------------------------------------------------------
    def emit(self) -> S.ExecutionPlan:
        ep = self.ep
        specs = {s.arg.name: s for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
        inputs: list[int] = []
        for node in ep.graph.nodes:
            if node.op == "placeholder":
                self._emit_placeholder(node, specs.get(node.name), inputs)
            elif node.op == "call_function":
                self._current = node
                if node.target is alloc:
                    self.node_value[node] = self._tensor_value(node.meta["val"], planned=self.plan[node])
                elif node.target is CALL_DELEGATE:
                    self._emit_delegate(node)
                elif node.target is operator.getitem:
                    src = self.node_value.get(node.args[0])
                    if isinstance(src, list):
                        self.node_value[node] = src[node.args[1]]
                    elif node not in self.node_value:
                        raise SerializationError(f"node {node.name!r}: getitem on a non-tuple value")
                elif node.target in _SYM_PRIM:
                    self._emit_sym(node)
                elif isinstance(node.target, OpOverload):
                    self._emit_op(node)
                else:
                    raise UnsupportedOperatorError(f"node {node.name!r}: cannot emit call to {node.target}")
            elif node.op == "output":
                outputs = self._emit_outputs(node)
        in_spec = ep.call_spec.in_spec
        out_spec = ep.call_spec.out_spec
        dumps = torch.utils._pytree.treespec_dumps
        return S.ExecutionPlan(
            name=self.name,
            container_meta_type=S.ContainerMetadata(dumps(in_spec) if in_spec else "",
                                                    dumps(out_spec) if out_spec else ""),
            values=self.values,
            inputs=inputs,
            outputs=outputs,
            chains=[S.Chain(inputs=[], outputs=[], instructions=self.instructions, stacktrace=self.stacktraces)],
            operators=self.operators,
            delegates=self.delegates,
            non_const_buffer_sizes=[0, self.arena],
        )

    def _emit_placeholder(self, node: torch.fx.Node, spec: Any, inputs: list[int]) -> None:
        val = node.meta.get("val")
        if spec is None or spec.kind == InputKind.USER_INPUT:
            if isinstance(val, torch.Tensor):
                index = self._tensor_value(val, planned=self.plan[node])
            else:
                index = self._scalar(val)
            self.node_value[node] = index
            inputs.append(index)
            return
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            tensor = self.ep.state_dict.get(spec.target)
            if tensor is None:
                tensor = self.ep.constants.get(spec.target)
            if not isinstance(tensor, torch.Tensor):
                raise SerializationError(f"method {self.name!r}: no data for constant {spec.target!r}")
            if node in self.state:  # planned for the whole method, starting from its initial value
                self.node_value[node] = self._tensor_value(tensor, planned=self.plan[node],
                                                           data_idx=self.tables.mutable(tensor))
                return
            tag = self.tables.external_tag(node, spec.target)
            if tag is not None:
                index = self._tensor_value(tensor, data_idx=self.tables.external(tag, spec.target, tensor))
                self.values[index].val.extra_tensor_info = S.ExtraTensorInfo(
                    fully_qualified_name=spec.target, location=S.TensorDataLocation.EXTERNAL)
                self.node_value[node] = index
                return
            self.node_value[node] = self._tensor_value(tensor, data_idx=self.tables.constant(tensor))
            return
        raise UnsupportedOperatorError(f"method {self.name!r}: input kind {spec.kind.name} is not supported")

    def _emit_outputs(self, node: torch.fx.Node) -> list[int]:
        kinds = [s.kind for s in self.ep.graph_signature.output_specs]
        if len(kinds) != len(node.args[0]):
            raise SerializationError(f"method {self.name!r}: {len(node.args[0])} outputs but the signature has "
                                     f"{len(kinds)}")
        result = []
        for kind, arg in zip(kinds, node.args[0]):
            if kind == OutputKind.BUFFER_MUTATION:
                continue  # written back into its buffer by the write-back pass
            if kind != OutputKind.USER_OUTPUT:
                raise UnsupportedOperatorError(f"method {self.name!r}: outputs of kind {kind.name} are not supported")
            if isinstance(arg, torch.fx.Node):
                result.append(self._node(arg))
            else:
                result.append(self._scalar(arg))
        return result


def emit_constant_method(name: str, value: Any, tables: ProgramTables) -> S.ExecutionPlan:
    """A method with no instructions that returns ``value`` (an int, float, bool, str, tensor or list of them)."""
    emitter = MethodEmitter(name, None, {}, 0, tables)  # type: ignore[arg-type]
    items = value if isinstance(value, (list, tuple)) else [value]
    outputs = []
    for item in items:
        if isinstance(item, torch.Tensor):
            outputs.append(emitter._tensor_value(item, data_idx=tables.constant(item)))
        else:
            outputs.append(emitter._scalar(item))
    return S.ExecutionPlan(
        name=name,
        container_meta_type=S.ContainerMetadata("", ""),
        values=emitter.values,
        inputs=[],
        outputs=outputs,
        chains=[S.Chain(inputs=[], outputs=[], instructions=[], stacktrace=None)],
        operators=[],
        delegates=[],
        non_const_buffer_sizes=[0],
    )
