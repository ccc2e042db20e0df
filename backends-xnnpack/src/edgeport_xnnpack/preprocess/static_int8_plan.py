"""Which ops of a partition are lowered in static int8: :class:`QuantPlan`, built before the lowering loop.

It checks each op's ``dequantize -> op -> quantize`` pattern (inputs, weights, fused clamps, output parameters
and XNNPACK's scale ratio limits; see :mod:`edgeport_xnnpack.preprocess.quantized`), records why the others
stay float, and lowers the planned ops with :mod:`~edgeport_xnnpack.preprocess.static_int8_emitters`.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import torch

from edgeport.aot.capability_partitioner import op_name
from edgeport_xnnpack.preprocess.affine_quantized import DQA
from edgeport_xnnpack.preprocess.builder import GraphBuilder
from edgeport_xnnpack.preprocess.dynamic_quantized import DynamicPlan
from edgeport_xnnpack.preprocess.quant_values import DQ, DQC, DQT, Q, QOp, Weight, per_tensor_params
from edgeport_xnnpack.preprocess.quant_values import SkipInt8 as _Skip
from edgeport_xnnpack.preprocess.quant_values import is_op as _is
from edgeport_xnnpack.preprocess.quant_values import qarg as _arg
from edgeport_xnnpack.preprocess.static_int8_emitters import BINARY_NODES, EMITTERS

_CONV = "aten.convolution.default"
_LINEAR = "aten.linear.default"
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
        if not any(_is(n, Q, DQ, DQC, DQT, DQA) for n in graph.nodes):
            return
        if any(_is(n, DQT, DQA) for n in graph.nodes):
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
        if name in BINARY_NODES:
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
        op = self._finish(node, kind, inputs, fuse=True)
        in_scale = op.in_params[0].scale
        bias = None
        if bias_node is not None:
            bias = self._int32_bias(bias_node, weight, in_scale)
            if bias is None:
                bias = self._constant(bias_node)
            if bias is None or not (bias.is_floating_point() or bias.dtype == torch.int32):
                raise _Skip("bias is not a float constant or a dequantized int32 constant")
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

    def _int32_bias(self, a: Any, weight: Weight, in_scale: float) -> torch.Tensor | None:
        """The int32 values of a bias the quantizer made int32 (a dequantize of an int32 constant, zero point 0,
        scale ``in_scale * weight scale``): the convolution adds them as they are, as the pt2e model does."""
        if _is(a, DQC):
            data, scales, zps = (self._raw(x) for x in a.args[:3])
            if _arg(a, 6, "dtype") != torch.int32 or data is None or scales is None or zps is None:
                return None
            if _arg(a, 3, "axis") != 0 or bool(torch.any(zps != 0)):
                raise _Skip("per-channel int32 bias not along axis 0 or not symmetric")
            s = scales.detach().to(torch.float64).reshape(-1).numpy()
        elif _is(a, DQ):
            data = self._raw(a.args[0])
            if _arg(a, 5, "dtype") != torch.int32 or data is None or not isinstance(a.args[1], (int, float)):
                return None
            if a.args[2] != 0:
                raise _Skip("int32 bias with a nonzero zero point")
            s = np.asarray([float(a.args[1])])
        else:
            return None
        want = weight.scales.astype(np.float64).reshape(-1) * in_scale
        if s.size != want.size or data.numel() != weight.data.shape[0]:
            raise _Skip("int32 bias shape does not match the weight's scales")
        if not np.allclose(s, want, rtol=1e-6, atol=0):
            raise _Skip("int32 bias scale is not input scale * weight scale")
        return data.detach().to(torch.int32).reshape(-1)

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
            EMITTERS[op.kind](self.b, op)
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
