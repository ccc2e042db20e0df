"""Quantization support of TemplateBackend.

TemplateBackend computes in float32, so it registers no quantizer: :func:`quantizers` returns an empty dict and
a quantized model's ``quantize``/``dequantize`` nodes simply stay on edgeport's portable kernels.

A backend with integer kernels registers quantizer factories here, by name, in ``BackendSpec.quantizers``::

    def quantizers():
        return {"int8": _int8_quantizer}

    def _int8_quantizer(**options):
        from torchao.quantization.pt2e.quantizer import Quantizer   # imported lazily: torchao is heavy

        class TemplateInt8Quantizer(Quantizer):
            def annotate(self, model): ...   # mark the patterns the backend runs in int8
            def validate(self, model): ...
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
