"""``QnnQuantizer``: a torchao pt2e quantizer for ``QnnBackend`` (8- or 16-bit activations, 8- or 16-bit weights).

Use with torchao's flow on a plain ``torch.export.export(model, args).module()``::

    quantizer = QnnQuantizer()
    quantizer.set_default_quant_config(QuantDtype.use_16a8w)      # ExecuTorch's spelling; default: use_8a8w
    m = prepare_pt2e(torch.export.export(model, args).module(), quantizer)
    for batch in calibration_data:
        m(*batch)
    m = convert_pt2e(m)
    edge = to_edge_transform_and_lower(torch.export.export(m, args), partitioner=[QnnPartitioner()])

Activations: unsigned per-tensor affine, 8-bit ([0, 255], QNN's ``UFIXED_POINT_8``) or 16-bit ([0, 65535] held in
int32 as ExecuTorch does, QNN's ``UFIXED_POINT_16``); convolution and linear weights: symmetric per output channel,
int8 ([-127, 127]) or int16 ([-32767, 32767]); biases stay float (the lowering makes them int32 with scale
``input_scale * weight_scale``). A relu / relu6 / hardtanh right after a convolution, linear or add is fused (only
its output is quantized). Reshapes, permutes, transposes, slices and max pooling share their input's parameters;
everything else quantized (add / sub / mul, matmul, sigmoid, tanh (8-bit only: the HTP refuses a 16-bit ``Tanh``),
hardswish, gelu, softmax, layer norm, pooling, ``mean``) gets its own output parameters. Layer norm weights stay float
(the lowering gives QNN's ``LayerNorm`` a uint8 gamma and an int32 beta, the form the HTP takes).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e import HistogramObserver, MinMaxObserver
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from edgeport.aot.quantizer_base import MIN_SCALE, BackendQuantizer, is_float_tensor, symmetric_weight_spec

__all__ = ["QnnQuantizer", "QuantDtype"]


class QuantDtype(enum.IntEnum):
    """Activation / weight bit widths (ExecuTorch's names and values); edgeport-qnn lowers these three."""

    use_16a16w = 0
    use_16a8w = 1
    use_8a8w = 4


_EPS = MIN_SCALE
_EPS16 = 2.0**-24  # smallest 16-bit activation scale (2**-12 would cap the resolution of small ranges)
_aten = torch.ops.aten
_GEMM = {_aten.conv2d.default, _aten.linear.default}
_BINARY = {_aten.add.Tensor, _aten.add_.Tensor, _aten.sub.Tensor, _aten.mul.Tensor, _aten.matmul.default,
           _aten.bmm.default, _aten.mm.default}
_FUSE_AFTER = {_aten.add.Tensor, _aten.add_.Tensor}
_CLAMPS = {_aten.relu.default, _aten.relu_.default, _aten.hardtanh.default, _aten.hardtanh_.default,
           _aten.relu6.default}
_OWN = {_aten.avg_pool2d.default, _aten.adaptive_avg_pool2d.default, _aten.mean.dim, _aten.sigmoid.default,
        _aten.tanh.default, _aten.hardswish.default, _aten.gelu.default, _aten.softmax.int, _aten._softmax.default,
        _aten.layer_norm.default}
_SHARED = {_aten.max_pool2d.default, _aten.view.default, _aten.reshape.default, _aten.flatten.using_ints,
           _aten.permute.default, _aten.transpose.int, _aten.unsqueeze.default, _aten.squeeze.dim,
           _aten.contiguous.default, _aten.clone.default, _aten.dropout.default, _aten.slice.Tensor,
           _aten.select.int}


def _fusable(node: Node) -> bool:
    return node.target in _CLAMPS


def _specs(quant_dtype: QuantDtype) -> tuple[QuantizationSpec, QuantizationSpec]:
    """(activation spec, weight spec) of a :class:`QuantDtype`."""
    if quant_dtype == QuantDtype.use_8a8w:
        act = QuantizationSpec(dtype=torch.uint8, quant_min=0, quant_max=255, qscheme=torch.per_tensor_affine,
                               observer_or_fake_quant_ctr=HistogramObserver.with_args(eps=_EPS))
    else:  # 16-bit activations in int32 (as ExecuTorch does: torch has no uint16 quantize kernels)
        act = QuantizationSpec(dtype=torch.int32, quant_min=0, quant_max=65535, qscheme=torch.per_tensor_affine,
                               observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=_EPS16))
    return act, symmetric_weight_spec(torch.int16 if quant_dtype == QuantDtype.use_16a16w else torch.int8)


class QnnQuantizer(BackendQuantizer):
    """Quantization for ``QnnBackend``; ``quant_dtype`` (default ``QuantDtype.use_8a8w``), ``node_filter(node) ->
    bool`` leaves chosen nodes in float."""

    def __init__(self, *, node_filter: Callable[[Node], bool] | None = None,
                 quant_dtype: QuantDtype = QuantDtype.use_8a8w) -> None:
        super().__init__(node_filter=node_filter)
        self.set_default_quant_config(quant_dtype)

    def set_default_quant_config(self, quant_dtype: QuantDtype, is_qat: bool = False,
                                 is_conv_per_channel: bool = True, is_linear_per_channel: bool = True,
                                 act_observer: Any = None, **unsupported: Any) -> None:
        """ExecuTorch's way to choose the bit widths. Weights are always per output channel here (the
        ``is_*_per_channel`` flags are accepted for compatibility); ``act_observer`` replaces the activation
        observer class. QAT and other ExecuTorch options are refused."""
        try:
            quant_dtype = QuantDtype(int(quant_dtype))
        except (ValueError, TypeError):
            raise ValueError(f"QnnQuantizer: quant_dtype {quant_dtype!r} is not supported by edgeport-qnn; one of "
                             f"{[d.name for d in QuantDtype]}") from None
        if is_qat:
            raise ValueError("QnnQuantizer: is_qat=True (quantization-aware training) is not supported; use PTQ")
        if unsupported:
            raise ValueError(f"QnnQuantizer.set_default_quant_config: unsupported options {sorted(unsupported)}")
        del is_conv_per_channel, is_linear_per_channel
        self.quant_dtype = quant_dtype
        self.act, self.weight = _specs(quant_dtype)
        if act_observer is not None:
            self.act = QuantizationSpec(dtype=self.act.dtype, quant_min=self.act.quant_min,
                                        quant_max=self.act.quant_max, qscheme=self.act.qscheme,
                                        observer_or_fake_quant_ctr=act_observer.with_args(eps=_EPS))

    def annotate(self, model: GraphModule) -> GraphModule:
        for node in self.candidates(model):
            t = node.target
            if t in _GEMM:
                x, w = node.args[0], node.args[1]
                if is_float_tensor(x) and isinstance(w, Node) and w.op == "get_attr":
                    self.mark(node, {x: self.act, w: self.weight})
                    self.quantize_output(node, self.act, _fusable)
            elif t in _BINARY:
                a, b = node.args[0], node.args[1]
                if len(node.args) < 3 and is_float_tensor(a) and (is_float_tensor(b) or isinstance(b, (int, float))):
                    self.mark(node, {x: self.act for x in (a, b) if isinstance(x, Node)})
                    self.quantize_output(node, self.act, _fusable if t in _FUSE_AFTER else None)
            elif t in _OWN:
                if not (t == _aten.tanh.default and self.quant_dtype != QuantDtype.use_8a8w):
                    self.annotate_own(node, self.act)
            elif t in _SHARED or t in _CLAMPS:
                self.annotate_shared(node, self.act)
        return model
