"""``QnnPartitioner``: the core capability partitioner driven by the QNN table, plus a check of every candidate
node on the real backend.

Each node the table accepts is lowered on its own into a throw-away graph of the process's HTP backend; every
QNN node that lowering adds goes through ``backendValidateOpConfig`` first (the SDK's ``GraphBuilder.add_node``).
A node is delegated only when the backend accepts all of them, so the partitioner never claims what the HTP
refuses; the backend's message is the rejection reason (``partitioner.rejections``). Results are cached per op
signature (op, argument shapes, which arguments are constants, the other arguments).

Some refusals show only when the HTP prepares a larger graph (e.g. ``q::flat_from_vtcm`` allocation failures of
fp32 graphs of some sizes): each partition is then finalized at partition time (:mod:`edgeport_qnn.trial`), and
a refused one shrinks -- the node QNN's log names, or one found by bisection, goes to the CPU with QNN's words as
its reason (``partitioner.refusals``) -- instead of failing the lowering.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.export import ExportedProgram

from edgeport.aot.capability_partitioner import (
    CapabilityBasedPartitioner,
    NodeFilter,
    constant_placeholder_names,
    op_name,
)
from edgeport.aot.graph_utils import placeholder_tensor
from edgeport.aot.partitioner import PartitionResult
from edgeport.aot.trial import Refusal, find_refusals
from edgeport.backend import CompileSpec
from edgeport.errors import LoweringError
from edgeport_qnn.capabilities import (
    ALL_CAPABILITIES,
    CONSTANT_ARGS,
    DEQUANTIZE,
    DEQUANTIZE_PER_CHANNEL,
    QUANTIZE,
)
from edgeport_qnn.options import QNN_BACKEND_ID, QnnCompileOptions
from edgeport_qnn.trial import partition_subset, qnn_trial

_MAX_TRIAL_ROUNDS = 32
_CACHE: dict[Any, str | None] = {}
_CACHE_LOCK = threading.Lock()


def _signature(node: torch.fx.Node, constants: set[str]) -> Any:
    def one(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            val = a.meta.get("val")
            shape = tuple(getattr(val, "shape", ())) if not isinstance(val, (list, tuple)) else "multi"
            # a dequantize's integer type and range decide the quantized form (8- or 16-bit)
            qtype = (tuple(repr(x) for x in a.args[-3:]) if a.op == "call_function"
                     and op_name(a.target) in (DEQUANTIZE, DEQUANTIZE_PER_CHANNEL) else ())
            return ("node", shape, str(getattr(val, "dtype", "")), a.name in constants or a.op == "get_attr", qtype)
        if isinstance(a, (list, tuple)):
            return tuple(one(x) for x in a)
        return repr(a)

    out_val = node.meta.get("val")
    return (op_name(node.target), one(tuple(node.args)), tuple(sorted((k, one(v)) for k, v in node.kwargs.items())),
            repr(getattr(out_val, "shape", None)))


def _dequantized_weights(a: Any, constants: set[str]) -> bool:
    """``a`` is a per-channel dequantize of constants (quantized weights)."""
    return (isinstance(a, torch.fx.Node) and a.op == "call_function" and op_name(a.target) == DEQUANTIZE_PER_CHANNEL
            and all(x.op == "get_attr" or (x.op == "placeholder" and x.name in constants) for x in a.all_input_nodes))


def validate_on_backend(node: torch.fx.Node, ep: ExportedProgram, constants: set[str], soc_model: int | None = None,
                        use_fp16: bool = False) -> str | None:
    """``None`` when the HTP accepts the QNN nodes lowering ``node`` makes (each validated, then the one-node graph
    finalized: some refusals, e.g. fp32 ``Gelu``, only show when the HTP prepares a graph), else the reason. The
    graph is built as ``preprocess`` will build it: on the device of ``soc_model`` (or the default one), with
    fp16 precision when ``use_fp16``."""
    from edgeport_qnn.isolated import QnnWorkerCrash, RecordingBuilder, run_recipe
    from edgeport_qnn.preprocess.lowering import Const, Deq, Lowering, QConst, Val, static_shape
    from edgeport_qnn.preprocess.ops import LOWERINGS, QUANTIZED_LOWERINGS
    from edgeport_qnn.preprocess.ops.quant import QUANT_OPS, quant_of, quantizing_user
    from edgeport_qnn.sdk import QnnError

    # tensors QNN cannot hold: refused here, with the reason (never an exception out of partition)
    for a in (*node.all_input_nodes, node):
        val = a.meta.get("val")
        if isinstance(val, (list, tuple)):  # the outputs of a multi-output node that are read
            used = {u.args[1] for u in a.users if u.target is operator.getitem}
            val = [v for i, v in enumerate(val) if i in used]
        for v in (val if isinstance(val, list) else (val,)):
            if not isinstance(v, torch.Tensor):
                continue
            if any(not isinstance(d, int) for d in v.shape):
                return f"{a.name} has a dynamic shape {tuple(v.shape)} (QNN graphs here are static)"
            if v.numel() == 0:
                return f"{a.name} has no elements (shape {tuple(v.shape)}); QNN tensors need positive dimensions"
    # an op between dequantizes and one quantize runs quantized: check that form (inputs with their parameters)
    quantized = (op_name(node.target) in QUANT_OPS and quantizing_user(node) is not None
                 and any(op_name(getattr(a, "target", None)) == DEQUANTIZE for a in node.all_input_nodes))
    if all((a.op == "placeholder" and a.name in constants) or a.op == "get_attr" or _dequantized_weights(a, constants)
           for a in node.all_input_nodes):
        return "it computes from constants only (a QNN graph needs a runtime input)"
    key = (_signature(node, constants), quantized, soc_model, use_fp16)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    form = " (quantized form)" if quantized else ""
    reason: str | None = None
    lowering = Lowering(RecordingBuilder("validate", fp16=use_fp16), LOWERINGS)
    lowering.quant_lowerings = QUANTIZED_LOWERINGS
    try:
        for i, a in enumerate(node.all_input_nodes):
            tensor = placeholder_tensor(ep, a) if a.op == "placeholder" and a.name in constants else None
            if tensor is not None:
                lowering.values[a] = Const(tensor.detach().contiguous().numpy())
            elif _dequantized_weights(a, constants):  # its values do not matter to the backend, its scales might
                shape = static_shape(a)
                scales = placeholder_tensor(ep, a.args[1]) if a.args[1].op == "placeholder" else None
                scales = (tuple(float(x) for x in scales.reshape(-1)) if scales is not None
                          else (1.0,) * shape[int(a.args[3])])
                wtype = np.int16 if a.args[-1] == torch.int16 else np.int8  # as the weights are stored
                lowering.values[a] = QConst(np.zeros(shape, np.float32), raw=np.zeros(shape, wtype),
                                            scales=scales, zero_points=(0,) * len(scales),
                                            axis=int(a.args[3]) % len(shape))
            elif quantized and op_name(getattr(a, "target", None)) == DEQUANTIZE:
                dtype, q = quant_of(a)
                lowering.g.add_input(f"in_{i}", static_shape(a), dtype, q)
                lowering.values[a] = Deq(Val(f"in_{i}", static_shape(a), dtype=dtype, quant=q))
            else:
                val = a.meta.get("val")
                if getattr(val, "dtype", None) != torch.float32:
                    return f"input {a.name} is not a float32 tensor"
                lowering.values[a] = lowering.input(static_shape(a), f"in_{i}")
        lowering.lower(node)
        result = lowering.values[node]
        for j, v in enumerate(result if isinstance(result, tuple) else (result,)):
            if isinstance(v, Val) and v.quant is not None:
                v = lowering.node("Dequantize", [v.name], v.qnn_shape, nhwc=v.nhwc, logical=v.shape,
                                  like=Val("", ()))
            if v is not None:
                lowering.output_value(v, j)
        # validated node by node, then finalized: some refusals only show when the HTP prepares the graph
        run_recipe(lowering.g.recipe, soc_model, want_binary=False,
                   what=f"a check of {node.name} ({op_name(node.target)})")
    except QnnWorkerCrash as exc:
        reason = f"checking it on the QNN HTP backend crashed Qualcomm's library{form}: {str(exc).splitlines()[0]}"
    except QnnError as exc:
        first = str(exc).splitlines()
        log: list[str] = []  # QNN's own words (e.g. "has incorrect Value 69, expected >= 73"), not its summary
        for line in exc.library_log:
            line = line.replace("<E>", "").strip()
            if line and line not in log and "validateOpConfig failed" not in line and "Failed to validate" not in line:
                log.append(line)
        reason = f"the QNN HTP backend refuses it{form}: {first[0]}" + (f" ({'; '.join(log[:2])})" if log else "")
    except LoweringError as exc:
        reason = f"no QNN lowering{form}: {exc}"
    except (ValueError, TypeError) as exc:  # a tensor or parameter QNN cannot express
        reason = f"no QNN lowering{form}: {exc}"
    with _CACHE_LOCK:
        _CACHE[key] = reason
    return reason


class QnnPartitioner(CapabilityBasedPartitioner):
    """Delegates what the QNN HTP runs to ``QnnBackend`` (ExecuTorch's name).

    ``compile_specs``: the list from :func:`~edgeport_qnn.options.generate_qnn_executorch_compiler_spec`, or a
    :class:`~edgeport_qnn.options.QnnCompileOptions`; ``None``: HTP, fp32, the default SoC.
    """

    def __init__(self, compile_specs: Sequence[CompileSpec] | QnnCompileOptions | None = None, *,
                 min_partition_size: int = 1, node_filter: NodeFilter | None = None,
                 validate_on_backend: bool = True, trial_compile: bool = True) -> None:
        if compile_specs is None:
            options = QnnCompileOptions()
        elif isinstance(compile_specs, QnnCompileOptions):
            options = compile_specs
        else:
            options = QnnCompileOptions.from_compile_specs(list(compile_specs))
        super().__init__(QNN_BACKEND_ID, ALL_CAPABILITIES, options.to_compile_specs(),
                         min_partition_size=min_partition_size, node_filter=node_filter)
        self.compile_options = options
        self.validate = validate_on_backend
        #: test-finalize each partition at partition time and move what the HTP refuses to the CPU
        self.trial_compile = trial_compile
        #: after :meth:`partition`: each partition the HTP refused as a whole, and the nodes moved for it
        self.refusals: list[Refusal] = []
        self._user_filter = node_filter
        self._ep: ExportedProgram | None = None
        self._banned: dict[torch.fx.Node, str] = {}
        self._constants: set[str] = set()
        self._soc: int | None = None

    def _is_constant(self, a: Any) -> bool:
        return isinstance(a, torch.fx.Node) and (a.op == "get_attr" or (
            a.op == "placeholder" and a.name in self._constants))

    def _check(self, node: torch.fx.Node) -> bool | str | None:
        name = op_name(node.target)
        if node in self._banned:
            return self._banned[node]
        for i in CONSTANT_ARGS.get(name, ()):
            a = node.args[i] if i < len(node.args) else None
            if a is not None and not self._is_constant(a) and not _dequantized_weights(a, self._constants):
                return f"{name}: argument {i} ({getattr(a, 'name', a)}) is not a constant (weights must be static)"
        if self._user_filter is not None:
            verdict = self._user_filter(node)
            if verdict is False or isinstance(verdict, str):
                return verdict or "rejected by node_filter"
        if self.validate and self._ep is not None and name not in (QUANTIZE, DEQUANTIZE, DEQUANTIZE_PER_CHANNEL):
            try:
                why = validate_on_backend(node, self._ep, self._constants, self._soc, self.compile_options.use_fp16)
            except Exception as exc:  # noqa: BLE001 - a node the check cannot handle stays on the CPU, saying why
                why = f"checking it on the QNN backend failed: {type(exc).__name__}: {exc}"
            if why:
                return f"{name}: {why}"
        return True

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        from edgeport_qnn.preprocess import on_soc_device

        self._ep = exported_program
        self._constants = constant_placeholder_names(exported_program)
        self._soc = (int(self.compile_options.chipset)
                     if on_soc_device(exported_program.graph, self.compile_options.use_fp16) else None)
        self.node_filter = self._check
        self._banned: dict[torch.fx.Node, str] = {}
        self.refusals = []
        known_good: set[frozenset[str]] = set()
        try:
            for _ in range(_MAX_TRIAL_ROUNDS):
                result = self._partition_consistently(exported_program)
                if not self.trial_compile:
                    return result
                groups: dict[str, list[torch.fx.Node]] = {}
                for node in exported_program.graph.nodes:
                    if node.meta.get("delegation_tag") is not None:
                        groups.setdefault(node.meta["delegation_tag"], []).append(node)
                try_compile = qnn_trial(exported_program, int(self.compile_options.chipset),
                                        self.compile_options.use_fp16)
                refusals = find_refusals(groups, try_compile, partition_subset, known_good)
                if not refusals:
                    return result
                by_name = {n.name: n for n in exported_program.graph.nodes}
                for refusal in refusals:
                    self.refusals.append(refusal)
                    for name in refusal.culprits:
                        self._banned[by_name[name]] = f"{op_name(by_name[name].target)}: {refusal.reason(name)}"
            raise LoweringError(f"QnnPartitioner: partitions still refused by the HTP after {_MAX_TRIAL_ROUNDS} "
                                "rounds of moving nodes to the CPU (report this as a bug)")
        finally:
            self.node_filter = self._user_filter
            self._ep = None

    def _partition_consistently(self, exported_program: ExportedProgram) -> PartitionResult:
        """Tag, then untag what would make a quantized tensor cross a delegate boundary or a partition compute
        from constants only, until stable."""
        while True:
            result = super().partition(exported_program)
            crossing = self._quantized_crossings(exported_program.graph)
            crossing.update(self._constant_only(exported_program.graph))
            if not crossing:
                return result
            self._banned.update(crossing)

    def _constant_only(self, graph: torch.fx.Graph) -> dict[torch.fx.Node, str]:
        """Partitions that read no runtime tensor (they would compute from constants only: a QNN graph needs an
        input); their nodes stay on the CPU."""
        fed: set[str] = set()
        members: dict[str, list[torch.fx.Node]] = {}
        for node in graph.nodes:
            tag = node.meta.get("delegation_tag")
            if tag is None or node.op != "call_function":
                continue
            members.setdefault(tag, []).append(node)
            for a in node.all_input_nodes:
                if a.meta.get("delegation_tag") != tag and not self._is_constant(a):
                    fed.add(tag)
        return {n: f"{op_name(n.target)}: its partition computes from constants only" for tag, nodes in
                members.items() if tag not in fed for n in nodes}

    @staticmethod
    def _quantized_crossings(graph: torch.fx.Graph) -> dict[torch.fx.Node, str]:
        """Delegated quantizes whose dequantizes are elsewhere, and delegated dequantizes whose quantize is elsewhere:
        delegates exchange float32 only."""
        out = {}
        for node in graph.nodes:
            tag = node.meta.get("delegation_tag")
            if tag is None or node.op != "call_function":
                continue
            name = op_name(node.target)
            if name in (QUANTIZE, DEQUANTIZE_PER_CHANNEL):
                others = [u.name for u in node.users if u.meta.get("delegation_tag") != tag]
                if others:
                    out[node] = f"{name}: its result is read by {others} outside the delegate"
            elif name == DEQUANTIZE:
                src = node.args[0]
                if isinstance(src, torch.fx.Node) and src.meta.get("delegation_tag") != tag:
                    out[node] = f"{name}: reads quantized {src.name} from outside the delegate"
        return out

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        """Keep ``linear`` (FullyConnected), ``hardswish``, ``gelu`` (one QNN op each) and ``max_pool2d`` (no int64
        indices output) whole."""
        aten = torch.ops.aten
        return [aten.linear.default, aten.hardswish.default, aten.gelu.default, aten.max_pool2d.default], None
