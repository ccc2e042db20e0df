"""edgeport's program format: ExecuTorch-wire-compatible ``.pte`` files (flatbuffer ``ET12`` plus segments).

* :mod:`~edgeport.program.schema` - dataclasses, one per table of ``program.fbs`` (and the emitter conventions);
* :func:`serialize_pte` / :func:`write_pte_file` - Program -> ``.pte`` bytes -> file (atomically);
* :func:`load_pte` - hostile-input-safe reader returning a :class:`LoadedPte` with zero-copy segment views;
* :func:`verify_program` - index and tensor-metadata checks before execution.

Nothing in this package imports torch.
"""

from edgeport.program.flatbuffer_writer import program_to_flatbuffer
from edgeport.program.loaded import ExtendedHeader, LoadedPte, tensor_nbytes
from edgeport.program.pte import serialize_pte, write_pte_file
from edgeport.program.reader import load_pte, parse_extended_header
from edgeport.program.schema import *  # noqa: F401,F403
from edgeport.program.schema import __all__ as _schema_all
from edgeport.program.verify import program_problems, verify_program

__all__ = [
    "ExtendedHeader",
    "LoadedPte",
    "load_pte",
    "parse_extended_header",
    "program_problems",
    "program_to_flatbuffer",
    "serialize_pte",
    "tensor_nbytes",
    "verify_program",
    "write_pte_file",
    *_schema_all,
]
