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

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e import (
    HistogramObserver,
    MinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from torchao.quantization.pt2e.quantizer import (
    DerivedQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    QuantizationSpecBase,
    Quantizer,
    SharedQuantizationSpec,
)

__all__ = ["XnnpackQuantizer"]

_KEY = "quantization_annotation"
_EPS = 2.0**-12  # smallest scale an observer may pick (keeps XNNPACK's requantization ratios in range)

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


def _is_float_tensor(a: Any) -> bool:
    val = a.meta.get("val") if isinstance(a, Node) else None
    return isinstance(val, torch.Tensor) and val.dtype == torch.float32


def _is_constant(a: Any) -> bool:
    return isinstance(a, Node) and a.op == "get_attr"


def _arg(node: Node, i: int, name: str, default: Any = None) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _bias_qparams(observers: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 bias parameters from the input's and the weights' observers: ``input_scale * weight_scale`` (one
    per output channel, or one), zero point 0 -- what the int8 convolution adds to its int32 accumulator."""
    act_scale, _ = observers[0].calculate_qparams()
    weight_scale, _ = observers[1].calculate_qparams()
    scale = (act_scale.to(torch.float64) * weight_scale.to(torch.float64)).to(torch.float32).reshape(-1)
    return scale, torch.zeros_like(scale, dtype=torch.int32)


def _rank(a: Any) -> int | None:
    val = a.meta.get("val") if isinstance(a, Node) else None
    return val.dim() if isinstance(val, torch.Tensor) else None


def _clamp_ok(node: Node) -> bool:
    """A relu / hardtanh / clamp with constant (Python number) bounds on a float tensor."""
    if node.target in _RELU:
        return True
    if node.target in (_aten.clamp.default, _aten.clamp_.default):
        bounds = (_arg(node, 1, "min"), _arg(node, 2, "max"))
        return all(b is None or isinstance(b, (int, float)) for b in bounds) and bounds != (None, None)
    return all(isinstance(b, (int, float)) for b in (_arg(node, 1, "min_val", -1.0), _arg(node, 2, "max_val", 1.0)))


def _global_pool(node: Node) -> bool:
    rank = _rank(node.args[0])
    if node.target == _aten.max_pool2d.default:
        return rank == 4 and not _arg(node, 5, "ceil_mode", False)
    if node.target == _aten.adaptive_avg_pool2d.default:
        return rank == 4 and list(node.args[1]) == [1, 1]
    dims = _arg(node, 1, "dim")
    return rank == 4 and dims is not None and sorted(d % 4 for d in dims) == [2, 3]


class XnnpackQuantizer(Quantizer):
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
        super().__init__()
        observers = {"histogram": HistogramObserver, "minmax": MinMaxObserver}
        if observer not in observers:
            raise ValueError(f"XnnpackQuantizer: observer must be one of {sorted(observers)}, got {observer!r}")
        self.per_channel = bool(per_channel)
        self.observer = observer
        self.node_filter = node_filter
        self.dynamic = bool(dynamic)
        # one spec object each, so that prepare_pt2e shares observers between a producer and its consumers
        self.act = QuantizationSpec(
            dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine,
            observer_or_fake_quant_ctr=observers[observer].with_args(eps=_EPS),
        )
        self.dynamic_act = QuantizationSpec(
            dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine, is_dynamic=True,
            observer_or_fake_quant_ctr=PlaceholderObserver.with_args(eps=_EPS),
        )
        if per_channel:
            self.weight = QuantizationSpec(
                dtype=torch.int8, quant_min=-127, quant_max=127, qscheme=torch.per_channel_symmetric, ch_axis=0,
                observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=_EPS),
            )
        else:
            self.weight = QuantizationSpec(
                dtype=torch.int8, quant_min=-127, quant_max=127, qscheme=torch.per_tensor_symmetric,
                observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=_EPS),
            )

    def __repr__(self) -> str:
        return (f"XnnpackQuantizer(per_channel={self.per_channel}, observer={self.observer!r}, "
                f"dynamic={self.dynamic})")

    # -- annotation ---------------------------------------------------------------------------------------
    def annotate(self, model: GraphModule) -> GraphModule:
        if self.dynamic:
            for node in list(model.graph.nodes):
                if (node.op == "call_function" and node.target in _LINEAR and not self._done(node)
                        and self._wanted(node)):
                    self._dynamic_linear(node)
            return model
        for node in list(model.graph.nodes):
            if node.op != "call_function" or self._done(node) or not self._wanted(node):
                continue
            if node.target in _CONV or node.target in _LINEAR:
                self._gemm(node)
            elif node.target in _BINARY:
                self._binary(node)
            elif node.target in _POOLS:
                if _global_pool(node):
                    self._shared(node)
            elif node.target in _RESHAPES:
                self._shared(node)
            elif node.target in _CLAMPS and _clamp_ok(node):
                self._shared(node)
        return model

    def validate(self, model: GraphModule) -> None:
        """Nothing to check beyond what :meth:`annotate` enforces while annotating."""

    # -- helpers --------------------------------------------------------------------------------------------
    def _wanted(self, node: Node) -> bool:
        return self.node_filter is None or bool(self.node_filter(node))

    @staticmethod
    def _done(node: Node) -> bool:
        ann = node.meta.get(_KEY)
        return ann is not None and ann._annotated

    @staticmethod
    def _mark(node: Node, inputs: dict[Node, QuantizationSpecBase | None], output: QuantizationSpecBase | None) -> None:
        node.meta[_KEY] = QuantizationAnnotation(input_qspec_map=inputs, output_qspec=output, _annotated=True)

    def _fused_clamp(self, node: Node) -> Node | None:
        """The relu / relu6 / clamp that is ``node``'s only user (and reads only ``node``), if any."""
        if len(node.users) != 1:
            return None
        user = next(iter(node.users))
        if (user.op == "call_function" and user.target in _CLAMPS and _clamp_ok(user) and user.args[0] is node
                and not self._done(user) and self._wanted(user)):
            return user
        return None

    def _output(self, node: Node) -> None:
        """Quantize ``node``'s output, or that of the clamp fused after it."""
        act = self._fused_clamp(node)
        if act is None:
            node.meta[_KEY].output_qspec = self.act
        else:
            self._mark(act, {}, self.act)

    def _gemm(self, node: Node) -> None:
        x, w = node.args[0], node.args[1]
        bias = _arg(node, 2, "bias")
        if not (_is_float_tensor(x) and _is_constant(w) and _is_float_tensor(w)):
            return
        if node.target in _CONV and _rank(w) != 4:
            return  # 2-D convolutions only
        if bias is not None and not (_is_constant(bias) and _is_float_tensor(bias)):
            return
        inputs: dict[Node, QuantizationSpecBase | None] = {x: self.act, w: self.weight}
        if bias is not None:
            inputs[bias] = self._bias_spec(x, w, node)
        self._mark(node, inputs, None)
        self._output(node)

    def _bias_spec(self, x: Node, w: Node, node: Node) -> DerivedQuantizationSpec:
        """int32 bias on the accumulator's scale (per output channel if the weights are)."""
        per_channel = self.per_channel
        return DerivedQuantizationSpec(
            derived_from=[(x, node), (w, node)], derive_qparams_fn=_bias_qparams, dtype=torch.int32,
            quant_min=-(2**31) + 1, quant_max=2**31 - 1,
            qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric,
            ch_axis=0 if per_channel else None)

    def _dynamic_linear(self, node: Node) -> None:
        x, w = node.args[0], node.args[1]
        bias = _arg(node, 2, "bias")
        if not (_is_float_tensor(x) and _is_constant(w) and _is_float_tensor(w)):
            return
        if bias is not None and not _is_constant(bias):
            return
        self._mark(node, {x: self.dynamic_act, w: self.weight}, None)

    def _binary(self, node: Node) -> None:
        a, b = node.args[0], node.args[1]
        if not (_is_float_tensor(a) and _is_float_tensor(b)) or _arg(node, 2, "alpha", 1) != 1:
            return
        if _rank(a) != _rank(b):
            return  # broadcasting across ranks stays in float
        inputs: dict[Node, QuantizationSpecBase | None] = {a: self.act}
        if b is not a:
            inputs[b] = self.act
        self._mark(node, inputs, None)
        self._output(node)

    def _shared(self, node: Node) -> None:
        x = node.args[0]
        if not _is_float_tensor(x) or node.target is operator.getitem:
            return
        self._mark(node, {x: self.act}, SharedQuantizationSpec((x, node)))
