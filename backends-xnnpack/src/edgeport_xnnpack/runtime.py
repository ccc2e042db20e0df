"""``XnnpackExecutor``: runs XNNPACK delegate blobs (edgeport's and ExecuTorch's) on libXNNPACK. Torch-free.

``init`` reads and checks the blob (any malformation -> :class:`~edgeport.errors.ProgramError`) and plans it
(:mod:`edgeport_xnnpack._plan`): each node runs in a native XNNPACK subgraph/runtime, in a numpy host segment
(nodes this libXNNPACK lacks: batch matrix multiply, slice, concatenate, ...; reshapes, transposes and slices
there are free views) or, for 2-D transposes such as NCHW <-> NHWC, on XNNPACK's channel-shuffle operator; the
nodes are reordered (dependencies kept) so that each kind clusters into few steps. Values crossing a step get a
padded buffer allocated once. Constants are read-only views of the blob or the program's named data (no copy);
XNNPACK packs most when a runtime is created, the few it keeps pointers to are copied per runtime. The views
stay referenced for re-specializing (below). ``execute(handle, inputs, out=None)`` binds the
caller's arrays and the ``out`` arrays (or fresh ones) without copying them, re-runs XNNPACK's setup only when
a bound pointer changed, and keeps no reference to them afterwards. ``destroy`` frees every native object.

Dynamic shapes: a blob declares upper-bound dims. Inputs smaller in some dims run on a *specialization* for
their shapes (:mod:`edgeport_xnnpack._specialize`): every value's dims are inferred and the same planning and
subgraph definition run at those dims (weights are packed again, per specialization); a small LRU cache keeps
the last few.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgeport.backend import CompileSpec, RuntimeExecutor
from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport_xnnpack import native
from edgeport_xnnpack._call import input_arrays, results_for
from edgeport_xnnpack._constants import NP_DTYPES as _NP
from edgeport_xnnpack._constants import NamedData, group_scales, load_constant, scales_from_buffer
from edgeport_xnnpack._define import check_static_ids, define_node, native_kind_ok
from edgeport_xnnpack._direct import direct_call
from edgeport_xnnpack._dynamic_quant import (
    DYNAMIC_ROWS,
    QD8,
    dequantize_dynamic_filters,
    emulate_dynamic_values,
    host_dynamic_products,
)
from edgeport_xnnpack._host import HOST_KINDS, HostSegment, make_host_op
from edgeport_xnnpack._host_gemm import describe, holds_filter, product_op, resolve, wants_host
from edgeport_xnnpack._host_qd8 import kernel_available as qd8_available
from edgeport_xnnpack._host_qd8 import qd8_op
from edgeport_xnnpack._plan import is_view, place, schedule, shuffle_element_size
from edgeport_xnnpack._rewrite_int8 import INT8_MEAN, int8_transpose_ok, rewrite_int8
from edgeport_xnnpack._shapes import check_native
from edgeport_xnnpack._specialize import Plan, Specializer, specializations_from_env
from edgeport_xnnpack._steps import HostStep, NativeStep, ShuffleStep, XnnpackHandle
from edgeport_xnnpack.capabilities import BACKEND_ID
from edgeport_xnnpack.options import XnnpackCompileOptions, XnnpackRuntimeOptions
from edgeport_xnnpack.schema.graph import (
    CAT_INPUTS,
    FP32,
    INPUT_FIELDS,
    INVALID_ID,
    QBINT4,
    Graph,
    PerChannelGroupQuant,
    PerChannelQuant,
    TensorValue,
    XNode,
    node_layout,
)
from edgeport_xnnpack.schema.operator_names import node_event_ids
from edgeport_xnnpack.schema.reader import BlobError, read_blob

_WEIGHT_KINDS = ("XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d", "XNNFullyConnected")


def _fail(msg: str) -> ProgramError:
    return ProgramError(f"{BACKEND_ID} blob: {msg}")


_MAX_ELEMENTS = 1 << 31


def _value_dims(v: TensorValue, where: str) -> tuple[int, ...]:
    if len(v.dims) > native.MAX_TENSOR_DIMS or math.prod(v.dims) > _MAX_ELEMENTS:
        raise _fail(f"{where}: dims {v.dims} exceed XNNPACK's limits")
    return tuple(int(d) for d in v.dims)


class _Planner:
    def __init__(self, graph: Graph, constants: memoryview, named: NamedData | None, lib: native.Library) -> None:
        self.g, self.constants, self.named, self.lib = graph, constants, named, lib
        self.values: dict[int, TensorValue] = {}
        self.dims: dict[int, tuple[int, ...]] = {}
        self.const: dict[int, np.ndarray] = {}
        self.group_scales: dict[int, np.ndarray] = {}  # qbint4 filters' float32 block scales
        self.products: frozenset[str] = frozenset()  # kinds of matrix products run on the host (_host_gemm)
        self.pool: native.ThreadPool | None = None
        self.event_ids = node_event_ids(graph)  # a step running one blob node: its id in ExecuTorch's profile

    # -- checks ----------------------------------------------------------------------------------------------
    def check_values(self) -> tuple[list[int], list[int]]:
        ins, outs = [], []
        for i, v in enumerate(self.g.values):
            where = f"xvalues[{i}] (id {v.id_out})"
            if v.id_out in self.values or v.id_out == INVALID_ID:
                raise _fail(f"{where}: duplicate or invalid value id")
            if v.datatype not in _NP:
                raise _fail(f"{where}: datatype {v.datatype} is not supported by this executor")
            if v.quant_kind or v.dq_datatype:
                raise _fail(f"{where}: dynamic or blockwise quantization is not supported by this libXNNPACK")
            if v.flags & ~(native.FLAG_EXTERNAL_INPUT | native.FLAG_EXTERNAL_OUTPUT):
                raise _fail(f"{where}: unknown value flags {v.flags:#x}")
            self.values[v.id_out] = v
            self.dims[v.id_out] = _value_dims(v, where)
            if v.flags and (v.external_id >= self.g.num_externs or v.constant_buffer_idx):
                raise _fail(f"{where}: external id {v.external_id} out of range 0..{self.g.num_externs - 1}")
            if v.flags == native.FLAG_EXTERNAL_INPUT:
                ins.append(v.id_out)
            elif v.flags == native.FLAG_EXTERNAL_OUTPUT:
                outs.append(v.id_out)
            elif v.flags:
                raise _fail(f"{where}: a value cannot be both an external input and output")
            if v.constant_buffer_idx:
                self.const[v.id_out] = load_constant(self.g, self.constants, self.named, v, where)
            if isinstance(v.quant, PerChannelQuant) and not v.quant.scale and v.quant.scale_buffer_idx:
                self.values[v.id_out] = scales_from_buffer(self.g, self.constants, self.named, v, where)
            if (v.datatype == QBINT4) != isinstance(v.quant, PerChannelGroupQuant) or (
                    v.datatype == QBINT4 and not v.constant_buffer_idx):
                raise _fail(f"{where}: qbint4 values are constant filters with blockwise (group) scales")
            if v.datatype == QBINT4:
                self.group_scales[v.id_out] = group_scales(self.g, self.constants, self.named, v, where)
        ins.sort(key=lambda i: self.values[i].external_id)
        outs.sort(key=lambda i: self.values[i].external_id)
        in_ext = [self.values[i].external_id for i in ins]
        out_ext = [self.values[i].external_id for i in outs]
        n_args = self.g.num_externs - len(outs)
        if out_ext != list(range(n_args, self.g.num_externs)) or len(set(in_ext)) != len(in_ext) or any(
                e >= n_args for e in in_ext):
            raise _fail(f"external ids {in_ext} (inputs) and {out_ext} (outputs) must be distinct, inputs below "
                        f"the outputs, outputs {n_args}..{self.g.num_externs - 1} (a non-tensor argument, such as "
                        "a symbolic size, may leave an input id unused)")
        return ins, outs

    def check_nodes(self, inputs: list[int]) -> None:
        defined = set(inputs) | set(self.const)
        for i, n in enumerate(self.g.nodes):
            where = f"xnodes[{i}] ({n.kind})"
            if _missing_ids(n):
                raise _fail(f"{where}: {', '.join(_missing_ids(n))} not set")
            for vid in n.inputs():
                if vid not in self.values:
                    raise _fail(f"{where}: input value {vid} is not defined")
                if vid not in defined:
                    raise _fail(f"{where}: reads value {vid} before any node produces it")
            for vid in n.outputs():
                if vid not in self.values:
                    raise _fail(f"{where}: output value {vid} is not defined")
                if vid in defined:
                    raise _fail(f"{where}: value {vid} is produced twice or is an input/constant")
                if self.values[vid].datatype != FP32 and n.kind in HOST_KINDS and not (
                        n.kind == "XNNStaticTranspose" and int8_transpose_ok(n, self.values)):
                    raise _fail(f"{where}: non-float32 values are not supported here")
                defined.add(vid)
        for vid, v in self.values.items():
            if v.flags == native.FLAG_EXTERNAL_OUTPUT and vid not in defined:
                raise _fail(f"external output value {vid} is produced by no node")

    # -- planning ---------------------------------------------------------------------------------------------
    def native_ok(self, n: XNode) -> bool:
        if QD8 in n.fields:
            return False  # a dynamically quantized fully connected on the host kernel (_host_qd8)
        why = native_kind_ok(n, lambda vid: vid in self.const, self.lib)
        if why is None:
            why = check_static_ids(n, lambda vid: vid in self.const) or check_native(n, self.dims.__getitem__)
            if why is not None:
                raise _fail(f"{n.kind}: {why}")
            return True
        if n.kind not in HOST_KINDS and DYNAMIC_ROWS not in n.fields and INT8_MEAN not in n.fields:
            raise _fail(f"{n.kind} is not supported: {why}")
        return False

    def _as_reshape(self, n: XNode) -> XNode:
        """A view node (copy, transpose of size-1 dims) as the equivalent static reshape."""
        if n.kind == "XNNStaticReshape" or not is_view(n, self.values, self.dims):
            return n
        i, o = n.inputs()[0], n.outputs()[0]
        return XNode("XNNStaticReshape", {"num_dims": len(self.dims[o]), "new_shape": list(self.dims[o]),
                                          "input_id": i, "output_id": o, "flags": 0})

    def plan(self, inputs: list[int], outputs: list[int], pool: native.ThreadPool | None) -> tuple[list, dict]:
        nodes = [self._as_reshape(n) for n in self.g.nodes]
        self.pool = pool
        const = set(self.const)
        gemm = frozenset(i for i, n in enumerate(nodes)
                         if wants_host(n, self.values, self.dims, const, self.products))
        nat = [self.native_ok(n) and i not in gemm for i, n in enumerate(nodes)]
        placed = place(nodes, nat, self.values, self.dims, const, self.lib.operators, self.lib.operators_x8, gemm)
        groups = schedule(nodes, placed.sides)
        producer: dict[int, int] = {}
        for gi, (_, idx) in enumerate(groups):
            for j in idx:
                for o in nodes[j].outputs():
                    producer[o] = gi
        crossing: set[int] = set(outputs)
        host_const: set[int] = set()
        for gi, (side, idx) in enumerate(groups):
            for j in idx:
                held = QD8 in nodes[j].fields or (
                    j in gemm and holds_filter(nodes[j], self.values, self.dims, const, self.products))
                for vid in nodes[j].inputs()[:1] if held else nodes[j].inputs():  # a packed filter is its own
                    if vid in producer and producer[vid] != gi:
                        crossing.add(vid)
                    if side != "N" and vid in self.const:
                        host_const.add(vid)
                if side == "S":
                    crossing.update(nodes[j].outputs())
        buffers: dict[int, np.ndarray] = {vid: np.array(self.const[vid]) for vid in host_const}
        for vid in sorted(crossing - set(outputs) - set(buffers)):
            buffers[vid] = native.padded_empty(self.dims[vid], _NP[self.values[vid].datatype])
        steps: list[NativeStep | HostStep | ShuffleStep] = []
        external = set(inputs) | crossing
        try:
            for gi, (side, idx) in enumerate(groups):
                group = [nodes[j] for j in idx]
                if side == "N":
                    steps.append(self._segment(gi, group, external, pool))
                elif side == "S":
                    steps.append(self._shuffle(group[0], placed.shuffles[idx[0]], pool))
                else:
                    steps.append(self._host(group, external))
                steps[-1].debug_handles = tuple(sorted({n.debug_handle for n in group if n.debug_handle}))
                named = self.event_ids.get(id(group[0])) if len(group) == 1 else None
                steps[-1].event_id = named[1] if named is not None and named[0] is group[0] else ""
            for step in steps:  # the executor's own buffers are checked once, here
                if isinstance(step, NativeStep):
                    step.runtime.pin({k: buffers[v] for k, v in zip(step.runtime.order, step.vids, strict=True)
                                      if v in buffers})
                elif isinstance(step, ShuffleStep):
                    step.op.pin(buffers.get(step.src), buffers.get(step.dst))
        except BaseException as exc:
            for step in steps:
                step.close()
            if isinstance(exc, native.XnnpackError):
                raise _fail(str(exc)) from exc
            raise
        return steps, buffers

    def _host(self, group: list[XNode], materialize: set[int]) -> HostStep:
        ops = []
        for n in group:
            try:
                op = qd8_op(n, self.dims[n.inputs()[0]], self.dims[n.outputs()[0]], self.pool) if QD8 in n.fields \
                    else product_op(n, self.values, self.dims, self.const, self.pool, self.products)
                ops.append(op or make_host_op(n, [self.dims[i] for i in n.inputs()], self.dims[n.outputs()[0]],
                                              self.pool))
            except ValueError as exc:
                raise _fail(f"{n.kind}: {exc}") from exc
        kinds = sorted({n.kind.removeprefix("XNN") for n in group})
        return HostStep(HostSegment(group, ops, materialize, self.dims.__getitem__),
                     f"host[{len(group)} nodes: {', '.join(kinds)}]")

    def _shuffle(self, n: XNode, sd: tuple[int, int, int], pool: native.ThreadPool | None) -> ShuffleStep:
        try:
            size = shuffle_element_size(self.values[n.get("input_id")], self.values[n.get("output_id")])
            op = native.ChannelShuffle(*sd, pool=pool, element_size=size or 4)
        except native.XnnpackError as exc:
            raise _fail(f"{n.kind}: {exc}") from exc
        return ShuffleStep(op, n.get("input_id"), n.get("output_id"),
                        f"channel_shuffle[{'x'.join(map(str, self.dims[n.get('input_id')]))} perm "
                        f"{list(n.get('perm'))}]")

    def _segment(self, gi: int, nodes: list[XNode], external: set[int], pool: native.ThreadPool | None) -> NativeStep:
        used: list[int] = []
        seen: set[int] = set()
        for n in nodes:
            for vid in (*n.inputs(), *n.outputs()):
                if vid not in seen:
                    seen.add(vid)
                    used.append(vid)
        produced = {o for n in nodes for o in n.outputs()}
        weights = {w for n in nodes for w in _weights(n)}
        ext = [vid for vid in used if vid in external and vid not in self.const]
        sg = native.Subgraph(len(ext))
        try:
            ids: dict[int, int] = {INVALID_ID: INVALID_ID}
            bind = []
            for vid in used:
                v, dims = self.values[vid], self.dims[vid]
                data = None
                if vid in self.const:
                    data = np.ascontiguousarray(self.const[vid])
                    if vid not in weights or any(vid in _other_inputs(n) for n in nodes):
                        data = _padded_copy(data)  # XNNPACK keeps a pointer to non-packed static data
                if vid in ext:
                    k = ext.index(vid)
                    flags = native.FLAG_EXTERNAL_OUTPUT if vid in produced else native.FLAG_EXTERNAL_INPUT
                    ids[vid] = self._define(sg, v, dims, None, k, flags)
                    bind.append((k, vid))
                else:
                    ids[vid] = self._define(sg, v, dims, data, INVALID_ID, 0)

            def new_internal(dims: tuple[int, ...]) -> int:
                return sg.define_tensor(FP32, dims)

            for n in nodes:
                define_node(sg, n, ids, self.dims, new_internal)
            runtime = native.Runtime(sg, pool)
        except (native.XnnpackError, ValueError) as exc:
            raise _fail(f"step {gi} ({', '.join(sorted({n.kind for n in nodes}))}): {exc}") from exc
        finally:
            sg.close()
        by_ext = dict(bind)
        return NativeStep(runtime, [by_ext[k] for k in runtime.order], f"xnnpack[{len(nodes)} nodes]")

    @staticmethod
    def _define(sg: native.Subgraph, v: TensorValue, dims: tuple[int, ...], data: np.ndarray | None, ext: int,
                flags: int) -> int:
        q = v.quant
        if q is None:
            return sg.define_tensor(v.datatype, dims, data, ext, flags)
        if hasattr(q, "zero_point"):
            return sg.define_quantized_tensor(v.datatype, q.zero_point, q.scale, dims, data, ext, flags)
        return sg.define_channelwise_quantized_tensor(v.datatype, np.asarray(q.scale), dims, q.channel_dim, data,
                                                      ext, flags)


def _weights(n: XNode) -> tuple[int, ...]:
    if n.kind in _WEIGHT_KINDS:
        return (n.get("filter_id"), n.get("bias_id"))
    return ()


def _missing_ids(n: XNode) -> list[str]:
    """Input id fields ``n`` must set but leaves at ``INVALID_ID`` (``XNode.inputs()`` skips those)."""
    names = [f for f, _ in node_layout(n.kind) if f in INPUT_FIELDS and f not in ("bias_id", "mask_id")]
    if n.kind in CAT_INPUTS:
        names = [f"input{k + 1}_id" for k in range(CAT_INPUTS[n.kind])]
    return [f for f in names if n.get(f) == INVALID_ID]


def _other_inputs(n: XNode) -> list[int]:
    w = _weights(n)
    return [i for i in n.inputs() if i not in w]


def _padded_copy(a: np.ndarray) -> np.ndarray:
    raw = np.zeros(a.nbytes + native.EXTRA_BYTES, np.uint8)
    raw[: a.nbytes] = a.reshape(-1).view(np.uint8)
    return raw[: a.nbytes].view(a.dtype).reshape(a.shape)


def load(processed: Any, compile_specs: Sequence[CompileSpec] = (), named_data: NamedData | None = None,
         num_threads: int | None = None, max_specializations: int | None = None,
         fully_connected: str = "auto") -> XnnpackHandle:
    """Parse, check and build a blob (the body of :meth:`XnnpackExecutor.init`); ``fully_connected``: where
    float32 fully-connected layers and 1x1 convolutions run (see ``_host_gemm``)."""
    try:
        options = XnnpackCompileOptions.from_compile_specs(list(compile_specs))
    except ValueError as exc:
        raise ProgramError(f"{BACKEND_ID}: {exc}") from exc
    capacity = specializations_from_env(max_specializations)
    try:
        lib = native.library()
    except native.XnnpackError as exc:
        raise RuntimeExecutionError(f"{BACKEND_ID}: {exc}") from exc
    try:
        graph, constants = read_blob(processed)
    except (BlobError, TypeError) as exc:
        raise _fail(str(exc)) from exc
    try:  # qdint8 (dynamic int8) values: float32 values holding the dequantized numbers, see _dynamic_quant
        dynamic = emulate_dynamic_values(graph)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    planner = _Planner(graph, constants, named_data, lib)
    inputs, outputs = planner.check_values()
    try:  # qint8 x qcint8 fully connected -> 1x1 convolution; int8 transposes (see _rewrite_int8)
        rewrite_int8(graph, planner.values, planner.dims, planner.const)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    planner.check_nodes(inputs)
    try:
        planner.products = resolve(fully_connected)
    except ValueError as exc:
        raise RuntimeExecutionError(f"{BACKEND_ID}: {exc}") from exc
    held: set[int] = set()
    if dynamic:
        try:
            if fully_connected != "xnnpack" and qd8_available():  # "xnnpack": XNNPACK's float32 kernels
                held = host_dynamic_products(graph, dynamic, planner.values, planner.const, planner.group_scales)
            dequantize_dynamic_filters(graph, dynamic, planner.values, planner.const, planner.group_scales)
        except ValueError as exc:
            raise _fail(str(exc)) from exc
    if any(v.datatype == QBINT4 and vid not in held for vid, v in planner.values.items()):
        raise _fail("a qbint4 filter is read by a node other than a fully connected over a qdint8 input; this "
                    "executor runs blockwise 4-bit weights only in dynamically quantized fully connected nodes")
    threads = num_threads or options.num_threads
    pool = native.shared_pools.acquire(threads) if threads != 1 else None
    ins, outs = [(i, planner.dims[i]) for i in inputs], [(o, planner.dims[o]) for o in outputs]
    steps: list[NativeStep | HostStep | ShuffleStep] = []
    try:
        steps, buffers = planner.plan(inputs, outputs, pool)
        direct = direct_call(ins, outs, steps, buffers)
    except BaseException:
        for step in steps:
            step.close()
        if pool is not None:
            native.shared_pools.release(pool)
        raise
    summary = {"native_steps": sum(isinstance(s, NativeStep) for s in steps),
               "host_steps": sum(isinstance(s, HostStep) for s in steps),
               "operator_steps": sum(isinstance(s, ShuffleStep) for s in steps), "nodes": len(graph.nodes),
               "fully_connected": describe(planner.products)}
    base = dict(planner.dims)

    def build(dims: dict[int, tuple[int, ...]]) -> tuple[list, dict]:
        planner.dims = dims  # the same planning and subgraph definition as above, at other dims
        try:
            return planner.plan(inputs, outputs, pool)
        finally:
            planner.dims = base

    slots = [planner.values[i].external_id for i in inputs]
    n_args = graph.num_externs - len(outputs)
    specializer = Specializer(graph.nodes, base, ins, outs, build, capacity)
    return XnnpackHandle(ins, outs, steps, buffers, pool, summary, direct=direct, n_args=n_args,
                         arg_slots=None if slots == list(range(n_args)) else tuple(slots), specializer=specializer)


class XnnpackExecutor(RuntimeExecutor):
    """Runtime executor of ``XnnpackBackend`` (see the module docstring). ``max_specializations``: input-shape
    specializations kept per delegate (default ``$EDGEPORT_XNNPACK_SPECIALIZATIONS`` or 8; 0: only the declared
    shapes run)."""

    thread_safe = True  # execute serializes the runs of its handles under its own lock
    pure = True  # no state: the same inputs give the same outputs (the runtime folds calls on constants at load)

    def __init__(self, num_threads: int | None = None, max_specializations: int | None = None) -> None:
        self.num_threads = num_threads
        self.max_specializations = max_specializations
        self._lock = threading.Lock()

    def is_available(self) -> tuple[bool, str]:
        return native.is_available()

    def init(self, processed: memoryview, compile_specs: Sequence[CompileSpec] = (), *,
             named_data: NamedData | None = None,
             runtime_options: XnnpackRuntimeOptions | None = None) -> XnnpackHandle:
        threads = self.num_threads
        if runtime_options is not None and runtime_options.num_threads:
            threads = runtime_options.num_threads
        fully_connected = runtime_options.fully_connected if runtime_options is not None else "auto"
        return load(processed, compile_specs, named_data, threads, self.max_specializations, fully_connected)

    def num_outputs(self, handle: XnnpackHandle) -> int:
        """Outputs of the delegate (its trailing call arguments): the blob says, so a call whose inputs include
        state (a mutable buffer the program planned) is split into inputs and outputs without guessing."""
        if type(handle) is not XnnpackHandle:
            raise RuntimeExecutionError(f"{BACKEND_ID}: num_outputs needs a handle from init")
        return len(handle.outputs)

    def execute(self, handle: XnnpackHandle, inputs: Sequence[Any],
                out: Sequence[np.ndarray | None] | None = None) -> list[np.ndarray]:
        """Run the delegate. ``out`` (optional): one entry per output, a writable C-contiguous float32 array of
        the output's shape to compute into, or ``None``; the returned list holds those same arrays (it is ``out``
        itself when ``out`` is a list without ``None`` entries). Inputs smaller than declared in some dims run
        on a specialization for their shapes (see :mod:`edgeport_xnnpack._specialize`); their outputs have the
        shapes that follow (``out`` entries for them are ``None`` or arrays of those shapes)."""
        if type(handle) is not XnnpackHandle or not handle.alive:
            raise RuntimeExecutionError(f"{BACKEND_ID}: execute needs a live handle from init")
        if len(inputs) != handle.n_args:
            raise RuntimeExecutionError(f"{BACKEND_ID}: expected {handle.n_args} inputs, got {len(inputs)}")
        if handle.arg_slots is not None:  # non-tensor arguments (symbolic sizes) are not read
            inputs = [inputs[k] for k in handle.arg_slots]
        direct = handle.direct
        tracer = handle.tracer
        if tracer is not None:
            direct = None  # step by step, timing each step
        if direct is not None and type(out) is list:
            with self._lock:
                if not handle.alive:  # destroyed meanwhile (destroy takes this lock)
                    raise RuntimeExecutionError(f"{BACKEND_ID}: execute needs a live handle from init")
                try:
                    direct(inputs, out)
                    return out
                except (ValueError, native.XnnpackError):
                    pass  # the general path below converts what it can, specializes, or raises the precise error
        if tracer is None and (out is None or type(out) is list):
            tried = direct is not None and type(out) is list and all(a is not None for a in out)  # just refused
            results = self._known_shapes(handle, inputs, out, skip_declared=tried)
            if results is not None:
                return results
        arrays, declared = input_arrays(handle, inputs)
        step = None
        with self._lock:
            if not handle.alive:
                raise RuntimeExecutionError(f"{BACKEND_ID}: execute needs a live handle from init")
            plan: XnnpackHandle | Plan = handle
            if not declared:
                plan = handle.specializer.plan_for([a.shape for a in arrays])
            results = results_for(plan, out)
            env = dict(plan.buffers)  # per call: no reference to the caller's arrays outlives it
            for (vid, _), a in zip(plan.inputs, arrays):
                env[vid] = a
            for (vid, _), r in zip(plan.outputs, results):
                env[vid] = r
            try:
                if tracer is None:
                    for step in plan.steps:
                        step.run(env)
                else:
                    for k, step in enumerate(plan.steps):
                        start = tracer.now_ns()
                        step.run(env)
                        tracer.log_profiling_delegate(step.label, step.event_id or f"step {k}: {step.label}", start,
                                                      tracer.now_ns(), debug_handles=step.debug_handles)
            except (native.XnnpackError, ValueError) as exc:
                label = step.label if step is not None else "?"
                raise RuntimeExecutionError(f"{BACKEND_ID}: {label} failed: {exc}") from exc
        return results

    def _known_shapes(self, handle: XnnpackHandle, inputs: Sequence[Any], out: list[Any] | None,
                      skip_declared: bool) -> list[np.ndarray] | None:
        """The direct call of a cached specialization whose input shapes these are (or of the declared shapes when
        ``out`` has ``None`` entries), outputs from ``results_for`` as on the general path; ``None`` when it does
        not apply or refuses the arrays (the general path then converts, specializes or raises)."""
        key = []
        for a in inputs:
            if type(a) is not np.ndarray:
                return None
            key.append(a.shape)
        shapes = tuple(key)
        with self._lock:
            if not handle.alive:
                raise RuntimeExecutionError(f"{BACKEND_ID}: execute needs a live handle from init")
            plan: XnnpackHandle | Plan | None
            if shapes == handle.declared:
                plan, call = handle, None if skip_declared else handle.direct
            else:
                plan = handle.specializer.known(shapes)
                call = plan.direct if plan is not None else None
            if call is None:
                return None
            try:
                results = results_for(plan, out)
            except RuntimeExecutionError:
                return None  # the general path raises it after checking the inputs
            try:
                call(inputs, results)
            except (ValueError, native.XnnpackError):
                return None
        return results

    def set_event_tracer(self, handle: XnnpackHandle, tracer: Any) -> None:
        """While ``tracer`` is set (the program records an ETDump), each call reports every step -- a native
        XNNPACK runtime, a numpy host segment, a channel shuffle -- as a delegate sub-event named by its label
        (delegate debug id ``"step K: <label>"``, or for a step of one blob node the id ExecuTorch's XNNPACK
        delegate reports that node's operator under), with the debug handles of the edge nodes it carries out. The
        2022 library has no per-operator profiling, so a step is the finest unit timed. ``None`` turns it off."""
        if isinstance(handle, XnnpackHandle):
            handle.tracer = tracer

    def destroy(self, handle: XnnpackHandle) -> None:
        if not isinstance(handle, XnnpackHandle):
            return
        with self._lock:  # never under a running call of this executor
            if not handle.alive:
                return
            handle.alive = False
            handle.direct = None
            for step in handle.steps:
                step.close()
            handle.steps, handle.buffers = [], {}
            handle.specializer.close()
            if handle.pool is not None:
                native.shared_pools.release(handle.pool)
                handle.pool = None
