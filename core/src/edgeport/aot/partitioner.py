"""The partitioner contract (ExecuTorch's ``Partitioner`` / ``PartitionResult``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch.export import ExportedProgram

from edgeport.backend import DelegationSpec

DELEGATION_TAG = "delegation_tag"
"""``node.meta`` key a partitioner sets to the partition tag of each node it delegates."""


@dataclass
class PartitionResult:
    """What ``Partitioner.partition`` returns.

    ``tagged_exported_program`` is the input program with ``node.meta["delegation_tag"]`` set on the nodes to
    delegate (and nothing else changed); ``partition_tags`` maps each tag to the backend and compile specs it
    goes to.
    """

    tagged_exported_program: ExportedProgram
    partition_tags: dict[str, DelegationSpec]


class Partitioner(ABC):
    """Decides which nodes of a program a backend takes.

    A partitioner only tags nodes: it sets ``node.meta["delegation_tag"]`` and returns the tag → spec mapping.
    It must not add, remove or rewire nodes; edgeport checks this and raises ``PartitionError`` if it did.
    """

    def __init__(self, spec: Mapping[str, Any] = MappingProxyType({})) -> None:
        self._spec = spec

    @property
    def spec(self) -> Mapping[str, Any]:
        return self._spec

    def __call__(self, exported_program: ExportedProgram) -> PartitionResult:
        return self.partition(exported_program)

    @abstractmethod
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        """Tag the nodes to delegate and return the tags with their :class:`DelegationSpec`."""

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        """Ops the backend wants kept whole during edge decomposition, and an optional per-node filter.

        ``to_edge_transform_and_lower`` keeps a node of a listed op whole when the filter is ``None`` or returns
        a true value for it (it is called only on nodes of the listed ops); other nodes are decomposed.
        """
        return [], None
