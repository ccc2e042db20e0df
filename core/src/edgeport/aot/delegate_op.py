"""The graph operator that stands for a call into a lowered backend module.

``torch.ops.edgeport.call_delegate(key, args)`` is a ``torch.library`` custom op, so a module that contains a
:class:`~edgeport.aot.lowered_module.LoweredBackendModule` can be exported again with ``torch.export`` (strict or
not) and survives decompositions. ``key`` names the lowered module in a process-wide weak registry; its eager
implementation runs the module's original program, and its fake implementation gives the output metadata.
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING

import torch

from edgeport.errors import LoweringError

if TYPE_CHECKING:  # pragma: no cover
    from edgeport.aot.lowered_module import LoweredBackendModule

_REGISTRY: weakref.WeakValueDictionary[str, LoweredBackendModule] = weakref.WeakValueDictionary()
_COUNTER = itertools.count()


def register_lowered_module(module: LoweredBackendModule) -> str:
    key = f"{module.backend_id}#{next(_COUNTER)}"
    _REGISTRY[key] = module
    return key


def lookup_lowered_module(key: str) -> LoweredBackendModule:
    module = _REGISTRY.get(key)
    if module is None:
        raise LoweringError(
            f"call_delegate refers to lowered module {key!r}, which no longer exists; keep the "
            "LoweredBackendModule (or the program holding it) alive until the program is written"
        )
    return module


@torch.library.custom_op("edgeport::call_delegate", mutates_args=())
def call_delegate(key: str, args: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run a lowered module eagerly through its original (pre-lowering) program."""
    module = lookup_lowered_module(key)
    outputs = module.original_module.module()(*args[:module.user_input_count()])  # constant inputs last
    if isinstance(outputs, torch.Tensor):
        outputs = [outputs]
    return [o.clone() for o in outputs]


@call_delegate.register_fake
def _call_delegate_fake(key: str, args: list[torch.Tensor]) -> list[torch.Tensor]:
    module = lookup_lowered_module(key)
    results = []
    for meta in module.output_metas():
        if any(not isinstance(s, int) for s in meta.shape):
            raise LoweringError(
                f"lowered module {key!r} has a dynamic output shape; re-exporting a module that calls it "
                "supports static shapes only"
            )
        results.append(torch.empty(meta.shape, dtype=meta.dtype))
    return results


CALL_DELEGATE = torch.ops.edgeport.call_delegate.default


def is_call_delegate(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is CALL_DELEGATE
