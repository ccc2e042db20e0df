"""Test-compiling candidate Arm partitions, so a partition the compiler refuses shrinks instead of failing the
lowering.

The Arm partitioners call :func:`find_refusals` after tagging: each partition is lowered to TOSA and, for
``EthosUBackend``, compiled by Vela in the isolated worker (:func:`~edgeport_arm.vela.compile_tosa_isolated`,
whose cache makes the real ``preprocess`` of an accepted partition free). The search for the nodes to move to the
CPU -- those the compiler's message names (our TOSA lowering names the node it cannot lower), else a bisection in
graph order, quantized compute nodes moving with the ones fused to them -- is the core's
:func:`edgeport.aot.trial.find_refusals`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.export import ExportedProgram

from edgeport.aot import trial as _trial
from edgeport.aot.to_backend import extract_subprogram
from edgeport.aot.trial import Refusal
from edgeport_arm.options import EthosUCompileSpec, TosaCompileSpec

__all__ = ["Refusal", "find_refusals", "try_compile"]

_named = _trial.named_in_message  # (kept for the tests that read the Arm messages with it)


def try_compile(ep: ExportedProgram, nodes: Sequence[torch.fx.Node],
                spec: TosaCompileSpec | EthosUCompileSpec) -> tuple[str, str, str | None] | None:
    """``None`` if ``nodes`` (call_function nodes of ``ep``) lower (and, for Ethos-U, compile with Vela); else
    ``(compiler, message, signal)``. ``ValueError`` for options Vela does not accept propagates."""
    from edgeport_arm.preprocess import lower_to_tosa

    members = [n for n in nodes if n.op == "call_function"]
    if not members:
        return None
    try:
        sub = extract_subprogram(ep, members)
        tosa, summary = lower_to_tosa(sub, spec.specification)
    except Exception as exc:  # noqa: BLE001 - any failure of our own lowering refuses the candidate, visibly
        return "the TOSA lowering", f"{type(exc).__name__}: {exc}", None
    if not isinstance(spec, EthosUCompileSpec):
        return None
    from edgeport_arm.ethos_u import vela_compile
    from edgeport_arm.vela import VelaCrashed, VelaError

    try:
        vela_compile(tosa, summary, sub, spec)
    except VelaCrashed as exc:
        return "Vela", str(exc), exc.signal
    except VelaError as exc:
        return "Vela", str(exc), None
    return None


def find_refusals(ep: ExportedProgram, partitions: dict[str, list[torch.fx.Node]],
                  spec: TosaCompileSpec | EthosUCompileSpec,
                  subset: Callable[[list[torch.fx.Node], list[torch.fx.Node]], list[torch.fx.Node]],
                  known_good: set[frozenset[str]]) -> list[Refusal]:
    """Test-compile each partition; for each refused one, a :class:`Refusal` naming nodes to move to the CPU.

    ``subset(members, excluded)`` gives the part of partition ``members`` that stays a valid partition once
    ``excluded`` go to the CPU (the quantized-island rules); ``known_good`` caches node sets that compiled.
    """
    def compiles(nodes: Sequence[torch.fx.Node]):  # type: ignore[no-untyped-def]
        return try_compile(ep, nodes, spec)

    return _trial.find_refusals(partitions, compiles, subset, known_good, fused_groups=True)
