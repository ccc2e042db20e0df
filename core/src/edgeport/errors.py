"""Exception hierarchy. Every error edgeport raises on purpose derives from :class:`EdgeportError`."""

from __future__ import annotations


class EdgeportError(Exception):
    """Base class of every error edgeport raises deliberately."""


class BackendNotFoundError(EdgeportError, LookupError):
    """A backend id was asked for that no installed plugin registers."""


class PluginLoadError(EdgeportError):
    """A plugin could not be imported or its registration hook raised."""


class ExportError(EdgeportError):
    """A model could not be exported or is not in the dialect a stage expects."""


class VerificationError(EdgeportError):
    """A graph breaks an invariant of the dialect it claims to be in."""


class PartitionError(EdgeportError):
    """A partitioner broke the partitioning contract."""


class LoweringError(EdgeportError):
    """A backend's preprocess failed or produced something unusable."""


class UnsupportedOperatorError(EdgeportError):
    """An operator has no delegate and no portable out-variant."""


class SerializationError(EdgeportError):
    """A program could not be written in the ExecuTorch program format."""


class ProgramError(EdgeportError):
    """A ``.pte`` program is malformed: the message says what is wrong and where."""


class RuntimeExecutionError(EdgeportError):
    """Running a loaded method failed."""


class BackendOptionsError(EdgeportError, ValueError):
    """Runtime options given at load name a backend the program does not use, an unknown option or a wrong type."""
