"""The planning half of :func:`edgeport_xnnpack.runtime.load`: ``_Planner`` checks a blob's values and nodes
and turns them into steps (native XNNPACK runtimes, numpy host segments, channel shuffles, fully connected
operators) with the buffers that cross them; ``plan`` runs again at other dims for a specialization
(:mod:`edgeport_xnnpack._specialize`), reusing the fully connected operators packed by the first plan
(:mod:`edgeport_xnnpack._fc_ops`); ``close_shared`` deletes them. What a plan decides from the nodes, values and
dims alone (sides, schedule, the buffers between steps) is shared with every delegate of the same structure planned
at the same dims (a decoder's layers: ``_plan.known_layout``); native runtimes and host kernels are built per plan.
The executor's own buffers of one plan share one allocation by lifetime (``_arena``)."""


from __future__ import annotations

import math
import os

import numpy as np

from edgeport.errors import ProgramError
from edgeport_xnnpack import native
from edgeport_xnnpack._arena import arena_buffers, spans
from edgeport_xnnpack._constants import NP_DTYPES as _NP
from edgeport_xnnpack._constants import NamedData, group_scales, load_constant, scales_from_buffer
from edgeport_xnnpack._define import check_static_ids, define_node, native_kind_ok
from edgeport_xnnpack._fc_ops import (
    FullyConnected,
    FullyConnectedStep,
    PackedFullyConnected,
    conv_operands,
    fc_operands,
    operator_operands,
    packed_for,
)
from edgeport_xnnpack._dynamic_quant import (
    DYNAMIC_ROWS,
    QD8,
)
from edgeport_xnnpack._host import HOST_KINDS, HostSegment, make_host_op
from edgeport_xnnpack._host_gemm import holds_filter, product_op, wants_host
from edgeport_xnnpack._host_place import absorb_scaled_transposes, absorbs_scaled_transposes
from edgeport_xnnpack._host_qd8 import qd8_op
from edgeport_xnnpack._plan import is_view, keep_layout, known_layout, place, schedule, shuffle_element_size, \
    structure_token
from edgeport_xnnpack._rewrite_int8 import INT8_MEAN, int8_transpose_ok
from edgeport_xnnpack._shapes import check_native
from edgeport_xnnpack._steps import HostStep, NativeStep, ShuffleStep
from edgeport_xnnpack.capabilities import BACKEND_ID
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

_WEIGHT_KINDS = ("XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d", "XNNFullyConnected")


def fail(msg: str) -> ProgramError:
    return ProgramError(f"{BACKEND_ID} blob: {msg}")


_MAX_ELEMENTS = 1 << 31


def _value_dims(v: TensorValue, where: str) -> tuple[int, ...]:
    if len(v.dims) > native.MAX_TENSOR_DIMS or math.prod(v.dims) > _MAX_ELEMENTS:
        raise fail(f"{where}: dims {v.dims} exceed XNNPACK's limits")
    return tuple(int(d) for d in v.dims)


class Planner:
    def __init__(self, graph: Graph, constants: memoryview, named: NamedData | None, lib: native.Library) -> None:
        self.g, self.constants, self.named, self.lib = graph, constants, named, lib
        self.values: dict[int, TensorValue] = {}
        self.dims: dict[int, tuple[int, ...]] = {}
        self.const: dict[int, np.ndarray] = {}
        self.group_scales: dict[int, np.ndarray] = {}  # qbint4 filters' float32 block scales
        self.products: frozenset[str] = frozenset()  # kinds of matrix products run on the host (_host_gemm)
        self.pool: native.ThreadPool | None = None
        self.event_ids = node_event_ids(graph)  # a step running one blob node: its id in ExecuTorch's profile
        self.fc_operators = False  # float32 fully connected nodes on shared operators (set by load; see _fc_ops)
        self.fc_packed: dict[int, PackedFullyConnected] = {}  # output value id -> the node's packed operator
        # what every plan derives from the nodes alone (shape-independent; the nodes no longer change once
        # load's rewrites are done, before the first plan): each node's inputs and outputs, why a kind is not native
        self._io: list[tuple[list[int], list[int]]] | None = None
        self._may_view: list[int] = []  # indices of the nodes _as_reshape may replace (set with _io)
        self._kind_why: dict[tuple[int, str], str | None] = {}
        self._padded: dict[int, np.ndarray] = {}  # constant id -> its padded copy (see _padded_const)
        self._groups: dict[tuple[str, ...], list[tuple[str, list[int]]]] = {}  # sides -> schedule (see _schedule)
        self._token: int | None = None  # this delegate's structure (see _layout), set by the first plan
        self._value_ids: list[int] = []

    def close_shared(self) -> None:
        """Delete the packed fully connected operators (and close every plan's runs of them)."""
        for packed in self.fc_packed.values():
            packed.close()
        self.fc_packed.clear()

    # -- checks ----------------------------------------------------------------------------------------------
    def check_values(self) -> tuple[list[int], list[int]]:
        ins, outs = [], []
        for i, v in enumerate(self.g.values):
            where = f"xvalues[{i}] (id {v.id_out})"
            if v.id_out in self.values or v.id_out == INVALID_ID:
                raise fail(f"{where}: duplicate or invalid value id")
            if v.datatype not in _NP:
                raise fail(f"{where}: datatype {v.datatype} is not supported by this executor")
            if v.quant_kind or v.dq_datatype:
                raise fail(f"{where}: dynamic or blockwise quantization is not supported by this libXNNPACK")
            if v.flags & ~(native.FLAG_EXTERNAL_INPUT | native.FLAG_EXTERNAL_OUTPUT):
                raise fail(f"{where}: unknown value flags {v.flags:#x}")
            self.values[v.id_out] = v
            self.dims[v.id_out] = _value_dims(v, where)
            if v.flags and (v.external_id >= self.g.num_externs or v.constant_buffer_idx):
                raise fail(f"{where}: external id {v.external_id} out of range 0..{self.g.num_externs - 1}")
            if v.flags == native.FLAG_EXTERNAL_INPUT:
                ins.append(v.id_out)
            elif v.flags == native.FLAG_EXTERNAL_OUTPUT:
                outs.append(v.id_out)
            elif v.flags:
                raise fail(f"{where}: a value cannot be both an external input and output")
            if v.constant_buffer_idx:
                self.const[v.id_out] = load_constant(self.g, self.constants, self.named, v, where)
            if isinstance(v.quant, PerChannelQuant) and not v.quant.scale and v.quant.scale_buffer_idx:
                self.values[v.id_out] = scales_from_buffer(self.g, self.constants, self.named, v, where)
            if (v.datatype == QBINT4) != isinstance(v.quant, PerChannelGroupQuant) or (
                    v.datatype == QBINT4 and not v.constant_buffer_idx):
                raise fail(f"{where}: qbint4 values are constant filters with blockwise (group) scales")
            if v.datatype == QBINT4:
                self.group_scales[v.id_out] = group_scales(self.g, self.constants, self.named, v, where)
        ins.sort(key=lambda i: self.values[i].external_id)
        outs.sort(key=lambda i: self.values[i].external_id)
        in_ext = [self.values[i].external_id for i in ins]
        out_ext = [self.values[i].external_id for i in outs]
        n_args = self.g.num_externs - len(outs)
        if out_ext != list(range(n_args, self.g.num_externs)) or len(set(in_ext)) != len(in_ext) or any(
                e >= n_args for e in in_ext):
            raise fail(f"external ids {in_ext} (inputs) and {out_ext} (outputs) must be distinct, inputs below "
                        f"the outputs, outputs {n_args}..{self.g.num_externs - 1} (a non-tensor argument, such as "
                        "a symbolic size, may leave an input id unused)")
        return ins, outs

    def check_nodes(self, inputs: list[int]) -> None:
        defined = set(inputs) | set(self.const)
        for i, n in enumerate(self.g.nodes):
            where = f"xnodes[{i}] ({n.kind})"
            if _missing_ids(n):
                raise fail(f"{where}: {', '.join(_missing_ids(n))} not set")
            for vid in n.inputs():
                if vid not in self.values:
                    raise fail(f"{where}: input value {vid} is not defined")
                if vid not in defined:
                    raise fail(f"{where}: reads value {vid} before any node produces it")
            for vid in n.outputs():
                if vid not in self.values:
                    raise fail(f"{where}: output value {vid} is not defined")
                if vid in defined:
                    raise fail(f"{where}: value {vid} is produced twice or is an input/constant")
                if self.values[vid].datatype != FP32 and n.kind in HOST_KINDS and not (
                        n.kind == "XNNStaticTranspose" and int8_transpose_ok(n, self.values)):
                    raise fail(f"{where}: non-float32 values are not supported here")
                defined.add(vid)
        for vid, v in self.values.items():
            if v.flags == native.FLAG_EXTERNAL_OUTPUT and vid not in defined:
                raise fail(f"external output value {vid} is produced by no node")

    # -- planning ---------------------------------------------------------------------------------------------
    def native_ok(self, n: XNode, i: int = -1) -> bool:
        """Whether node ``n`` (the ``i``-th of the blob, or -1) runs natively at the current dims."""
        if QD8 in n.fields:
            return False  # a dynamically quantized fully connected on the host kernel (_host_qd8)
        key = (i, n.kind)
        if i < 0 or key not in self._kind_why:
            why = native_kind_ok(n, lambda vid: vid in self.const, self.lib)
            if i >= 0:
                self._kind_why[key] = why
        else:
            why = self._kind_why[key]
        if why is None:
            why = check_static_ids(n, lambda vid: vid in self.const) or check_native(n, self.dims.__getitem__)
            if why is not None:
                raise fail(f"{n.kind}: {why}")
            return True
        if n.kind not in HOST_KINDS and DYNAMIC_ROWS not in n.fields and INT8_MEAN not in n.fields:
            raise fail(f"{n.kind} is not supported: {why}")
        return False

    def _as_reshape(self, n: XNode) -> XNode:
        """A view node (copy, transpose of size-1 dims) as the equivalent static reshape."""
        if n.kind == "XNNStaticReshape" or not is_view(n, self.values, self.dims):
            return n
        i, o = n.inputs()[0], n.outputs()[0]
        return XNode("XNNStaticReshape", {"num_dims": len(self.dims[o]), "new_shape": list(self.dims[o]),
                                          "input_id": i, "output_id": o, "flags": 0})

    def node_io(self) -> list[tuple[list[int], list[int]]]:
        """Each blob node's ``(inputs(), outputs())``, computed once (a view planned as a reshape keeps them)."""
        if self._io is None:
            self._io = [(n.inputs(), n.outputs()) for n in self.g.nodes]
            self._may_view = [i for i, n in enumerate(self.g.nodes) if n.kind in ("XNNStaticTranspose", "XNNCopy")]
        return self._io

    def plan(self, inputs: list[int], outputs: list[int], pool: native.ThreadPool | None) -> tuple[list, dict]:
        io = self.node_io()
        nodes = list(self.g.nodes)
        for i in self._may_view:  # only these kinds can be views planned as reshapes (see is_view)
            nodes[i] = self._as_reshape(nodes[i])
        self.pool = pool
        const = set(self.const)
        gemm, placed, groups, crossing, host_const = self._layout(nodes, io, inputs, outputs, const)
        buffers: dict[int, np.ndarray] = {vid: np.array(self.const[vid]) for vid in host_const}
        own = {v: (self.dims[v], _NP[self.values[v].datatype]) for v in crossing - set(outputs) - set(buffers)}
        steps: list[NativeStep | HostStep | ShuffleStep] = []
        external = set(inputs) | crossing
        try:
            for gi, (side, idx) in enumerate(groups):
                group = [nodes[j] for j in idx]
                if side == "N":
                    steps.append(self._segment(gi, group, [io[j] for j in idx], external, pool))
                elif side == "S":
                    steps.append(self._shuffle(group[0], placed.shuffles[idx[0]], pool))
                elif side == "F":
                    steps.append(self._fully_connected(group[0], pool))
                else:
                    steps.append(self._host(group, [io[j] for j in idx], external))
                steps[-1].debug_handles = tuple(sorted({n.debug_handle for n in group if n.debug_handle}))
                named = self.event_ids.get(id(group[0])) if len(group) == 1 else None
                steps[-1].event_id = named[1] if named is not None and named[0] is group[0] else ""
            # the executor's own values share one arena by lifetime (_arena); a reshape-only host step between two
            # of them makes the second a view of the first instead (_alias_reshapes), which the spans count
            aliases = _reshape_aliases(steps, own.keys() | buffers.keys())
            groups_io = [([v for j in idx for v in io[j][0]], [v for j in idx for v in io[j][1]]) for _, idx in groups]
            arena = own.keys() - aliases.keys()  # a view of a host constant takes no arena space either
            lifetimes = spans(groups_io, arena, {w: r for w, r in aliases.items() if _root(w, aliases) in arena})
            buffers.update(arena_buffers({v: own[v] for v in lifetimes}, lifetimes))
            steps = _alias_reshapes(steps, buffers, self.dims, aliases)
            for step in steps:  # the executor's own buffers are checked once, here
                if isinstance(step, NativeStep):
                    step.runtime.pin({k: buffers[v] for k, v in zip(step.runtime.order, step.vids, strict=True)
                                      if v in buffers})
                elif isinstance(step, (ShuffleStep, FullyConnectedStep)):
                    step.op.pin(buffers.get(step.src), buffers.get(step.dst))
        except BaseException as exc:
            for step in steps:
                step.close()
            if isinstance(exc, native.XnnpackError):
                raise fail(str(exc)) from exc
            raise
        return steps, buffers

    def _layout(self, nodes: list[XNode], io: list[tuple[list[int], list[int]]], inputs: list[int],
                outputs: list[int], const: set[int]) -> tuple:
        """What planning decides from the structure and dims alone: ``(gemm, placement, groups, crossing,
        host_const)``, taken from a delegate of the same structure planned at the same dims when there is one
        (``_plan.known_layout``; shared: read it only), else decided here and kept."""
        if self._token is None:
            self._token = structure_token(
                self.g.nodes, self.values, self.const,
                (sorted(self.products), self.fc_operators, self.lib.operators, self.lib.operators_x8,
                 self.g.num_externs, absorbs_scaled_transposes()))
            self._value_ids = sorted(self.values)
        dims = self.dims
        key = (self._token, _environment(), tuple(inputs), tuple(outputs), tuple(dims[v] for v in self._value_ids))
        layout = known_layout(key)
        if layout is None:
            layout = self._decide(nodes, io, outputs, const)
            keep_layout(key, layout)
        return layout

    def _decide(self, nodes: list[XNode], io: list[tuple[list[int], list[int]]], outputs: list[int],
                const: set[int]) -> tuple:
        gemm = frozenset(i for i, n in enumerate(nodes)
                         if wants_host(n, self.values, self.dims, const, self.products))
        nat = [self.native_ok(n, i) and i not in gemm for i, n in enumerate(nodes)]
        fc = frozenset(i for i, n in enumerate(nodes) if nat[i] and (
            (self.fc_operators and fc_operands(n, self.values, self.dims, const) is not None) or
            conv_operands(n, self.values, self.dims, const) is not None))
        placed = place(nodes, nat, self.values, self.dims, const, self.lib.operators, self.lib.operators_x8, gemm,
                       fc, io)
        absorb_scaled_transposes(nodes, placed, self.dims)  # the attention's K^T * scale read in place (_host_place)
        groups = self._schedule(nodes, placed.sides, io)
        producer: dict[int, int] = {}
        for gi, (_, idx) in enumerate(groups):
            for j in idx:
                for o in io[j][1]:
                    producer[o] = gi
        crossing: set[int] = set(outputs)
        host_const: set[int] = set()
        for gi, (side, idx) in enumerate(groups):
            for j in idx:
                held = side == "F" or QD8 in nodes[j].fields or (
                    j in gemm and holds_filter(nodes[j], self.values, self.dims, const, self.products))
                for vid in io[j][0][:1] if held else io[j][0]:  # a packed filter is its own
                    if vid in producer and producer[vid] != gi:
                        crossing.add(vid)
                    if side != "N" and vid in self.const:
                        host_const.add(vid)
                if side in ("S", "F"):
                    crossing.update(io[j][1])
        return gemm, placed, groups, frozenset(crossing), frozenset(host_const)

    def _schedule(self, nodes: list[XNode], sides: list[str],
                  io: list[tuple[list[int], list[int]]]) -> list[tuple[str, list[int]]]:
        """``schedule`` of these sides, computed once per distinct placement (it depends on nothing else: the
        nodes' inputs and outputs do not change between plans). The groups are shared: read them only."""
        key = tuple(sides)
        groups = self._groups.get(key)
        if groups is None:
            groups = self._groups[key] = schedule(nodes, sides, io)
        return groups

    def _host(self, group: list[XNode], io: list[tuple[list[int], list[int]]], materialize: set[int]) -> HostStep:
        ops = []
        dims = self.dims
        for n, (ins, outs) in zip(group, io, strict=True):
            try:
                op = qd8_op(n, dims[ins[0]], dims[outs[0]], self.pool) if QD8 in n.fields \
                    else product_op(n, self.values, dims, self.const, self.pool, self.products)
                ops.append(op or make_host_op(n, [dims[i] for i in ins], dims[outs[0]], self.pool))
            except ValueError as exc:
                raise fail(f"{n.kind}: {exc}") from exc
        kinds = sorted({n.kind.removeprefix("XNN") for n in group})
        return HostStep(HostSegment(group, ops, materialize, dims.__getitem__, io),
                        f"host[{len(group)} nodes: {', '.join(kinds)}]")

    def _shuffle(self, n: XNode, sd: tuple[int, int, int], pool: native.ThreadPool | None) -> ShuffleStep:
        try:
            size = shuffle_element_size(self.values[n.get("input_id")], self.values[n.get("output_id")])
            op = native.ChannelShuffle(*sd, pool=pool, element_size=size or 4)
        except native.XnnpackError as exc:
            raise fail(f"{n.kind}: {exc}") from exc
        return ShuffleStep(op, n.get("input_id"), n.get("output_id"),
                        f"channel_shuffle[{'x'.join(map(str, self.dims[n.get('input_id')]))} perm "
                        f"{list(n.get('perm'))}]")

    def _fully_connected(self, n: XNode, pool: native.ThreadPool | None) -> FullyConnectedStep:
        """The node on its packed operator: made by the first plan, set up at these dims by each (see _fc_ops)."""
        mkn = operator_operands(n, self.values, self.dims, self.const)
        assert mkn is not None  # placed on "F" for that reason
        rows, k, cols = mkn
        out = n.outputs()[0]
        try:
            packed = self.fc_packed.get(out)
            if packed is None:
                lo, hi = n.output_min_max or (-math.inf, math.inf)
                packed = self.fc_packed[out] = packed_for(n, k, cols, self.const, lo, hi)
            op = FullyConnected(packed, rows, pool)
        except (native.XnnpackError, ValueError) as exc:
            raise fail(f"{n.kind}: {exc}") from exc
        what = "convolution_1x1" if n.kind == "XNNConv2d" else "fully_connected"
        return FullyConnectedStep(op, n.inputs()[0], out, f"{what}[{rows}x{k} -> {cols}]")

    def _segment(self, gi: int, nodes: list[XNode], io: list[tuple[list[int], list[int]]], external: set[int],
                 pool: native.ThreadPool | None) -> NativeStep:
        used: list[int] = []
        seen: set[int] = set()
        for ins, outs in io:
            for vid in (*ins, *outs):
                if vid not in seen:
                    seen.add(vid)
                    used.append(vid)
        produced = {o for _, outs in io for o in outs}
        weights: set[int] = set()
        others: set[int] = set()  # values some node reads as a non-weight input
        for n, (ins, _) in zip(nodes, io):
            w = _weights(n)
            weights.update(w)
            others.update(v for v in ins if v not in w)
        ext = [vid for vid in used if vid in external and vid not in self.const]
        ext_at = {vid: k for k, vid in enumerate(ext)}
        sg = native.Subgraph(len(ext))
        try:
            ids: dict[int, int] = {INVALID_ID: INVALID_ID}
            bind = []
            for vid in used:
                v, dims = self.values[vid], self.dims[vid]
                data = None
                if vid in self.const:
                    if vid not in weights or vid in others:
                        data = self._padded_const(vid)  # XNNPACK keeps a pointer to non-packed static data
                    else:
                        data = np.ascontiguousarray(self.const[vid])
                if vid in ext_at:
                    k = ext_at[vid]
                    flags = native.FLAG_EXTERNAL_OUTPUT if vid in produced else native.FLAG_EXTERNAL_INPUT
                    ids[vid] = self._define(sg, v, dims, None, k, flags)
                    bind.append((k, vid))
                else:
                    ids[vid] = self._define(sg, v, dims, data, INVALID_ID, 0)

            def new_internal(dims: tuple[int, ...]) -> int:
                return sg.define_tensor(FP32, dims)

            for n, n_io in zip(nodes, io, strict=True):
                define_node(sg, n, ids, self.dims, new_internal, n_io)
            runtime = native.Runtime(sg, pool)
        except (native.XnnpackError, ValueError) as exc:
            raise fail(f"step {gi} ({', '.join(sorted({n.kind for n in nodes}))}): {exc}") from exc
        finally:
            sg.close()
        by_ext = dict(bind)
        return NativeStep(runtime, [by_ext[k] for k in runtime.order], f"xnnpack[{len(nodes)} nodes]")

    def _padded_const(self, vid: int) -> np.ndarray:
        """A padded copy of constant ``vid`` for a native runtime to read in place, made once and shared by every
        plan's runtimes (none writes it; the planner keeps it alive as long as the handle)."""
        data = self._padded.get(vid)
        if data is None:
            data = self._padded[vid] = _padded_copy(np.ascontiguousarray(self.const[vid]))
        return data

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


_DECIDERS = ("wants_host", "holds_filter", "place", "absorb_scaled_transposes", "fc_operands", "conv_operands",
             "schedule", "is_view", "check_native", "check_static_ids", "native_kind_ok")


def _environment() -> tuple:
    """What a layout's decisions read besides the delegate's structure and dims: the functions that make them and
    the module settings those read (fixed in a process unless replaced, as tests do; a layout made with others is
    not taken). The objects themselves, so the key keeps them alive and equal only to themselves."""
    from edgeport_xnnpack import _fc_ops, _host, _host_conv, _host_gemm, _host_qs8
    from edgeport_xnnpack import _plan as plan_module

    g = globals()
    return (*(g[name] for name in _DECIDERS), Planner.native_ok, Planner._as_reshape, Planner._schedule,
            _host._bmm, _host_gemm._gemm, _host_gemm.MIN_MACS, _host_gemm.MIN_FLOAT_ROWS, _host_gemm.product_dims,
            _host_gemm.gemm_dims, _host_gemm.packs_filter, _host_qs8.qs8_dims, _host_conv.conv_dims,
            _fc_ops.HOST_KERNEL, _fc_ops.MIN_CONV_MACS,
            os.environ.get(_host_conv.ISA_ENV, ""), plan_module.is_view, plan_module.shuffle_dims,
            plan_module.valid_perm, plan_module.squeeze_perm)


def _root(v: int, aliases: dict[int, int]) -> int:
    while v in aliases:
        v = aliases[v]
    return v


def _reshape_aliases(steps: list, held: set[int]) -> dict[int, int]:
    """``written -> read`` of the host steps :func:`_alias_reshapes` will drop (both values in ``held``)."""
    out = {}
    for step in steps:
        if isinstance(step, HostStep) and step.segment.reshape_only:
            (reads, writes) = step.segment.io
            if len(reads) == 1 and len(writes) == 1 and reads[0] in held and writes[0] in held:
                out[writes[0]] = reads[0]
    return out


def _alias_reshapes(steps: list, buffers: dict[int, np.ndarray], dims: dict[int, tuple[int, ...]],
                    aliases: dict[int, int]) -> list:
    """Drop the host steps of ``aliases`` (see :func:`_reshape_aliases`), each of which only reshapes one of the
    executor's buffers into another: the second becomes a view of the first (same bytes, same padding), so nothing
    is copied per call. Values are written once, and the arena keeps the first alive while the view is read."""
    kept = []
    for step in steps:
        if isinstance(step, HostStep) and step.segment.reshape_only and step.segment.io[1][0] in aliases:
            (reads, writes) = step.segment.io
            buffers[writes[0]] = buffers[reads[0]].reshape(dims[writes[0]])
            continue
        kept.append(step)
    return kept


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


def _padded_copy(a: np.ndarray) -> np.ndarray:
    raw = np.zeros(a.nbytes + native.EXTRA_BYTES, np.uint8)
    raw[: a.nbytes] = a.reshape(-1).view(np.uint8)
    return raw[: a.nbytes].view(a.dtype).reshape(a.shape)
