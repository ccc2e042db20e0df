"""TemplateBackend's typed compile options. Torch-free.

Each field becomes one ``CompileSpec`` (JSON-encoded value) through :class:`edgeport.CompileOptions`. The
partitioner puts them in every ``DelegationSpec``; ``preprocess`` and the executor's ``init`` receive them.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeport import CompileOptions

#: Targets this package can compile for and run. The target is recorded in the blob header, and the executor
#: refuses a blob compiled for a target it cannot run.
TARGETS = ("generic",)


@dataclass
class TemplateCompileOptions(CompileOptions):
    """``target``: the device generation to compile for (one of :data:`TARGETS`)."""

    target: str = "generic"

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"TemplateCompileOptions.target must be one of {list(TARGETS)}, got {self.target!r}")
