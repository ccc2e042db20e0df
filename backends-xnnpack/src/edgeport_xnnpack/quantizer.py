"""``XnnpackQuantizer``: torchao pt2e quantizer for XnnpackBackend (static int8).

Use with torchao's pt2e flow, then lower the converted model with :class:`XnnpackPartitioner`::

    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from edgeport_xnnpack.quantizer import XnnpackQuantizer

    m = prepare_pt2e(torch.export.export(model, args).module(), XnnpackQuantizer())
    for batch in calibration_data:
        m(*batch)
    m = convert_pt2e(m)
    edge = to_edge_transform_and_lower(torch.export.export(m, args), partitioner=[XnnpackPartitioner()])

What it annotates (on the graph ``torch.export.export(...).module()`` gives, after ``prepare_pt2e`` folded batch
norms into convolutions):

* 2-D convolution and linear with constant weights: int8 activation in, weights int8 symmetric (per output
  channel by default, ``per_channel=False`` for one scale), bias int32 with scale ``input_scale * weight_scale``
  (per output channel) and zero point 0, derived from the input's and the weights' observers, so the pt2e
  model adds the very int32 bias XNNPACK adds (a float bias, rounded only at lowering, put BatchNorm-folded
  convolutions one step off the pt2e model on ~0.1% of outputs, which a deep CNN amplifies); a following
  relu / relu6 / hardtanh / clamp with constant bounds is fused: only its output is quantized;
* ``add`` / ``sub`` / ``mul`` of two float tensors (optionally followed by relu): both inputs and the output;
* ops that only move or select values, whose output keeps the input's quantization parameters (shared
  observer): max pooling, global average pooling (``adaptive_avg_pool2d`` to 1x1, ``mean`` over H and W),
  ``view`` / ``reshape`` / ``flatten`` / ``squeeze`` / ``unsqueeze``, ``dropout``, standalone relu / hardtanh /
  clamp.

Activations are int8 per-tensor affine over [-128, 127] (``HistogramObserver`` by default, ``MinMaxObserver``
with ``observer="minmax"``). Everything else stays float32; XnnpackPartitioner delegates the float ops too, and
the quantize/dequantize nodes between them become XNNPACK convert nodes inside the delegate.

Dynamic quantization (``dynamic=True``): only linears are annotated; their float input gets a dynamic int8 spec
(``choose_qparams`` at run time, no calibration needed), their weight the same int8 symmetric spec as above, and
their output stays float32. XnnpackPartitioner lowers the ``choose_qparams -> quantize -> dequantize -> linear``
pattern to ExecuTorch's dynamically quantized fully connected (an ``XNNConvert`` to ``qdint8`` -- parameters per
row, computed by XNNPACK at run time, finer than the graph's one set per tensor, as ExecuTorch's XNNPACK delegate
does -- and a ``qdint8 x qcint8 -> float32`` ``XNNFullyConnected``). See docs/backends/xnnpack.md for how each
runtime executes it.

Importing this module imports torchao; ``edgeport_xnnpack.plugin`` registers it lazily (``quantizers["int8"]``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e import PlaceholderObserver
from torchao.quantization.pt2e.quantizer import QuantizationSpec, QuantizationSpecBase

from edgeport.aot import quantizer_base as qb
from edgeport.node_helpers import node_arg as _arg

__all__ = ["XnnpackQuantizer"]

_aten = torch.ops.aten
_CONV = {_aten.conv2d.default}
_LINEAR = {_aten.linear.default}
_BINARY = {_aten.add.Tensor, _aten.add_.Tensor, _aten.sub.Tensor, _aten.sub_.Tensor, _aten.mul.Tensor,
           _aten.mul_.Tensor}
_RELU = {_aten.relu.default, _aten.relu_.default}
_CLAMPS = {*_RELU, _aten.hardtanh.default, _aten.hardtanh_.default, _aten.clamp.default, _aten.clamp_.default}
_RESHAPES = {_aten.view.default, _aten.reshape.default, _aten.flatten.using_ints, _aten.squeeze.dim,
             _aten.squeeze.dims, _aten.squeeze.default, _aten.unsqueeze.default, _aten.dropout.default,
             _aten.dropout_.default, _aten.clone.default, _aten._unsafe_view.default}
_POOLS = {_aten.max_pool2d.default, _aten.adaptive_avg_pool2d.default, _aten.mean.dim}


def _clamp_ok(node: Node) -> bool:
    """A relu / hardtanh / clamp with constant (Python number) bounds on a float tensor."""
    if node.target in _RELU:
        return True
    if node.target in (_aten.clamp.default, _aten.clamp_.default):
        bounds = (_arg(node, 1, "min"), _arg(node, 2, "max"))
        return all(b is None or isinstance(b, (int, float)) for b in bounds) and bounds != (None, None)
    return all(isinstance(b, (int, float)) for b in (_arg(node, 1, "min_val", -1.0), _arg(node, 2, "max_val", 1.0)))


def _fusable(node: Node) -> bool:
    return node.target in _CLAMPS and _clamp_ok(node)


def _global_pool(node: Node) -> bool:
    rank = qb.tensor_rank(node.args[0])
    if node.target == _aten.max_pool2d.default:
        return rank == 4 and not _arg(node, 5, "ceil_mode", False)
    if node.target == _aten.adaptive_avg_pool2d.default:
        return rank == 4 and list(node.args[1]) == [1, 1]
    dims = _arg(node, 1, "dim")
    return rank == 4 and dims is not None and sorted(d % 4 for d in dims) == [2, 3]


class XnnpackQuantizer(qb.BackendQuantizer):
    """Static int8 quantization for XnnpackBackend (see the module docstring).

    Args:
        per_channel: weights of convolutions and linears get one scale per output channel (symmetric int8,
            [-127, 127]); ``False`` gives one scale per weight tensor.
        observer: ``"histogram"`` (default; scans a histogram of the calibration data for the range with the
            least quantization error) or ``"minmax"`` (the observed range; faster) for activations.
        node_filter: optional ``node -> bool``; nodes for which it returns ``False`` are left in float.
        dynamic: dynamic int8 linears only (activations quantized at run time; no calibration needed).
    """

    def __init__(self, *, per_channel: bool = True, observer: str = "histogram",
                 node_filter: Callable[[Node], bool] | None = None, dynamic: bool = False) -> None:
        super().__init__(node_filter=node_filter)
        qb.observer_class(observer, "XnnpackQuantizer")
        self.per_channel = bool(per_channel)
        self.observer = observer
        self.dynamic = bool(dynamic)
        # one spec object each, so that prepare_pt2e shares observers between a producer and its consumers
        self.act = qb.int8_activation_spec(observer)
        self.dynamic_act = QuantizationSpec(
            dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine, is_dynamic=True,
            observer_or_fake_quant_ctr=PlaceholderObserver.with_args(eps=qb.MIN_SCALE),
        )
        self.weight = qb.symmetric_weight_spec(per_channel=self.per_channel)

    def __repr__(self) -> str:
        return (f"XnnpackQuantizer(per_channel={self.per_channel}, observer={self.observer!r}, "
                f"dynamic={self.dynamic})")

    # -- annotation ---------------------------------------------------------------------------------------
    def annotate(self, model: GraphModule) -> GraphModule:
        if self.dynamic:
            for node in self.candidates(model):
                if node.target in _LINEAR:
                    self._dynamic_linear(node)
            return model
        for node in self.candidates(model):
            if node.target in _CONV or node.target in _LINEAR:
                self._gemm(node)
            elif node.target in _BINARY:
                self._binary(node)
            elif node.target in _POOLS:
                if _global_pool(node):
                    self.annotate_shared(node, self.act)
            elif node.target in _RESHAPES:
                self.annotate_shared(node, self.act)
            elif node.target in _CLAMPS and _clamp_ok(node):
                self.annotate_shared(node, self.act)
        return model

    # -- patterns -------------------------------------------------------------------------------------------
    def _gemm(self, node: Node) -> None:
        x, w = node.args[0], node.args[1]
        bias = _arg(node, 2, "bias")
        if not (qb.is_float_tensor(x) and qb.is_constant(w) and qb.is_float_tensor(w)):
            return
        if node.target in _CONV and qb.tensor_rank(w) != 4:
            return  # 2-D convolutions only
        if bias is not None and not (qb.is_constant(bias) and qb.is_float_tensor(bias)):
            return
        inputs: dict[Node, QuantizationSpecBase | None] = {x: self.act, w: self.weight}
        if bias is not None:  # int32 on the accumulator's scale (per output channel if the weights are)
            inputs[bias] = qb.int32_bias_spec(x, w, node, per_channel=self.per_channel)
        self.mark(node, inputs)
        self.quantize_output(node, self.act, _fusable)

    def _dynamic_linear(self, node: Node) -> None:
        x, w = node.args[0], node.args[1]
        bias = _arg(node, 2, "bias")
        if not (qb.is_float_tensor(x) and qb.is_constant(w) and qb.is_float_tensor(w)):
            return
        if bias is not None and not qb.is_constant(bias):
            return
        self.mark(node, {x: self.dynamic_act, w: self.weight})

    def _binary(self, node: Node) -> None:
        if _arg(node, 2, "alpha", 1) != 1 or qb.tensor_rank(node.args[0]) != qb.tensor_rank(node.args[1]):
            return  # scaled, or broadcasting across ranks: stays in float
        self.annotate_binary(node, self.act, _fusable)
