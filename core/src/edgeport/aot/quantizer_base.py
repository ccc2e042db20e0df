"""What every backend's torchao pt2e quantizer needs: specs, annotation steps, the int32 bias.

A backend quantizer subclasses :class:`BackendQuantizer` and writes only its ``annotate``: which ops it runs
quantized and how. The base gives the steps those decisions are made of -- mark a node, quantize an output or
the clamp fused after it, share an input's parameters, quantize a binary op -- and the specs backends agree on:
int8 activations, symmetric int8 / int16 weights, and the int32 bias of an integer convolution or linear
(:func:`int32_bias_spec`: scale ``input_scale * weight_scale``, zero point 0, derived from the observers, so the
pt2e model adds the very bias the integer kernel adds to its int32 accumulator)::

    class AcmeQuantizer(BackendQuantizer):
        def __init__(self, observer="histogram"):
            super().__init__()
            self.act, self.weight = int8_activation_spec(observer), symmetric_weight_spec()

        def annotate(self, model):
            for node in self.candidates(model):
                if node.target == torch.ops.aten.conv2d.default:
                    x, w, b = node.args[0], node.args[1], node_arg(node, 2, "bias")
                    inputs = {x: self.act, w: self.weight}
                    if b is not None:
                        inputs[b] = int32_bias_spec(x, w, node)
                    self.mark(node, inputs)
                    self.quantize_output(node, self.act)
            return model

Part of the ``quantize`` extra: importing this module imports torch and torchao (import it lazily).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx import Node
from torchao.quantization.pt2e import HistogramObserver, MinMaxObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantizer import (
    DerivedQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    QuantizationSpecBase,
    Quantizer,
    SharedQuantizationSpec,
)

__all__ = [
    "ANNOTATION_KEY", "MIN_SCALE", "OBSERVERS", "BackendQuantizer", "int8_activation_spec", "int32_bias_qparams",
    "int32_bias_spec", "is_constant", "is_float_tensor", "observer_class", "symmetric_weight_spec", "tensor_rank",
]

#: where pt2e keeps a node's annotation
ANNOTATION_KEY = "quantization_annotation"
#: the smallest scale an observer may choose (keeps integer requantization ratios in range)
MIN_SCALE = 2.0**-12
#: activation observers by the name a quantizer's ``observer=`` argument takes
OBSERVERS: dict[str, type] = {"histogram": HistogramObserver, "minmax": MinMaxObserver}

Inputs = dict[Node, "QuantizationSpecBase | None"]


def is_float_tensor(a: Any) -> bool:
    """``a`` is a node whose value is a float32 tensor."""
    val = a.meta.get("val") if isinstance(a, Node) else None
    return isinstance(val, torch.Tensor) and val.dtype == torch.float32


def is_constant(a: Any) -> bool:
    """``a`` is a ``get_attr`` node (a weight or bias of the exported module)."""
    return isinstance(a, Node) and a.op == "get_attr"


def tensor_rank(a: Any) -> int | None:
    """The rank of ``a``'s tensor value, or ``None``."""
    val = a.meta.get("val") if isinstance(a, Node) else None
    return val.dim() if isinstance(val, torch.Tensor) else None


def observer_class(name: str, owner: str) -> type:
    """The observer class called ``name`` in :data:`OBSERVERS`; ``ValueError`` naming ``owner`` and the choices."""
    if name not in OBSERVERS:
        raise ValueError(f"{owner}: observer must be one of {sorted(OBSERVERS)}, got {name!r}")
    return OBSERVERS[name]


def int8_activation_spec(observer: str = "histogram", *, owner: str = "quantizer") -> QuantizationSpec:
    """int8 per-tensor affine activations over [-128, 127], observed by ``observer`` (``"histogram"`` or
    ``"minmax"``) with scales of at least :data:`MIN_SCALE`."""
    return QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine,
                            observer_or_fake_quant_ctr=observer_class(observer, owner).with_args(eps=MIN_SCALE))


def symmetric_weight_spec(dtype: torch.dtype = torch.int8, *, per_channel: bool = True) -> QuantizationSpec:
    """Symmetric weights (int8: [-127, 127], int16: [-32767, 32767], zero point 0), one scale per output channel
    (axis 0) or, with ``per_channel=False``, one per tensor."""
    qmax = {torch.int8: 127, torch.int16: 32767}[dtype]
    if per_channel:
        return QuantizationSpec(dtype=dtype, quant_min=-qmax, quant_max=qmax, qscheme=torch.per_channel_symmetric,
                                ch_axis=0, observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=MIN_SCALE))
    return QuantizationSpec(dtype=dtype, quant_min=-qmax, quant_max=qmax, qscheme=torch.per_tensor_symmetric,
                            observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=MIN_SCALE))


def int32_bias_qparams(observers: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 bias parameters from the input's and the weights' observers: ``input_scale * weight_scale`` (one per
    output channel, or one; the product in float64, then float32), zero point 0."""
    act_scale, _ = observers[0].calculate_qparams()
    weight_scale, _ = observers[1].calculate_qparams()
    scale = (act_scale.to(torch.float64) * weight_scale.to(torch.float64)).to(torch.float32).reshape(-1)
    return scale, torch.zeros_like(scale, dtype=torch.int32)


def int32_bias_spec(x: Node, w: Node, node: Node, *, per_channel: bool = True) -> DerivedQuantizationSpec:
    """The int32 bias of the convolution / linear ``node`` reading input ``x`` and weights ``w``: on the
    accumulator's scale (:func:`int32_bias_qparams`), per output channel when the weights are."""
    return DerivedQuantizationSpec(
        derived_from=[(x, node), (w, node)], derive_qparams_fn=int32_bias_qparams, dtype=torch.int32,
        quant_min=-(2**31) + 1, quant_max=2**31 - 1,
        qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric,
        ch_axis=0 if per_channel else None)


class BackendQuantizer(Quantizer):
    """Base of a backend's pt2e quantizer: ``node_filter(node) -> bool`` leaves nodes in float (``False``); a
    subclass implements ``annotate`` with the steps below. ``validate`` checks nothing by default."""

    def __init__(self, *, node_filter: Callable[[Node], bool] | None = None) -> None:
        super().__init__()
        self.node_filter = node_filter

    def validate(self, model: torch.fx.GraphModule) -> None:
        """Nothing to check beyond what ``annotate`` enforces while annotating."""

    def candidates(self, model: torch.fx.GraphModule) -> Iterator[Node]:
        """The graph's calls still to annotate, in order: not annotated yet (checked as each is reached, so a
        clamp fused into the node before it is skipped) and :meth:`wanted`."""
        for node in list(model.graph.nodes):
            if node.op == "call_function" and not self.annotated(node) and self.wanted(node):
                yield node

    def wanted(self, node: Node) -> bool:
        """``node`` may be quantized (``node_filter`` does not keep it in float)."""
        return self.node_filter is None or bool(self.node_filter(node))

    @staticmethod
    def annotated(node: Node) -> bool:
        """``node`` already carries an annotation (of this quantizer or one before it)."""
        ann = node.meta.get(ANNOTATION_KEY)
        return ann is not None and ann._annotated

    @staticmethod
    def mark(node: Node, inputs: Inputs, output: QuantizationSpecBase | None = None) -> None:
        """Annotate ``node``: its inputs' specs and its output's (``None``: float, or set later)."""
        node.meta[ANNOTATION_KEY] = QuantizationAnnotation(input_qspec_map=inputs, output_qspec=output,
                                                           _annotated=True)

    def fused_clamp(self, node: Node, fusable: Callable[[Node], bool]) -> Node | None:
        """The clamp (``fusable(user)``) that is ``node``'s only user and reads only ``node``, not yet annotated
        and wanted; ``None`` if there is none."""
        if len(node.users) != 1:
            return None
        user = next(iter(node.users))
        if (user.op == "call_function" and fusable(user) and user.args[0] is node and not self.annotated(user)
                and self.wanted(user)):
            return user
        return None

    def quantize_output(self, node: Node, spec: QuantizationSpecBase,
                        fusable: Callable[[Node], bool] | None = None) -> None:
        """Quantize the output of the annotated ``node`` with ``spec`` -- or, when ``fusable`` finds a clamp
        fused after it (:meth:`fused_clamp`), only that clamp's output."""
        clamp = self.fused_clamp(node, fusable) if fusable is not None else None
        if clamp is None:
            node.meta[ANNOTATION_KEY].output_qspec = spec
        else:
            self.mark(clamp, {}, spec)

    def annotate_binary(self, node: Node, spec: QuantizationSpecBase,
                        fusable: Callable[[Node], bool] | None = None) -> bool:
        """Both float tensor operands of ``node`` (one spec when they are the same node) and its output (or a
        fused clamp's) with ``spec``; ``False`` (nothing annotated) unless both operands are float tensors."""
        a, b = node.args[0], node.args[1]
        if not (is_float_tensor(a) and is_float_tensor(b)):
            return False
        inputs: Inputs = {a: spec}
        if b is not a:
            inputs[b] = spec
        self.mark(node, inputs)
        self.quantize_output(node, spec, fusable)
        return True

    def annotate_shared(self, node: Node, spec: QuantizationSpecBase) -> bool:
        """A float input ``args[0]`` quantized with ``spec`` and the output on the same parameters (ops that only
        move or select values: reshapes, max pooling, standalone clamps)."""
        x = node.args[0]
        if not is_float_tensor(x):
            return False
        self.mark(node, {x: spec}, SharedQuantizationSpec((x, node)))
        return True

    def annotate_own(self, node: Node, spec: QuantizationSpecBase) -> bool:
        """A float input ``args[0]`` and the output each with ``spec`` (their own parameters)."""
        x = node.args[0]
        if not is_float_tensor(x):
            return False
        self.mark(node, {x: spec}, spec)
        return True
