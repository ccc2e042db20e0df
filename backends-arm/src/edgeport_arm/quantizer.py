"""``TOSAQuantizer`` / ``EthosUQuantizer``: torchao pt2e quantizers for the Arm backends (ExecuTorch's names).

Use with torchao's flow on a plain ``torch.export.export(model, args).module()``::

    m = prepare_pt2e(torch.export.export(model, args).module(), EthosUQuantizer(EthosUCompileSpec("ethos-u55-128")))
    for batch in calibration_data:
        m(*batch)
    m = convert_pt2e(m)
    edge = to_edge_transform_and_lower(torch.export.export(m, args), partitioner=[EthosUPartitioner(spec)])

Whole-model by default (an NPU has no float datapath): every op with an int8 lowering gets int8 per-tensor
affine activations ([-128, 127]) on its inputs and output; convolution and linear weights int8 symmetric per
output channel ([-127, 127]); biases int32 per output channel with scale ``input_scale * weight_scale``
(ExecuTorch's derived bias spec), so the pt2e model adds the very bias the integer convolution adds (a float
bias, rounded only at lowering, put the pt2e model and the integer graph one step apart on ~0.1% of the
outputs of a BatchNorm-folded convolution, which a deep CNN amplifies; a16w8 keeps float biases, quantized to
int48 by the lowering); a relu / relu6 / hardtanh / clamp right after a convolution, linear, add or mul
is fused (only its output is quantized). Max pooling, reshapes, permutes and padding share their input's
parameters, and so do ``amax`` and ``expand`` / ``repeat``. ``sigmoid`` / ``tanh`` / ``hardswish`` / ``gelu`` /
``silu`` / ``exp`` / ``reciprocal`` / ``rsqrt`` get their own output parameters (they become int8 lookup tables),
and so do ``neg`` and ``pow`` by 2 or 3 (int32 SUB / MULs, rescaled once), and so do ``mean`` and ``sum`` (an
int32 sum rescaled once) and average pooling over an even number of elements: on the input's own scale such an
average has exact .5 ties, which integer hardware rounds up where torch rounds to even. Average pooling over an
odd number of elements (at most 255, no padding) shares its input's parameters: it can have no tie, so TOSA's
AVG_POOL2D rounds it as torch does and no RESCALE follows it (ExecuTorch's choice, and Vela's cycles). Constants are folded first (a decoder's mask and rotary
tables, :mod:`edgeport_arm.fold`); softmax, layer norm and attention are decomposed
into those primitives before annotation (:mod:`edgeport_arm.decompose`); what has no int8 lowering stays float,
and ``EthosUPartitioner`` then names it unless it is given ``cpu_fallback=True``. ``node_filter`` leaves chosen
nodes in float.

``a16w8=True`` (ExecuTorch's ``get_symmetric_a16w8_quantization_config``): int16 symmetric activations
([-32767, 32767]) with the same int8 weights, for targets with TOSA's int16 extension (``TOSA-1.0+INT+int16``,
every Ethos-U target). Lowered in int16 so far: convolution, linear, add/sub, relu/clamp and the shape ops
(:data:`~edgeport_arm.capabilities.INT16_SUPPORTED`); the rest stays on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import QuantizationSpec, QuantizationSpecBase

from edgeport.aot import quantizer_base as qb
from edgeport.node_helpers import int_pair
from edgeport.node_helpers import node_arg as _arg
from edgeport_arm.decompose import decompose_for_annotation
from edgeport_arm.fold import fold_for_annotation
from edgeport_arm.options import EthosUCompileSpec, TosaCompileSpec

__all__ = ["EthosUQuantizer", "TOSAQuantizer"]

_aten = torch.ops.aten
_GEMM = {_aten.conv2d.default, _aten.linear.default}
_BINARY = {_aten.add.Tensor, _aten.add_.Tensor, _aten.sub.Tensor, _aten.sub_.Tensor, _aten.mul.Tensor,
           _aten.mul_.Tensor}
_MATMUL = {_aten.matmul.default, _aten.bmm.default, _aten.mm.default}
_CLAMPS = {_aten.relu.default, _aten.relu_.default, _aten.hardtanh.default, _aten.hardtanh_.default,
           _aten.clamp.default, _aten.clamp_.default, _aten.relu6.default}
_TABLES = {_aten.sigmoid.default, _aten.tanh.default, _aten.hardswish.default, _aten.hardswish_.default,
           _aten.gelu.default, _aten.exp.default, _aten.reciprocal.default, _aten.rsqrt.default,
           _aten.silu.default, _aten.silu_.default}
# own output parameters, computed in int32: negation (its range mirrors the input's) and small integer powers
_OWN = {_aten.neg.default}
_POWERS = {_aten.pow.Tensor_Scalar}
# averages get their own output parameters: on the input's scale, exact .5 ties are frequent and integer
# hardware rounds them differently from torch -- except pools over an odd count (_tie_free_pool)
_AVERAGES = {_aten.avg_pool2d.default, _aten.adaptive_avg_pool2d.default, _aten.mean.dim, _aten.sum.dim_IntList}
# a tie-free pool's count: above it, float32 error in the pt2e model's sum could cross a rounding boundary
# (nearest one 1 / (2 * count) away; worst-case float32 error of a count-term int8 sum ~ count * 128 * 2**-24)
_TIE_FREE_MAX_COUNT = 255
_SHARED = {_aten.max_pool2d.default, _aten.view.default, _aten.reshape.default, _aten.flatten.using_ints, _aten.squeeze.dim,
           _aten.squeeze.dims, _aten.squeeze.default, _aten.unsqueeze.default, _aten.permute.default,
           _aten.transpose.int, _aten.dropout.default, _aten.clone.default, _aten.contiguous.default,
           _aten.pad.default, _aten.constant_pad_nd.default, _aten.slice.Tensor, _aten._unsafe_view.default,
           _aten.select.int, _aten.unflatten.int, _aten.amax.default, _aten.expand.default,
           _aten.expand_copy.default, _aten.repeat.default, _aten.alias.default}


def _fusable(node: Node) -> bool:
    return node.target in _CLAMPS


def _tie_free_pool(node: Node) -> bool:
    """An average whose every output is over the same odd count of elements (at most _TIE_FREE_MAX_COUNT): its
    sum over that count can never be an exact .5 away from an integer, so it may share its input's parameters."""
    val = node.args[0].meta.get("val") if isinstance(node.args[0], Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 4 or not all(isinstance(d, int) for d in val.shape):
        return False
    if node.target == _aten.mean.dim:
        dims = _arg(node, 1, "dim")
        if dims is None or sorted(int(d) % 4 for d in dims) != [2, 3]:
            return False
        count = val.shape[2] * val.shape[3]
    elif node.target == _aten.adaptive_avg_pool2d.default:
        if int_pair(node.args[1]) != [1, 1]:
            return False
        count = val.shape[2] * val.shape[3]
    elif node.target == _aten.avg_pool2d.default:
        if (any(int_pair(_arg(node, 3, "padding", 0))) or _arg(node, 4, "ceil_mode", False)
                or _arg(node, 6, "divisor_override") is not None):
            return False
        kh, kw = int_pair(node.args[1])
        count = kh * kw
    else:
        return False
    return count % 2 == 1 and count <= _TIE_FREE_MAX_COUNT


class _ArmQuantizer(qb.BackendQuantizer):
    def __init__(self, compile_spec: TosaCompileSpec | EthosUCompileSpec | None, *, observer: str,
                 node_filter: Callable[[Node], bool] | None, a16w8: bool = False) -> None:
        super().__init__(node_filter=node_filter)
        spec = compile_spec.specification if compile_spec is not None else None
        if spec is not None and not spec.is_int:
            raise ValueError(f"{type(self).__name__}: {compile_spec!r} has no integer profile; quantized graphs "
                             "need 'TOSA-1.0+INT'")
        observer_cls = qb.observer_class(observer, type(self).__name__)
        self.compile_spec = compile_spec
        self.observer = observer
        if a16w8 and spec is not None and "int16" not in spec.extensions:
            raise ValueError(f"{type(self).__name__}: a16w8 needs a target with TOSA's int16 extension, e.g. "
                             f"TosaCompileSpec('TOSA-1.0+INT+int16'); {compile_spec!r} has none")
        self.a16w8 = a16w8
        if a16w8:  # ExecuTorch's get_symmetric_a16w8_quantization_config: int16 symmetric activations
            self.act = QuantizationSpec(dtype=torch.int16, quant_min=-32767, quant_max=32767,
                                        qscheme=torch.per_tensor_symmetric,
                                        observer_or_fake_quant_ctr=observer_cls.with_args(eps=qb.MIN_SCALE))
        else:
            self.act = qb.int8_activation_spec(observer)
        self.weight = qb.symmetric_weight_spec()

    def __repr__(self) -> str:
        extra = ", a16w8=True" if self.a16w8 else ""
        return f"{type(self).__name__}({self.compile_spec!r}, observer={self.observer!r}{extra})"

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """Constants folded (masks, rotary tables), no-op casts dropped, constant-weight ``addmm`` made
        ``linear`` (:func:`~edgeport_arm.fold.fold_for_annotation`); then softmax, layer norm and attention become
        primitives, each quantized on its own (:func:`~edgeport_arm.decompose.decompose_for_annotation`)."""
        return decompose_for_annotation(fold_for_annotation(model))

    def annotate(self, model: GraphModule) -> GraphModule:
        for node in self.candidates(model):
            t = node.target
            if t in _GEMM:
                self._gemm(node)
            elif t in _BINARY and not isinstance(node.args[1], Node):
                if isinstance(node.args[1], (int, float)):  # by / plus a constant: own output parameters
                    self.annotate_own(node, self.act)
            elif t in _BINARY or t in _MATMUL:
                if _arg(node, 2, "alpha", 1) == 1:
                    self.annotate_binary(node, self.act, _fusable)
            elif t in _TABLES or t in _AVERAGES:
                if not self.a16w8 and _tie_free_pool(node):
                    self.annotate_shared(node, self.act)
                else:
                    self.annotate_own(node, self.act)
            elif t is _aten.cat.default:
                tensors = [a for a in node.args[0] if qb.is_float_tensor(a)]
                if tensors and len(tensors) == len(node.args[0]):
                    self.mark(node, {a: self.act for a in tensors}, self.act)
            elif t in _OWN or (t in _POWERS and node.args[1] in (2, 3) and not isinstance(node.args[1], bool)):
                self.annotate_own(node, self.act)
            elif t in _SHARED or t in _CLAMPS:
                self.annotate_shared(node, self.act)
        return model

    def _gemm(self, node: Node) -> None:
        x, w = node.args[0], node.args[1]
        bias = _arg(node, 2, "bias")
        if not (qb.is_float_tensor(x) and qb.is_constant(w)):
            return
        if bias is not None and not qb.is_constant(bias):
            return
        inputs: dict[Node, QuantizationSpecBase | None] = {x: self.act, w: self.weight}
        if bias is not None and not self.a16w8:
            inputs[bias] = qb.int32_bias_spec(x, w, node)
        self.mark(node, inputs)
        self.quantize_output(node, self.act, _fusable)


class TOSAQuantizer(_ArmQuantizer):
    """int8 quantization for ``TOSABackend`` (``TosaCompileSpec("TOSA-1.0+INT")``)."""

    def __init__(self, compile_spec: TosaCompileSpec | None = None, *, observer: str = "histogram",
                 node_filter: Callable[[Node], bool] | None = None, a16w8: bool = False) -> None:
        super().__init__(compile_spec or TosaCompileSpec("TOSA-1.0+INT"), observer=observer, node_filter=node_filter,
                         a16w8=a16w8)


class EthosUQuantizer(_ArmQuantizer):
    """int8 quantization for ``EthosUBackend`` (the whole model: the NPU runs integers only)."""

    def __init__(self, compile_spec: EthosUCompileSpec | None = None, *, observer: str = "histogram",
                 node_filter: Callable[[Node], bool] | None = None, a16w8: bool = False) -> None:
        super().__init__(compile_spec or EthosUCompileSpec(), observer=observer, node_filter=node_filter,
                         a16w8=a16w8)
