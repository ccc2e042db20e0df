"""Int8 lowering: ``dequantize -> op -> quantize`` patterns become XNNPACK's int8 (qs8 / qc8) nodes.

A graph quantized by :class:`~edgeport_xnnpack.quantizer.XnnpackQuantizer` (torchao ``convert_pt2e``) holds
float ops between ``quantized_decomposed`` quantize / dequantize nodes. :class:`QuantPlan` looks at each op
before lowering; it is lowered in int8 when

* every activation input is a ``dequantize_per_tensor`` (int8) of a value computed in the delegate,
* weights (convolution, linear) are ``dequantize_per_channel`` (axis 0) or ``dequantize_per_tensor`` of
  constant int8 data with zero points 0, and a bias is a float constant (quantized here to int32 with scale
  ``input_scale * weight_scale``),
* its result (after a fused relu / hardtanh / clamp, for convolution, linear and add/sub/mul) is read only by
  ``quantize_per_tensor`` nodes with one set of parameters, and is not an output of the delegate,
* ops that only move values (max pooling, reshape, standalone clamp) keep their input's parameters, and the
  scale ratios are within what XNNPACK's int8 kernels accept.

The op then reads and writes ``qint8`` values; the dequantize nodes before it and the quantize nodes after it
emit nothing. Weights become ``qcint8`` (per channel; ``channel_dim`` 0, or 3 for a depthwise filter) or
``qint8`` values, biases ``qcint32`` / ``qint32``. A linear is emitted as a 1x1 ``XNNConv2d`` between two free
reshapes: the 2022 libXNNPACK has no per-channel int8 fully connected (and both runtimes run int8 convolutions).

Everything else stays float32: a quantize node whose producer was not lowered in int8 becomes an
``XNNConvert`` (float32 -> qint8), a dequantize read by a float op (or leaving the delegate) an ``XNNConvert``
back, and a dequantize of constants is folded into a float32 constant. Int8 values never go through a host
step on edgeport's runtime: a layout change that moves bytes converts to float32 and back around the transpose.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import torch

from edgeport.aot.capability_partitioner import op_name
from edgeport.errors import LoweringError
from edgeport_xnnpack.preprocess.builder import KEEP_DIMS, NCHW, NHWC, GraphBuilder, Val
from edgeport_xnnpack.preprocess.dynamic_quantized import DynamicPlan
from edgeport_xnnpack.preprocess.quant_values import (
    DQ,
    DQC,
    DQT,
    Q,
    QOp,
    Weight,
    is_quantized,
    new_qval,
    per_tensor_params,
    qparams_of,
)
from edgeport_xnnpack.preprocess.quant_values import SkipInt8 as _Skip
from edgeport_xnnpack.preprocess.quant_values import is_op as _is
from edgeport_xnnpack.preprocess.quant_values import new_constant as _constant
from edgeport_xnnpack.preprocess.quant_values import new_value as _new_value
from edgeport_xnnpack.preprocess.quant_values import qarg as _arg
from edgeport_xnnpack.preprocess.registry import lowers
from edgeport_xnnpack.schema.graph import (
    FP32,
    INVALID_ID,
    QCINT8,
    QCINT32,
    QINT8,
    QINT32,
    PerChannelQuant,
    PerTensorQuant,
)

_CONV = "aten.convolution.default"
_LINEAR = "aten.linear.default"
_BINARY = {"aten.add.Tensor": "XNNAdd", "aten.sub.Tensor": "XNNSubtract", "aten.mul.Tensor": "XNNMultiply"}
_MATMUL = ("aten.addmm.default", "aten.mm.default")
_MAXPOOL = ("aten.max_pool2d.default", "aten.max_pool2d_with_indices.default")
_GAP = ("aten.mean.dim", "aten._adaptive_avg_pool2d.default")
_RESHAPE = ("aten.view_copy.default", "aten._unsafe_view.default", "aten.squeeze_copy.dims",
            "aten.squeeze_copy.dim", "aten.unsqueeze_copy.default", "aten.clone.default", "aten.expand_copy.default")
_CLAMP = ("aten.relu.default", "aten.hardtanh.default", "aten.clamp.default")
_NHWC_KINDS = ("conv", "maxpool", "gap", "binary")
# XNNPACK's int8 kernels refuse requantization ratios outside these (measured on the 2022 library)
_MAX_RATIO = 256.0
_ADD_MIN_RATIO = 2.0**-10
_GAP_MIN_RATIO = 2.0**-8



class QuantPlan:
    """Which nodes of one partition are lowered in int8 (built before lowering, see the module docstring)."""

    def __init__(self, graph: torch.fx.Graph, b: GraphBuilder) -> None:
        self.b = b
        self.ops: dict[torch.fx.Node, QOp] = {}
        self.absorbed: dict[torch.fx.Node, QOp] = {}   # fused clamps and quantize nodes -> their op
        self.why: dict[str, str] = {}                   # op node name -> why it stays float (for debugging)
        self.dynamic: DynamicPlan | None = None
        if not any(_is(n, Q, DQ, DQC, DQT) for n in graph.nodes):
            return
        if any(_is(n, DQT) for n in graph.nodes):
            self.dynamic = DynamicPlan(graph, b, self._weight)
        for node in graph.nodes:
            if node.op != "call_function" or node in self.absorbed:
                continue
            if self.dynamic is not None and (node in self.dynamic.ops or node in self.dynamic.absorbed):
                continue
            try:
                op = self._plan(node)
            except _Skip as skip:
                self.why[node.name] = str(skip)
                continue
            except (AttributeError, IndexError, KeyError, TypeError) as exc:  # an unexpected form: stay float
                self.why[node.name] = f"{type(exc).__name__}: {exc}"
                continue
            if op is not None:
                self.ops[node] = op
                for n in (*op.fused, *op.quants):
                    self.absorbed[n] = op

    # -- planning -------------------------------------------------------------------------------------------
    def _plan(self, node: torch.fx.Node) -> QOp | None:
        name = op_name(node.target)
        if name == _CONV:
            return self._gemm(node, "conv", node.args[0], node.args[1], node.args[2])
        if name == _LINEAR:
            return self._gemm(node, "linear", node.args[0], node.args[1], _arg(node, 2, "bias"))
        if name in _MATMUL:  # a linear decomposed (no partitioner kept it whole): weight.t() is a permute
            if name == _MATMUL[0] and (node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1):
                raise _Skip("addmm with beta/alpha")
            bias, x, wt = (node.args[0], *node.args[1:3]) if name == _MATMUL[0] else (None, *node.args[:2])
            if not (_is(wt, "aten.permute_copy.default") and list(wt.args[1]) == [1, 0]):
                raise _Skip("matrix multiply by something else than a transposed weight")
            return self._gemm(node, "linear", x, wt.args[0], bias, extra=(wt,))
        if name in _BINARY:
            if _arg(node, 2, "alpha", 1) != 1 or not all(isinstance(a, torch.fx.Node) for a in node.args[:2]):
                raise _Skip("scalar operand or alpha")
            ins = self._act_inputs(node, node.args[:2])
            if ins[0].meta["val"].dim() != ins[1].meta["val"].dim():
                raise _Skip("operands of different ranks")
            op = self._finish(node, "binary", ins, fuse=True)
            a, c = (per_tensor_params(i) for i in ins)
            if name == "aten.mul.Tensor":
                if a.scale * c.scale / op.out.scale >= _MAX_RATIO:
                    raise _Skip("multiply scale ratio out of XNNPACK's range")
            elif not all(_ADD_MIN_RATIO <= p.scale / op.out.scale < _MAX_RATIO for p in (a, c)):
                raise _Skip("add/sub scale ratio out of XNNPACK's range")
            return op
        if name in _MAXPOOL:
            if _arg(node, 5, "ceil_mode", False):
                raise _Skip("ceil_mode")
            last = node
            if name == _MAXPOOL[1]:
                users = list(node.users)
                if len(users) != 1 or users[0].target is not operator.getitem or users[0].args[1] != 0:
                    raise _Skip("max pooling indices are used")
                last = users[0]
            return self._shared(node, "maxpool", last)
        if name in _GAP:
            x = node.args[0]
            shape = tuple(x.meta["val"].shape) if isinstance(x, torch.fx.Node) else ()
            if len(shape) != 4:
                raise _Skip("global pooling of a non 4-D tensor")
            if name == _GAP[0]:
                dims = _arg(node, 1, "dim")
                if dims is None or sorted(d % 4 for d in dims) != [2, 3]:
                    raise _Skip("mean over other dimensions than H and W")
            elif list(node.args[1]) != [1, 1]:
                raise _Skip("adaptive pooling to more than 1x1")
            op = self._finish(node, "gap", self._act_inputs(node, node.args[:1]), fuse=False)
            ratio = op.in_params[0].scale / op.out.scale
            if not _GAP_MIN_RATIO <= ratio < _MAX_RATIO:
                raise _Skip("global pooling scale ratio out of XNNPACK's range")
            return op
        if name in _RESHAPE:
            if name == "aten.expand_copy.default" and tuple(node.meta["val"].shape) != tuple(
                    node.args[0].meta["val"].shape):
                raise _Skip("broadcasting expand")
            return self._shared(node, "reshape", node)
        if name in _CLAMP:
            bounds = _clamp_bounds(node)
            if bounds is None:
                raise _Skip("clamp bounds are not numbers")
            op = self._shared(node, "clamp", node)
            op.minmax = bounds
            return op
        return None

    def _act_inputs(self, node: torch.fx.Node, args: Any) -> list[torch.fx.Node]:
        ins = []
        for a in args:
            if not _is(a, DQ) or per_tensor_params(a) is None or self.b.is_constant(a.args[0]) or not _is(
                    a.args[0], Q):
                raise _Skip(f"input {getattr(a, 'name', a)} is not a dequantized int8 activation")
            ins.append(a)
        return ins

    def _finish(self, node: torch.fx.Node, kind: str, inputs: list[torch.fx.Node], fuse: bool,
                last: torch.fx.Node | None = None) -> QOp:
        last = node if last is None else last
        fused: list[torch.fx.Node] = []
        lo, hi = -math.inf, math.inf
        while fuse and len(last.users) == 1 and last not in self.b.outputs:
            user = next(iter(last.users))
            if not (_is(user, *_CLAMP) and user.args[0] is last):
                break
            bounds = _clamp_bounds(user)
            if bounds is None:
                break
            lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
            fused.append(user)
            last = user
        if last in self.b.outputs or (last is not node and node in self.b.outputs):
            raise _Skip("its value leaves the delegate")
        quants = list(last.users)
        params = [per_tensor_params(u) if _is(u, Q) else None for u in quants]
        if not quants or any(p is None for p in params) or not all(p.same(params[0]) for p in params):
            raise _Skip("its result is not (only) quantized to int8 with one set of parameters")
        out = params[0]
        qlo, qhi = out.clamp_range()
        lo, hi = max(lo, qlo), min(hi, qhi)
        minmax = None if (lo, hi) == (-math.inf, math.inf) else (lo, hi)
        return QOp(node, kind, inputs, [per_tensor_params(i) for i in inputs], last, fused, quants, out, minmax)

    def _shared(self, node: torch.fx.Node, kind: str, last: torch.fx.Node) -> QOp:
        op = self._finish(node, kind, self._act_inputs(node, node.args[:1]), fuse=False, last=last)
        if not op.in_params[0].same(op.out):
            raise _Skip("input and output quantization differ")
        return op

    def _gemm(self, node: torch.fx.Node, kind: str, x: Any, w_node: Any, bias_node: Any,
              extra: tuple[torch.fx.Node, ...] = ()) -> QOp:
        if kind == "conv":
            if node.args[6] or node.args[0].meta["val"].dim() != 4:
                raise _Skip("only 2-D, non-transposed convolutions")
        inputs = self._act_inputs(node, [x])
        weight = self._weight(w_node, node)
        if kind == "linear" and weight.data.dim() != 2:
            raise _Skip("linear weight is not 2-D")
        bias = None
        if bias_node is not None:
            bias = self._constant(bias_node)
            if bias is None or not bias.is_floating_point():
                raise _Skip("bias is not a float constant")
        op = self._finish(node, kind, inputs, fuse=True)
        in_scale = op.in_params[0].scale
        if float(np.max(weight.scales)) * in_scale / op.out.scale >= _MAX_RATIO:
            raise _Skip("requantization scale out of XNNPACK's range")
        op.weight, op.bias = weight, bias
        op.weight_nodes = [w_node, *extra] + ([bias_node] if bias_node is not None else [])
        return op

    def _weight(self, w: Any, node: torch.fx.Node) -> Weight:
        if _is(w, DQC):
            data, scales, zps = (self._raw(a) for a in w.args[:3])
            axis = _arg(w, 3, "axis")
            if axis != 0 or _arg(w, 6, "dtype") != torch.int8:
                raise _Skip("per-channel weight not int8 along axis 0")
            if data is None or scales is None or zps is None or bool(torch.any(zps != 0)):
                raise _Skip("per-channel weight not constant or not symmetric")
            s = scales.detach().to(torch.float32).reshape(-1).numpy()
            if s.size != data.shape[0]:
                raise _Skip("per-channel scales do not match the output channels")
            return Weight(data, s, True)
        params = per_tensor_params(w)
        if params is not None and _is(w, DQ):
            data = self._raw(w.args[0])
            if data is None or params.zero_point != 0:
                raise _Skip("per-tensor weight not constant or not symmetric")
            return Weight(data, np.asarray([params.scale], np.float32), False)
        raise _Skip(f"weight of {node.name} is not a dequantized int8 constant")

    def _raw(self, a: Any) -> torch.Tensor | None:
        return self.b.constants.get(a) if isinstance(a, torch.fx.Node) else None

    def _constant(self, a: Any) -> torch.Tensor | None:
        """A constant, or a dequantize of constants evaluated here."""
        if self.b.is_constant(a):
            return self.b.constants[a]
        if _is(a, DQ, DQC) and all(self.b.is_constant(x) for x in a.all_input_nodes):
            args = torch.fx.node.map_aggregate(a.args, lambda x: self.b.constants[x] if isinstance(
                x, torch.fx.Node) else x)
            with torch.no_grad():
                return a.target(*args, **a.kwargs)
        return None

    # -- lowering -------------------------------------------------------------------------------------------
    def lower(self, node: torch.fx.Node) -> bool:
        """Lower ``node`` if the plan covers it (``True``), else leave it to the float lowerings."""
        if self.dynamic is not None and self.dynamic.lower(node):
            return True
        if not self.ops and not self.absorbed:
            return False
        op = self.ops.get(node)
        if op is not None:
            _EMIT[op.kind](self.b, op)
            return True
        if node in self.absorbed:
            return True  # its value was set when its op was lowered
        return self._read_only_by_int8_ops(node)

    def _read_only_by_int8_ops(self, node: torch.fx.Node) -> bool:
        """A dequantize (or the transpose of a dequantized weight) that only int8 ops read emits nothing."""
        if not _is(node, DQ, DQC, "aten.permute_copy.default") or node in self.b.outputs or not node.users:
            return False
        for u in node.users:
            op = self.ops.get(u)
            if op is not None and node in (*op.inputs, *op.weight_nodes):
                continue
            if not (_is(u, "aten.permute_copy.default") and self._read_only_by_int8_ops(u)):
                return False
        return True

    def wants_nhwc(self, q: torch.fx.Node) -> bool:
        """Whether an int8 op reading ``q`` (through its dequantize nodes) works in NHWC."""
        for dq in q.users:
            for user in dq.users:
                op = self.ops.get(user)
                if op is not None and op.kind in _NHWC_KINDS:
                    return True
        return False



def _clamp_bounds(node: torch.fx.Node) -> tuple[float, float] | None:
    name = op_name(node.target)
    if name == "aten.relu.default":
        return 0.0, math.inf
    if name == "aten.hardtanh.default":
        lo, hi = _arg(node, 1, "min_val", -1.0), _arg(node, 2, "max_val", 1.0)
    else:
        lo, hi = _arg(node, 1, "min"), _arg(node, 2, "max")
    if not all(v is None or isinstance(v, (int, float)) for v in (lo, hi)):
        return None
    return (-math.inf if lo is None else float(lo)), (math.inf if hi is None else float(hi))


# -- values ---------------------------------------------------------------------------------------------------

def qconvert(b: GraphBuilder, v: Val, layout: str) -> Val:
    """The int8 value ``v`` in ``layout``: a free reshape when no byte moves, else float32 around a transpose
    (edgeport's runtime transposes on the host, in float32 only)."""
    if v.layout == layout or len(v.shape) != 4:
        return v
    key = (v.id, layout)
    if key not in b._converted:
        params = qparams_of(b, v)
        out = new_qval(b, v.shape, layout, params)
        _, c, h, w = v.shape
        if c == 1 or h * w == 1:
            b.add("XNNStaticReshape", num_dims=4, new_shape=out.dims, input_id=v.id, output_id=out.id, flags=0)
        else:
            f = Val(-1, v.layout, v.shape)
            f.id = _new_value(b, FP32, v.dims, None)
            b.add("XNNConvert", input_id=v.id, output_id=f.id, flags=0)
            t = b.convert(f, layout)
            b.add("XNNConvert", input_id=t.id, output_id=out.id, flags=0)
        b._converted[key] = out
    return b._converted[key]


def _qinput(b: GraphBuilder, dq: torch.fx.Node) -> Val:
    src = dq.args[0]
    if src not in b.env or not is_quantized(b, b.env[src]):
        raise LoweringError(f"{dq.name}: its int8 input {getattr(src, 'name', src)} was not lowered in int8")
    return b.env[src]


def _publish(b: GraphBuilder, op: QOp, out: Val) -> None:
    """``out`` is the value of the op, its fused clamps and the quantize nodes after it."""
    b.set(op.node, out)  # (max_pool2d_with_indices: the lowering loop aliases its getitem)
    for n in (*op.fused, *op.quants):
        b.set(n, out)


# -- emitters -------------------------------------------------------------------------------------------------
def _weight_values(b: GraphBuilder, op: QOp, filt: torch.Tensor, channel_dim: int) -> tuple[int, int]:
    """(filter id, bias id) of a convolution: int8 filter ``filt`` (already in XNNPACK's layout), int32 bias."""
    w = op.weight
    assert w is not None
    data = filt.detach().to(torch.int8).contiguous().numpy()
    in_scale = op.in_params[0].scale
    if w.per_channel:
        scales = w.scales.astype(np.float32)
        filter_id = _constant(b, data, QCINT8, PerChannelQuant([float(s) for s in scales], channel_dim, 0, len(scales)))
    else:
        filter_id = _constant(b, data, QINT8, PerTensorQuant(float(w.scales[0]), 0))
    if op.bias is None:
        return filter_id, INVALID_ID
    bias_scales = (w.scales.astype(np.float64) * in_scale).reshape(-1)
    raw = op.bias.detach().to(torch.float64).reshape(-1).numpy() / bias_scales
    q = np.clip(np.rint(raw), -(2**31), 2**31 - 1).astype(np.int32)
    if w.per_channel:
        bias_id = _constant(b, q, QCINT32, PerChannelQuant([float(s) for s in bias_scales.astype(np.float32)], 0, 0, len(bias_scales)))
    else:
        bias_id = _constant(b, q, QINT32, PerTensorQuant(float(bias_scales[0]), 0))
    return filter_id, bias_id


def _emit_conv(b: GraphBuilder, op: QOp) -> None:
    node = op.node
    x, _, _, stride, padding, dilation, _, _, groups = node.args
    w = op.weight.data
    cout, cin_g, kh, kw = w.shape
    cin = x.meta["val"].shape[1]
    depthwise = groups > 1 and groups == cin and cin_g == 1
    filt = w.permute(1, 2, 3, 0) if depthwise else w.permute(0, 2, 3, 1)
    filter_id, bias_id = _weight_values(b, op, filt, 3 if depthwise else 0)
    xin = qconvert(b, _qinput(b, op.inputs[0]), NHWC)
    out = new_qval(b, tuple(op.last.meta["val"].shape), NHWC, op.out)
    b.add("XNNDepthwiseConv2d" if depthwise else "XNNConv2d", minmax=op.minmax,
          padding_top=padding[0], padding_bottom=padding[0], padding_left=padding[1], padding_right=padding[1],
          kernel_height=kh, kernel_width=kw, subsampling_height=stride[0], subsampling_width=stride[1],
          dilation_height=dilation[0], dilation_width=dilation[1],
          group_input_channels=cin_g, group_output_channels=cout // groups, groups=groups,
          input1_id=xin.id, filter_id=filter_id, bias_id=bias_id, output_id=out.id, flags=0)
    _publish(b, op, out)


def _emit_linear(b: GraphBuilder, op: QOp) -> None:
    """A linear as a 1x1 convolution over [M, 1, 1, K] (reshapes of int8 values move no byte)."""
    w = op.weight.data
    n_out, k = w.shape
    xin = qconvert(b, _qinput(b, op.inputs[0]), NCHW)
    m = math.prod(xin.shape[:-1])
    if xin.shape[-1] != k:
        raise LoweringError(f"{op.node.name}: input {list(xin.shape)} does not match weight {list(w.shape)}")
    filter_id, bias_id = _weight_values(b, op, w.reshape(n_out, 1, 1, k), 0)
    x4 = new_qval(b, (m, k, 1, 1), NHWC, op.in_params[0])
    b.add("XNNStaticReshape", num_dims=4, new_shape=x4.dims, input_id=xin.id, output_id=x4.id, flags=0)
    y4 = new_qval(b, (m, n_out, 1, 1), NHWC, op.out)
    b.add("XNNConv2d", minmax=op.minmax, padding_top=0, padding_bottom=0, padding_left=0, padding_right=0,
          kernel_height=1, kernel_width=1, subsampling_height=1, subsampling_width=1, dilation_height=1,
          dilation_width=1, group_input_channels=k, group_output_channels=n_out, groups=1,
          input1_id=x4.id, filter_id=filter_id, bias_id=bias_id, output_id=y4.id, flags=0)
    shape = tuple(op.last.meta["val"].shape)
    out = new_qval(b, shape, NCHW, op.out)
    b.add("XNNStaticReshape", num_dims=len(out.dims), new_shape=out.dims, input_id=y4.id, output_id=out.id,
          flags=0)
    _publish(b, op, out)


def _emit_binary(b: GraphBuilder, op: QOp) -> None:
    vals = [_qinput(b, dq) for dq in op.inputs]
    shape = tuple(op.last.meta["val"].shape)
    layout = NHWC if len(shape) == 4 and any(v.layout == NHWC for v in vals) else NCHW
    vals = [qconvert(b, v, layout) for v in vals]
    out = new_qval(b, shape, layout, op.out)
    b.add(_BINARY[op_name(op.node.target)], minmax=op.minmax, input1_id=vals[0].id, input2_id=vals[1].id,
          output_id=out.id, flags=0)
    _publish(b, op, out)


def _arg_pair(v: Any, default: Any) -> list[int]:
    if v is None or (isinstance(v, (list, tuple)) and not v):
        v = default
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * 2 if len(v) == 1 else v


def _emit_maxpool(b: GraphBuilder, op: QOp) -> None:
    node = op.node
    kernel = _arg_pair(node.args[1], None)
    stride = _arg_pair(_arg(node, 2, "stride"), kernel)
    padding = _arg_pair(_arg(node, 3, "padding", 0), [0])
    dilation = _arg_pair(_arg(node, 4, "dilation", 1), [1])
    xin = qconvert(b, _qinput(b, op.inputs[0]), NHWC)
    out = new_qval(b, tuple(op.last.meta["val"].shape), NHWC, op.out)
    b.add("XNNMaxPooling2d", padding_top=padding[0], padding_bottom=padding[0], padding_left=padding[1],
          padding_right=padding[1], pooling_height=kernel[0], pooling_width=kernel[1], stride_height=stride[0],
          stride_width=stride[1], dilation_height=dilation[0], dilation_width=dilation[1], input_id=xin.id,
          output_id=out.id, flags=KEEP_DIMS)
    _publish(b, op, out)


def _emit_gap(b: GraphBuilder, op: QOp) -> None:
    xin = qconvert(b, _qinput(b, op.inputs[0]), NHWC)
    n, c = xin.shape[0], xin.shape[1]
    pooled = new_qval(b, (n, c, 1, 1), NHWC, op.out)
    b.add("XNNGlobalAvgPooling2d", input_id=xin.id, output_id=pooled.id, flags=KEEP_DIMS)
    shape = tuple(op.last.meta["val"].shape)
    if len(shape) == 4:
        _publish(b, op, pooled)
        return
    out = new_qval(b, shape, NCHW, op.out)  # [N, 1, 1, C] and [N, C] share their bytes
    b.add("XNNStaticReshape", num_dims=len(shape), new_shape=list(shape), input_id=pooled.id, output_id=out.id,
          flags=0)
    _publish(b, op, out)


def _emit_reshape(b: GraphBuilder, op: QOp) -> None:
    src = _qinput(b, op.inputs[0])
    shape = tuple(op.last.meta["val"].shape)
    if shape == src.shape:
        out = new_qval(b, shape, src.layout, op.out)
    else:
        src = qconvert(b, src, NCHW)
        out = new_qval(b, shape, NCHW, op.out)
    b.add("XNNStaticReshape", num_dims=len(out.dims), new_shape=out.dims, input_id=src.id, output_id=out.id,
          flags=0)
    _publish(b, op, out)


def _emit_clamp(b: GraphBuilder, op: QOp) -> None:
    src = _qinput(b, op.inputs[0])
    out = new_qval(b, src.shape, src.layout, op.out)
    b.add("XNNClamp", minmax=op.minmax or (-math.inf, math.inf), input_id=src.id, output_id=out.id, flags=0)
    _publish(b, op, out)


_EMIT = {"conv": _emit_conv, "linear": _emit_linear, "binary": _emit_binary, "maxpool": _emit_maxpool,
         "gap": _emit_gap, "reshape": _emit_reshape, "clamp": _emit_clamp}


# -- quantize / dequantize nodes that stay (float32 <-> int8 conversions) -------------------------------------
@lowers(Q)
def quantize(b: GraphBuilder, node: Any) -> None:
    params = per_tensor_params(node)
    if params is None:
        raise LoweringError(f"{node.name}: only int8 per-tensor quantization with scalar parameters")
    src = b.val(node.args[0])
    if is_quantized(b, src):
        raise LoweringError(f"{node.name}: quantizes a value that is already int8")
    plan = getattr(b, "quant_plan", None)
    if len(src.shape) == 4 and src.layout == NCHW and plan is not None and plan.wants_nhwc(node):
        src = b.convert(src, NHWC)  # transpose in float32, then quantize
    out = new_qval(b, src.shape, src.layout, params)
    b.add("XNNConvert", input_id=src.id, output_id=out.id, flags=0)
    b.set(node, out)


@lowers(DQ)
def dequantize(b: GraphBuilder, node: Any) -> None:
    if per_tensor_params(node) is None:
        raise LoweringError(f"{node.name}: only int8 per-tensor dequantization with scalar parameters")
    src = _qinput(b, node)
    out = Val(-1, src.layout, src.shape)
    out.id = _new_value(b, FP32, src.dims, None)
    b.add("XNNConvert", input_id=src.id, output_id=out.id, flags=0)
    b.set(node, out)


@lowers(DQC)
def dequantize_per_channel(b: GraphBuilder, node: Any) -> None:
    raise LoweringError(f"{node.name}: per-channel dequantization of a non-constant (only weights are supported)")
