"""edgeport's Qualcomm QNN backend (foundation): :mod:`edgeport_qnn.sdk` drives Qualcomm's QNN libraries (HTP,
on x86 through Qualcomm's emulator) through ctypes. The edgeport plugin (partitioner, lowering) comes later.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
