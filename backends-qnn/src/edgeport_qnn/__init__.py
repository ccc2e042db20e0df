"""edgeport's Qualcomm QNN backend (``QnnBackend``): partitions lowered to QNN HTP graphs through Qualcomm's QNN
C API (:mod:`edgeport_qnn.sdk`, ctypes), stored as context binaries and run on the HTP (on x86-64: Qualcomm's
HTP emulator). Importing this package imports neither torch nor Qualcomm's libraries.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "QnnPartitioner": "edgeport_qnn.partitioner",
    "QnnExecutor": "edgeport_qnn.runtime",
    "QnnQuantizer": "edgeport_qnn.quantizer",
    "QuantDtype": "edgeport_qnn.quantizer",
    "QcomChipset": "edgeport_qnn.options",
    "QnnCompileOptions": "edgeport_qnn.options",
    "QnnRuntimeOptions": "edgeport_qnn.options",
    "generate_htp_compiler_spec": "edgeport_qnn.options",
    "generate_qnn_executorch_compiler_spec": "edgeport_qnn.options",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'edgeport_qnn' has no attribute {name!r}")
