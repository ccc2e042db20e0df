"""``CoreMLQuantizer``: a torchao pt2e quantizer for ``CoreMLBackend`` (ExecuTorch's name and config type).

ExecuTorch 1.5.1's ``CoreMLQuantizer`` takes a ``coremltools.optimize.torch.quantization.LinearQuantizerConfig`` and
wraps coremltools' own pt2e quantizer. That quantizer does not import on torch 2.13 (coremltools 9.0's
``_coreml_quantizer`` imports ``torch.ao.quantization.quantizer``, which torch 2.13 removed in favour of torchao),
so the annotations are written here against torchao 0.18's ``Quantizer`` API; the config type is still coremltools'
(its ``quantization_config`` module imports fine) and is read field by field::

    from coremltools.optimize.torch.quantization.quantization_config import (LinearQuantizerConfig,
                                                                             ModuleLinearQuantizerConfig)
    config = LinearQuantizerConfig(global_config=ModuleLinearQuantizerConfig(
        quantization_scheme="symmetric", activation_dtype=torch.quint8, weight_dtype=torch.qint8,
        weight_per_channel=True))
    m = prepare_pt2e(torch.export.export(model, args).module(), CoreMLQuantizer(config))
    m(*calibration_args); m = convert_pt2e(m)
    edge = to_edge_transform_and_lower(torch.export.export(m, args), partitioner=[CoreMLPartitioner(specs)])

``activation_dtype`` ``torch.quint8`` / ``torch.qint8`` gives 8-bit static quantization (per-tensor activations on
the inputs and outputs of convolutions, linears, ``add`` and ``mul``; a ``relu`` / ``relu6`` / ``hardtanh`` right
after one is fused), ``torch.float32`` weight-only quantization. Weights: ``weight_dtype`` ``torch.qint8``
(symmetric: [-127, 127], zero point 0; affine: [-128, 127]) or ``torch.quint8`` ([0, 255]), per output channel
when ``weight_per_channel``. Biases stay float. ``CoreMLQuantizer.int8_static()`` and ``.int8_weight_only()`` build
the two common configs without importing coremltools. Static activation quantization converts to Core ML's
``quantize`` / ``dequantize`` ops, which need ``minimum_deployment_target`` iOS17 or newer; weight-only graphs
convert from iOS16 (``constexpr_affine_dequantize``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e import MinMaxObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantizer import QuantizationSpec

from edgeport.aot.quantizer_base import MIN_SCALE, BackendQuantizer, is_float_tensor

__all__ = ["CoreMLQuantizer", "QuantizationSettings"]

_EPS = MIN_SCALE
_aten = torch.ops.aten
_GEMM = {_aten.conv1d.default, _aten.conv2d.default, _aten.linear.default}
_BINARY = {_aten.add.Tensor, _aten.mul.Tensor}
_CLAMPS = {_aten.relu.default, _aten.relu_.default, _aten.hardtanh.default, _aten.hardtanh_.default,
           _aten.relu6.default}


@dataclass(frozen=True)
class QuantizationSettings:
    """What :class:`CoreMLQuantizer` does: ``activation_dtype`` ``None`` means weight-only."""

    activation_dtype: torch.dtype | None = torch.quint8
    weight_dtype: torch.dtype = torch.qint8
    symmetric: bool = True
    weight_per_channel: bool = True

    def __post_init__(self) -> None:
        if self.activation_dtype not in (None, torch.quint8, torch.qint8):
            raise ValueError(f"CoreMLQuantizer: activation_dtype must be torch.quint8, torch.qint8 or torch.float32 "
                             f"(weight-only), got {self.activation_dtype}")
        if self.weight_dtype not in (torch.qint8, torch.quint8):
            raise ValueError(f"CoreMLQuantizer: weight_dtype must be torch.qint8 or torch.quint8 (8-bit; 4-bit "
                             f"weights are the compile spec op_linear_quantizer_config), got {self.weight_dtype}")
        if self.weight_dtype == torch.quint8 and self.symmetric:
            raise ValueError("CoreMLQuantizer: symmetric weights need weight_dtype=torch.qint8 (zero point 0); use "
                             "quantization_scheme='affine' for torch.quint8 weights")


def _settings_from_coremltools(config: Any) -> QuantizationSettings:
    """Read a ``coremltools.optimize.torch.quantization.LinearQuantizerConfig`` (global config only)."""
    if getattr(config, "module_type_configs", None) or getattr(config, "module_name_configs", None):
        raise ValueError("CoreMLQuantizer: module_type_configs / module_name_configs are not supported; give one "
                         "global_config")
    g = getattr(config, "global_config", None)
    if g is None:
        raise ValueError("CoreMLQuantizer: the LinearQuantizerConfig has no global_config")
    if getattr(g, "weight_n_bits", 8) not in (None, 8):
        raise ValueError(f"CoreMLQuantizer: weight_n_bits={g.weight_n_bits} is not supported (8 only; use the "
                         "compile spec op_linear_quantizer_config for 4-bit weights)")
    scheme = str(getattr(g.quantization_scheme, "value", g.quantization_scheme))
    if scheme not in ("symmetric", "affine"):
        raise ValueError(f"CoreMLQuantizer: unknown quantization_scheme {scheme!r}")
    act = None if g.activation_dtype in (None, torch.float32) else g.activation_dtype
    return QuantizationSettings(act, g.weight_dtype, scheme == "symmetric", bool(g.weight_per_channel))


def _fusable(node: Node) -> bool:
    return node.target in _CLAMPS


class CoreMLQuantizer(BackendQuantizer):
    """pt2e annotations for Core ML: 8-bit static or weight-only, per-channel weights (see the module doc).

    ``config``: a coremltools ``LinearQuantizerConfig`` (ExecuTorch's argument), a :class:`QuantizationSettings`,
    or ``None`` for int8 static (uint8 symmetric activations, int8 symmetric per-channel weights).
    """

    def __init__(self, config: Any = None) -> None:
        super().__init__()
        if config is None:
            settings = QuantizationSettings()
        elif isinstance(config, QuantizationSettings):
            settings = config
        else:
            settings = _settings_from_coremltools(config)
        self.settings = settings
        s = settings
        self.act: QuantizationSpec | None = None
        if s.activation_dtype is not None:
            signed = s.activation_dtype == torch.qint8
            self.act = QuantizationSpec(
                dtype=torch.int8 if signed else torch.uint8, quant_min=-128 if signed else 0,
                quant_max=127 if signed else 255,
                qscheme=torch.per_tensor_symmetric if s.symmetric else torch.per_tensor_affine,
                observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=_EPS))
        signed_w = s.weight_dtype == torch.qint8
        lo, hi = ((-127, 127) if s.symmetric else (-128, 127)) if signed_w else (0, 255)
        if s.weight_per_channel:
            qscheme = torch.per_channel_symmetric if s.symmetric else torch.per_channel_affine
            observer: Any = PerChannelMinMaxObserver.with_args(eps=_EPS, ch_axis=0)
        else:
            qscheme = torch.per_tensor_symmetric if s.symmetric else torch.per_tensor_affine
            observer = MinMaxObserver.with_args(eps=_EPS)
        self.weight = QuantizationSpec(dtype=torch.int8 if signed_w else torch.uint8, quant_min=lo, quant_max=hi,
                                       qscheme=qscheme, ch_axis=0 if s.weight_per_channel else None,
                                       observer_or_fake_quant_ctr=observer)

    @classmethod
    def int8_static(cls) -> CoreMLQuantizer:
        """uint8 symmetric per-tensor activations, int8 symmetric per-channel weights."""
        return cls(QuantizationSettings())

    @classmethod
    def int8_weight_only(cls) -> CoreMLQuantizer:
        """int8 symmetric per-channel weights of convolutions and linears; activations stay float."""
        return cls(QuantizationSettings(activation_dtype=None))

    def __repr__(self) -> str:
        return f"CoreMLQuantizer({self.settings!r})"

    def annotate(self, model: GraphModule) -> GraphModule:
        for node in self.candidates(model):  # (no node_filter here: every node is wanted)
            if node.target in _GEMM:
                self._gemm(node)
            elif node.target in _BINARY and self.act is not None:
                self.annotate_binary(node, self.act, _fusable)
        return model

    def _gemm(self, node: Node) -> None:
        x, w = node.args[0], node.args[1]
        if not (is_float_tensor(x) and isinstance(w, Node) and w.op == "get_attr"):
            return
        if self.act is None:
            self.mark(node, {w: self.weight})
            return
        self.mark(node, {x: self.act, w: self.weight})
        self.quantize_output(node, self.act, _fusable)
