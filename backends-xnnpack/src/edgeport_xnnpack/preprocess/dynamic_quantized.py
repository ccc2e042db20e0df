"""Dynamic int8 linears: ``choose_qparams -> quantize -> dequantize -> linear`` becomes ExecuTorch's dynamically
quantized fully connected.

``XnnpackQuantizer(dynamic=True)`` + ``convert_pt2e`` leave, for each linear::

    scale, zp = choose_qparams.tensor(x, -128, 127, eps, int8)
    xq = dequantize_per_tensor.tensor(quantize_per_tensor.tensor(x, scale, zp, ...), scale, zp, ...)
    y = linear(xq, dequantize_per_channel(w_int8, w_scales, 0, 0, ...), bias)

which is lowered as ExecuTorch's XNNPACK delegate lowers it: an ``XNNConvert`` of the float input to a ``qdint8``
value (``PerTokenDynamicQuant``: XNNPACK computes asymmetric int8 parameters for each row at run time -- finer than
the graph's one set per tensor, so results differ from the quantized eager model by less than its own
quantization error) and an ``XNNFullyConnected`` of that value with the ``qcint8`` filter and a float32 bias,
producing float32. The ``choose_qparams`` / ``quantize`` / ``dequantize`` nodes and the getitems emit nothing.
Several linears reading the same dequantized input share one convert.

torchao ``quantize_`` linears (``torchao.choose_qparams_affine`` / ``quantize_affine`` / ``dequantize_affine``,
:mod:`~edgeport_xnnpack.preprocess.affine_quantized`) are lowered the same way, with a ``qcint8`` filter (int8
per channel) or a ``qbint4`` filter (int4 per group: bfloat16 scales in the constant data, as ExecuTorch 1.5.1).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from edgeport.aot.capability_partitioner import op_name
from edgeport.errors import LoweringError
from edgeport_xnnpack.preprocess.affine_quantized import (
    BlockWeight,
    affine_input_pattern,
    affine_weight,
    bf16_round,
    pack_int4,
)
from edgeport_xnnpack.preprocess.builder import ALIGNMENT, NCHW, GraphBuilder, Val
from edgeport_xnnpack.preprocess.quant_values import (
    CHOOSE,
    DQT,
    QT,
    SkipInt8,
    Weight,
    is_op,
    new_constant,
    new_value,
    qarg,
)
from edgeport_xnnpack.schema.graph import (
    FP32,
    INVALID_ID,
    QBINT4,
    QCINT8,
    QDINT8,
    ConstantDataOffset,
    PerChannelGroupQuant,
    PerChannelQuant,
    PerTokenDynamicQuant,
)

__all__ = ["DynamicLinear", "DynamicPlan", "dynamic_input_pattern", "dynamic_pattern_reason"]

_LINEAR = "aten.linear.default"


@dataclass
class DynamicLinear:
    """One linear lowered as a dynamically quantized fully connected."""

    node: torch.fx.Node
    x: torch.fx.Node            # the float input
    dq: torch.fx.Node           # its dequantize_per_tensor.tensor (or torchao dequantize_affine)
    weight: Weight | BlockWeight
    bias: torch.Tensor | None


def dynamic_input_pattern(dq: object) -> tuple[torch.fx.Node, list[torch.fx.Node]] | None:
    """For a ``dequantize_per_tensor.tensor`` node of the dynamic pattern: (the float input, the pattern's other
    nodes: quantize, choose_qparams, its getitems); ``None`` when ``dq`` is anything else."""
    if not is_op(dq, DQT):
        return None
    q = dq.args[0]
    if not is_op(q, QT):
        return None
    scale, zp = q.args[1], q.args[2]
    if dq.args[1] is not scale or dq.args[2] is not zp:
        return None
    getitems = [scale, zp]
    if not all(isinstance(g, torch.fx.Node) and g.target is operator.getitem for g in getitems):
        return None
    choose = scale.args[0]
    if not is_op(choose, CHOOSE) or zp.args[0] is not choose or (scale.args[1], zp.args[1]) != (0, 1):
        return None
    x = choose.args[0]
    if q.args[0] is not x or not isinstance(x, torch.fx.Node):
        return None
    for n in (choose, q, dq):
        lo, hi = (qarg(n, i, name) for i, name in ((1, "quant_min"), (2, "quant_max"))) if n is choose else (
            qarg(n, 3, "quant_min"), qarg(n, 4, "quant_max"))
        dtype = qarg(n, 4 if n is choose else 5, "dtype")
        if (lo, hi) != (-128, 127) or dtype != torch.int8:
            return None
    val = x.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.float32 or val.dim() < 2:
        return None
    return x, [choose, scale, zp, q]


class DynamicPlan:
    """The dynamic linears of one partition (built by :class:`~edgeport_xnnpack.preprocess.quantized.QuantPlan`)."""

    def __init__(self, graph: torch.fx.Graph, b: GraphBuilder, weight_of: Callable[[torch.fx.Node, torch.fx.Node], Weight]) -> None:
        self.b = b
        self.ops: dict[torch.fx.Node, DynamicLinear] = {}
        self.absorbed: set[torch.fx.Node] = set()
        self._converted: dict[torch.fx.Node, int] = {}
        for node in graph.nodes:
            if node.op != "call_function" or op_name(node.target) != _LINEAR:
                continue
            found = dynamic_input_pattern(node.args[0])
            affine = found is None
            if affine:
                found = affine_input_pattern(node.args[0])
            if found is None:
                continue
            x, others = found
            w_node, bias_node = node.args[1], qarg(node, 2, "bias")
            weight: Weight | BlockWeight | str
            if affine:
                weight = affine_weight(w_node, lambda a: b.constants.get(a) if b.is_constant(a) else None)
                if isinstance(weight, str):
                    raise LoweringError(f"{node.name}: dynamically quantized linear with an unsupported weight: "
                                        f"{weight}")
                if weight.bits == 8:  # one group per row: a per-channel int8 filter
                    weight = Weight(weight.data, weight.scales.reshape(-1), True)
            else:
                try:
                    weight = weight_of(w_node, node)
                except SkipInt8 as skip:
                    raise LoweringError(f"{node.name}: dynamically quantized linear with an unsupported weight: "
                                        f"{skip}") from skip
            bias = None
            if bias_node is not None:
                if not b.is_constant(bias_node):
                    raise LoweringError(f"{node.name}: dynamically quantized linear needs a constant bias")
                bias = b.constants[bias_node]
            if weight.data.dim() != 2:
                raise LoweringError(f"{node.name}: linear weight is not 2-D")
            self.ops[node] = DynamicLinear(node, x, node.args[0], weight, bias)
            self.absorbed.update(others)
            self.absorbed.add(node.args[0])
        for w_node in {op.node.args[1] for op in self.ops.values()}:
            if all(u in self.ops for u in w_node.users):
                self.absorbed.add(w_node)  # the int8 weight's dequantize: only read by dynamic linears
        for dq in {op.dq for op in self.ops.values()}:
            strangers = [u.name for u in dq.users if u not in self.ops]
            if strangers:
                raise LoweringError(f"{dq.name}: a dynamically quantized input is also read by {strangers}; only "
                                    "linears can read it inside XnnpackBackend")

    def lower(self, node: torch.fx.Node) -> bool:
        """Emit ``node`` if it is a dynamic linear (``True``), or nothing for a node of its pattern (``True``)."""
        op = self.ops.get(node)
        if op is not None:
            self._emit(op)
            return True
        return node in self.absorbed

    def _emit(self, op: DynamicLinear) -> None:
        b = self.b
        xv = b.value(op.x, NCHW)
        qd = self._converted.get(op.dq)
        if qd is None:
            qd = new_value(b, QDINT8, xv.dims, PerTokenDynamicQuant(1))
            b.add("XNNConvert", input_id=xv.id, output_id=qd, flags=0)
            self._converted[op.dq] = qd
        w = op.weight
        n_out, k = w.data.shape
        if xv.shape[-1] != k:
            raise LoweringError(f"{op.node.name}: input {list(xv.shape)} does not match weight {list(w.data.shape)}")
        if isinstance(w, BlockWeight):
            filter_id = _blockwise_filter(b, w)
        else:
            scales = np.broadcast_to(w.scales.astype(np.float32).reshape(-1), (n_out,))
            data = w.data.detach().to(torch.int8).contiguous().numpy()
            filter_id = new_constant(b, data, QCINT8, PerChannelQuant([float(s) for s in scales], 0, 0, n_out))
        bias_id = INVALID_ID
        if op.bias is not None:
            bias = op.bias.detach().to(torch.float32).reshape(-1)
            if bias.numel() != n_out:
                raise LoweringError(f"{op.node.name}: bias of {bias.numel()} values for {n_out} outputs")
            bias_id = new_constant(b, bias.numpy(), FP32, None)
        shape = tuple(int(d) for d in op.node.meta["val"].shape)
        out = Val(-1, NCHW, shape)
        out.id = new_value(b, FP32, list(shape), None)
        b.add("XNNFullyConnected", input1_id=qd, filter_id=filter_id, bias_id=bias_id, output_id=out.id, flags=0)
        b.set(op.node, out)


def _blockwise_filter(b: GraphBuilder, w: BlockWeight) -> int:
    """A ``qbint4`` filter value: packed nibbles, bfloat16 scales in their own constant data entry."""
    n_out, k = w.data.shape
    scales = bf16_round(w.scales.reshape(n_out, k // w.group))
    b.data.extend(bytes(-len(b.data) % ALIGNMENT))  # the scales: a constant data entry with no value of its own
    b.graph.constant_data.append(ConstantDataOffset(len(b.data), scales.nbytes))
    b.data.extend(scales.tobytes())
    scale_entry = len(b.graph.constant_data) - 1
    packed = pack_int4(w.data.to(torch.int8).contiguous().numpy())
    quant = PerChannelGroupQuant([], 0, w.group, scale_entry, int(scales.size))
    fid = new_constant(b, packed, QBINT4, quant)
    b.graph.values[fid].dims = [n_out, k]
    return fid


def _dequantizes_of(node: torch.fx.Node) -> list[torch.fx.Node] | str:
    """The ``dequantize_per_tensor.tensor`` nodes of the dynamic pattern ``node`` belongs to."""
    name = op_name(node.target) if node.op == "call_function" else ""
    if name == DQT:
        return [node]
    if name == QT:
        return list(node.users)
    if name == CHOOSE:
        found: list[torch.fx.Node] = []
        for g in node.users:
            if g.target is not operator.getitem:
                return f"choose_qparams result read by {g.name} (not a getitem)"
            for u in g.users:
                if is_op(u, QT):
                    found.extend(u.users)
                elif not is_op(u, DQT):
                    return f"dynamic quantization parameters read by {u.name}"
        return found
    return f"{name} is not part of a dynamic quantization pattern"


def dynamic_pattern_reason(node: torch.fx.Node) -> str | None:
    """Why ``node`` (a ``choose_qparams.tensor`` / ``quantize_per_tensor.tensor`` / ``dequantize_per_tensor.tensor``)
    cannot go into an XNNPACK delegate, or ``None``: it must belong to a complete int8 dynamic quantization
    pattern whose dequantized value only constant-weight linears read (a dynamically quantized fully connected)."""
    dqs = _dequantizes_of(node)
    if isinstance(dqs, str):
        return dqs
    if not dqs:
        return "dynamic quantization whose result nothing dequantizes"
    for dq in dqs:
        if dynamic_input_pattern(dq) is None:
            return (f"{dq.name}: not the int8 dynamic pattern choose_qparams.tensor -> quantize_per_tensor.tensor -> "
                    "dequantize_per_tensor.tensor over [-128, 127] of a float32 tensor of rank >= 2")
        q = dq.args[0]
        if len(q.users) != 1:
            return f"{q.name}: the int8 value is read by more than its dequantize"
        for u in dq.users:
            if u.op != "call_function" or op_name(u.target) != _LINEAR or u.args[0] is not dq:
                return f"{dq.name}: the dynamically quantized value is read by {u.name} (only linears' inputs)"
            w = u.args[1]
            if not (is_op(w, "quantized_decomposed.dequantize_per_channel.default",
                          "quantized_decomposed.dequantize_per_tensor.default")):
                return f"{u.name}: weight {getattr(w, 'name', w)} is not an int8 dequantized constant"
    return None
