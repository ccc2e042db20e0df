"""Tagging weights for ``.ptd`` data files: which file a delegate's weights go to.

Non-delegated constants are moved by ``ExecutorchBackendConfig(external_constants=...)``. Weights a backend takes
into its delegate are the backend's named data; a backend writes them to ``<tag>.ptd`` when the weight's
placeholder carries ``node.meta["custom"]["delegate_constant_tag"] = tag`` (ExecuTorch's key, which its
``delegate_external_constants_pass_unlifted`` sets on an unlifted module). :func:`tag_delegate_constants` sets it
on an ``ExportedProgram`` directly, before lowering.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.export import ExportedProgram

__all__ = ["DELEGATE_CONSTANT_TAG", "tag_delegate_constants"]

DELEGATE_CONSTANT_TAG = "delegate_constant_tag"


def tag_delegate_constants(ep: ExportedProgram, gen_tag_fn: Callable[[torch.fx.Node], str | None] | str
                           ) -> ExportedProgram:
    """Mark each parameter and buffer placeholder of ``ep`` (in place) with the ``.ptd`` tag ``gen_tag_fn(node)``
    returns (a string tags every weight the same; ``None`` leaves a weight in the program). Returns ``ep``."""
    sig = ep.graph_signature
    weights = set(sig.inputs_to_parameters) | set(sig.inputs_to_buffers)
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in weights:
            continue
        tag = gen_tag_fn if isinstance(gen_tag_fn, str) else gen_tag_fn(node)
        if tag is not None and (not isinstance(tag, str) or not tag):
            raise ValueError(f"gen_tag_fn returned {tag!r} for {node.name!r}: expected a file tag (str) or None")
        custom = node.meta.setdefault("custom", {})
        if tag is None:
            custom.pop(DELEGATE_CONSTANT_TAG, None)
        else:
            custom[DELEGATE_CONSTANT_TAG] = tag
    return ep
