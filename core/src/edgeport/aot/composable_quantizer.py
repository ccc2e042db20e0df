"""Quantization by ownership: each node is annotated by the quantizer of the backend that will run it.

torchao's ``ComposableQuantizer`` runs quantizers one after another; the first to annotate a node wins, so the
result depends on the order and a node may be quantized for a backend that will never run it.
:class:`OwnershipQuantizer` instead decides an *owner* per node first (the highest-priority backend whose
quantizer annotates the node and whose capability table can take its op), then applies only the owner's
annotation to it. Each quantizer annotates the graph on its own (annotations cleared in between), so the
result does not depend on what another quantizer did. :attr:`OwnershipQuantizer.report` says what was quantized
how and why. torchao is imported when this module is, so import it lazily (``edgeport.targets`` does).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import Quantizer

from edgeport.backend import CapabilityTable

__all__ = ["OwnershipQuantizer", "QuantizedNode", "QuantizerEntry"]

log = logging.getLogger(__name__)
_ANNOTATION = "quantization_annotation"


@dataclass(frozen=True)
class QuantizerEntry:
    """One backend's quantizer and (optionally) its capability table, in priority order."""

    backend_id: str
    quantizer: Quantizer
    capabilities: CapabilityTable | None = None


@dataclass
class QuantizedNode:
    """What happened to one node: its owner, how it is quantized, and why the other quantizers were not used."""

    node: str
    op: str
    owner: str | None
    how: str
    not_used: dict[str, str] = field(default_factory=dict)


def _describe_spec(spec: Any) -> str:
    if spec is None:
        return "float"
    dtype = getattr(spec, "dtype", None)
    if dtype is None:
        return type(spec).__name__.replace("QuantizationSpec", "").lower() or "shared"
    scheme = str(getattr(spec, "qscheme", "")).removeprefix("torch.")
    return f"{str(dtype).removeprefix('torch.')} {scheme}".strip()


def describe_annotation(annotation: Any) -> str:
    """``"in: int8 per_tensor_affine, int8 per_channel_symmetric; out: int8 per_tensor_affine"``."""
    inputs = [_describe_spec(s) for s in getattr(annotation, "input_qspec_map", {}).values()]
    out = _describe_spec(getattr(annotation, "output_qspec", None))
    return f"in: {', '.join(inputs) or '-'}; out: {out}"


def _core_name(node: Node) -> str:
    from edgeport.aot.capability_partitioner import op_name

    return op_name(node.target)


class OwnershipQuantizer(Quantizer):
    """Compose backends' quantizers by node ownership (``entries`` in priority order, first preferred)."""

    def __init__(self, entries: Sequence[QuantizerEntry]) -> None:
        super().__init__()
        self.entries = list(entries)
        if not self.entries:
            raise ValueError("OwnershipQuantizer needs at least one quantizer")
        self.report: dict[str, QuantizedNode] = {}

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        for e in self.entries:
            model = e.quantizer.transform_for_annotation(model)
        return model

    def _capable(self, entry: QuantizerEntry, node: Node) -> str | None:
        """Why ``entry``'s backend cannot take ``node``'s op, or ``None``.

        Only core ATen ops (those that reach the backend as themselves) are checked: an op torch decomposes
        further (``conv2d``, ``flatten``) is trusted to the quantizer, which knows its backend's patterns.
        """
        import torch

        if entry.capabilities is None:
            return None
        name = _core_name(node)
        if not isinstance(node.target, torch._ops.OpOverload) or torch.Tag.core not in node.target.tags:
            return None
        if any(c.op == name for c in entry.capabilities.ops):
            return None
        return f"{entry.backend_id} cannot run {name} (not in its capability table)"

    def annotate(self, model: GraphModule) -> GraphModule:
        nodes = [n for n in model.graph.nodes if n.op == "call_function"]
        by_entry: list[dict[Node, Any]] = []
        for e in self.entries:
            for n in model.graph.nodes:
                n.meta.pop(_ANNOTATION, None)
            e.quantizer.annotate(model)
            by_entry.append({n: n.meta[_ANNOTATION] for n in model.graph.nodes if _ANNOTATION in n.meta})
        for n in model.graph.nodes:
            n.meta.pop(_ANNOTATION, None)
        self.report = {}
        for n in nodes:
            owner: int | None = None
            not_used: dict[str, str] = {}
            for i, e in enumerate(self.entries):
                if owner is not None:
                    if n in by_entry[i]:
                        not_used[e.backend_id] = f"owned by higher-priority {self.entries[owner].backend_id}"
                    continue
                if n not in by_entry[i]:
                    not_used[e.backend_id] = f"{type(e.quantizer).__name__} does not quantize this node"
                    continue
                why = self._capable(e, n)
                if why is not None:
                    not_used[e.backend_id] = why
                    continue
                owner = i
            if owner is None:
                self.report[n.name] = QuantizedNode(n.name, _core_name(n), None, "float", not_used)
                continue
            annotation = by_entry[owner][n]
            n.meta[_ANNOTATION] = annotation
            self.report[n.name] = QuantizedNode(n.name, _core_name(n), self.entries[owner].backend_id,
                                                describe_annotation(annotation), not_used)
        counts: dict[str, int] = {}
        for r in self.report.values():
            counts[r.owner or "float"] = counts.get(r.owner or "float", 0) + 1
        log.info("quantization by ownership: %s", counts)
        return model

    def validate(self, model: GraphModule) -> None:
        """Each quantizer validated the graph it annotated; the composition adds no rule of its own."""
