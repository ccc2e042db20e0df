"""Running passes over an ExportedProgram and rebuilding it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx.passes.infra.pass_base import PassResult

from edgeport.aot.graph_utils import new_exported_program, prune_state, rebuild_signature


def _run_pass(p: Callable[..., Any], gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    result = p(gm)
    if isinstance(result, PassResult):
        return result.graph_module
    if isinstance(result, torch.fx.GraphModule):
        return result
    return gm  # passes that edit in place and return None


def transform_program(ep: ExportedProgram, passes: Sequence[Callable[..., Any]]) -> ExportedProgram:
    """Apply graph-module passes in order and return a new program with an updated signature."""
    if not passes:
        return ep
    gm = ep.graph_module
    for p in passes:
        gm = _run_pass(p, gm)
    gm.recompile()
    signature = rebuild_signature(gm.graph, ep.graph_signature)
    state, consts = prune_state(dict(ep.state_dict), dict(ep.constants), signature)
    return new_exported_program(ep, gm, signature, state_dict=state, constants=consts)
