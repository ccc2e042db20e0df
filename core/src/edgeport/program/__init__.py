"""edgeport's program format: ExecuTorch-wire-compatible ``.pte`` files (flatbuffer ``ET12`` plus segments).

``schema`` holds the dataclasses (one per table of ``program.fbs``); the serializer and the hostile-input-safe
reader are added alongside. Nothing in this package imports torch.
"""

from edgeport.program.schema import *  # noqa: F401,F403
from edgeport.program.schema import __all__ as _schema_all

__all__ = list(_schema_all)
