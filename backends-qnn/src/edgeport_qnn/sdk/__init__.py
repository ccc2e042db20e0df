"""edgeport's torch-free access to Qualcomm's QNN C API through ctypes (our own ABI declarations).

The libraries themselves are Qualcomm's, used where they are installed (see :mod:`edgeport_qnn.sdk.locate`).
"""

from __future__ import annotations

from edgeport_qnn.sdk.abi import DataType, LogLevel
from edgeport_qnn.sdk.builder import GraphBuilder
from edgeport_qnn.sdk.errors import QnnError, error_name
from edgeport_qnn.sdk.locate import QnnLibraries, QnnLibrariesNotFound, find_qnn_libraries, qnn_available
from edgeport_qnn.sdk.session import Context, Graph, QnnBackend
from edgeport_qnn.sdk.tensors import QuantParams, TensorSpec

__all__ = ["Context", "DataType", "Graph", "GraphBuilder", "LogLevel", "QnnBackend", "QnnError", "QnnLibraries",
           "QnnLibrariesNotFound", "QuantParams", "TensorSpec", "error_name", "find_qnn_libraries", "qnn_available"]
