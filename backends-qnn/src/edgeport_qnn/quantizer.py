"""``QnnQuantizer``: a torchao pt2e quantizer for ``QnnBackend`` (uint8 activations, int8 per-channel weights).

Use with torchao's flow on a plain ``torch.export.export(model, args).module()``::

    m = prepare_pt2e(torch.export.export(model, args).module(), QnnQuantizer())
    for batch in calibration_data:
        m(*batch)
    m = convert_pt2e(m)
    edge = to_edge_transform_and_lower(torch.export.export(m, args), partitioner=[QnnPartitioner()])

Activations: uint8 per-tensor affine ([0, 255], QNN's ``UFIXED_POINT_8``); convolution and linear weights: int8
symmetric per output channel ([-127, 127]); biases stay float (the lowering makes them int32 with scale
``input_scale * weight_scale``). A relu / relu6 / hardtanh right after a convolution, linear or add is fused (only
its output is quantized). Max pooling, reshapes and permutes share their input's parameters; average pooling and
``mean`` get their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e import HistogramObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    QuantizationSpecBase,
    Quantizer,
    SharedQuantizationSpec,
)

__all__ = ["QnnQuantizer"]

_KEY = "quantization_annotation"
_EPS = 2.0**-12
_aten = torch.ops.aten
_GEMM = {_aten.conv2d.default, _aten.linear.default}
_ADD = {_aten.add.Tensor, _aten.add_.Tensor}
_CLAMPS = {_aten.relu.default, _aten.relu_.default, _aten.hardtanh.default, _aten.hardtanh_.default,
           _aten.relu6.default}
_OWN = {_aten.avg_pool2d.default, _aten.adaptive_avg_pool2d.default, _aten.mean.dim}
_SHARED = {_aten.max_pool2d.default, _aten.view.default, _aten.reshape.default, _aten.flatten.using_ints,
           _aten.permute.default}


def _is_float(a: Any) -> bool:
    val = a.meta.get("val") if isinstance(a, Node) else None
    return isinstance(val, torch.Tensor) and val.dtype == torch.float32


class QnnQuantizer(Quantizer):
    """uint8/int8 quantization for ``QnnBackend``; ``node_filter(node) -> bool`` leaves chosen nodes in float."""

    def __init__(self, *, node_filter: Callable[[Node], bool] | None = None) -> None:
        super().__init__()
        self.node_filter = node_filter
        self.act = QuantizationSpec(dtype=torch.uint8, quant_min=0, quant_max=255, qscheme=torch.per_tensor_affine,
                                    observer_or_fake_quant_ctr=HistogramObserver.with_args(eps=_EPS))
        self.weight = QuantizationSpec(dtype=torch.int8, quant_min=-127, quant_max=127,
                                       qscheme=torch.per_channel_symmetric, ch_axis=0,
                                       observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=_EPS))

    def validate(self, model: GraphModule) -> None:
        """Nothing to check beyond what :meth:`annotate` enforces."""

    def annotate(self, model: GraphModule) -> GraphModule:
        for node in list(model.graph.nodes):
            if node.op != "call_function" or self._done(node) or not self._wanted(node):
                continue
            t = node.target
            if t in _GEMM:
                x, w = node.args[0], node.args[1]
                if _is_float(x) and isinstance(w, Node) and w.op == "get_attr":
                    self._mark(node, {x: self.act, w: self.weight}, None)
                    self._output(node)
            elif t in _ADD:
                a, b = node.args[0], node.args[1]
                if _is_float(a) and _is_float(b) and len(node.args) < 3:
                    self._mark(node, {a: self.act, **({b: self.act} if b is not a else {})}, None)
                    self._output(node)
            elif t in _OWN:
                if _is_float(node.args[0]):
                    self._mark(node, {node.args[0]: self.act}, self.act)
            elif t in _SHARED or t in _CLAMPS:
                x = node.args[0]
                if _is_float(x):
                    self._mark(node, {x: self.act}, SharedQuantizationSpec((x, node)))
        return model

    def _wanted(self, node: Node) -> bool:
        return self.node_filter is None or bool(self.node_filter(node))

    @staticmethod
    def _done(node: Node) -> bool:
        ann = node.meta.get(_KEY)
        return ann is not None and ann._annotated

    @staticmethod
    def _mark(node: Node, inputs: dict[Node, QuantizationSpecBase | None], output: QuantizationSpecBase | None) -> None:
        node.meta[_KEY] = QuantizationAnnotation(input_qspec_map=inputs, output_qspec=output, _annotated=True)

    def _output(self, node: Node) -> None:
        users = list(node.users)
        if (len(users) == 1 and users[0].op == "call_function" and users[0].target in _CLAMPS
                and users[0].args[0] is node and not self._done(users[0]) and self._wanted(users[0])):
            self._mark(users[0], {}, self.act)
        else:
            node.meta[_KEY].output_qspec = self.act
