"""Quantization support of TemplateBackend.

TemplateBackend computes in float32, so it registers no quantizer: :func:`quantizers` returns an empty dict and
a quantized model's ``quantize``/``dequantize`` nodes simply stay on edgeport's portable kernels.

A backend with integer kernels registers quantizer factories here, by name, in ``BackendSpec.quantizers``, and
builds its quantizer on :class:`edgeport.aot.quantizer_base.BackendQuantizer` (torchao's pt2e ``Quantizer`` plus
the steps and specs backends share: int8 activations, symmetric weights, the int32 bias on the accumulator's
scale, clamp fusion, shared parameters)::

    def quantizers():
        return {"int8": _int8_quantizer}

    def _int8_quantizer(**options):
        import torch   # imported lazily: torch and torchao are heavy
        from edgeport.aot.quantizer_base import (BackendQuantizer, int8_activation_spec, int32_bias_spec,
                                                 symmetric_weight_spec)

        class TemplateInt8Quantizer(BackendQuantizer):
            def __init__(self, observer="histogram", node_filter=None):
                super().__init__(node_filter=node_filter)
                self.act, self.weight = int8_activation_spec(observer), symmetric_weight_spec()

            def annotate(self, model):   # mark the patterns the backend runs in int8
                for node in self.candidates(model):
                    if node.target == torch.ops.aten.linear.default:
                        x, w, *bias = node.args
                        inputs = {x: self.act, w: self.weight}
                        if bias and bias[0] is not None:
                            inputs[bias[0]] = int32_bias_spec(x, w, node)
                        self.mark(node, inputs)
                        self.quantize_output(node, self.act)
                    elif node.target == torch.ops.aten.add.Tensor:
                        self.annotate_binary(node, self.act)
                return model
        return TemplateInt8Quantizer(**options)

and lists the quantized ops (``quantized_decomposed.*``, the int8 dtypes) in its capability table, so the
conformance suite tests them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def quantizers() -> dict[str, Callable[..., Any]]:
    """Quantizer factories by name, for ``BackendSpec.quantizers`` (none: this backend runs float32)."""
    return {}
