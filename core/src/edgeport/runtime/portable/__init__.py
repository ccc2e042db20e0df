"""edgeport's portable kernel library: numpy implementations of ATen out-variant ops (torch-free).

``KERNELS`` maps ExecuTorch operator names (``"aten::add.out"``) to kernels following the calling convention
documented in :mod:`edgeport.runtime.kernel_utils`. :mod:`edgeport.runtime.portable_plugin` registers them.
"""

from __future__ import annotations

from edgeport.runtime.portable import (  # noqa: F401
    elementwise,
    extra,
    factory,
    linalg,
    llama_ops,
    nn,
    prim,
    quantized,
    reduce,
    shape,
)
from edgeport.runtime.portable._common import KERNELS

LIBRARY = "portable"

__all__ = ["KERNELS", "LIBRARY"]
