"""Target profiles and the one-call API: ``edgeport.lower(model, example_inputs, target="qualcomm-htp")``.

A profile is an ordered list of backends (first = preferred) with the partitioner options and the quantizer
each uses. :func:`lower` exports the model, optionally quantizes it by node ownership
(:class:`~edgeport.aot.composable_quantizer.OwnershipQuantizer`), partitions it for all the profile's backends
at once (:class:`~edgeport.aot.joint_partitioner.JointPartitioner`), checks the strict-mode options and
serializes. Everything not delegated runs on the portable CPU kernels. torch is imported on first call only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgeport.errors import ExportError, PartitionError
from edgeport.registry import get_backend

__all__ = ["PROFILES", "BackendChoice", "LoweringReport", "TargetProfile", "lower", "resolve_profile"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendChoice:
    """One backend of a profile: its id, the key of its quantizer in ``BackendSpec.quantizers`` and the options
    given to its partitioner factory."""

    backend_id: str
    quantizer: str | None = None
    partitioner_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TargetProfile:
    name: str
    backends: tuple[BackendChoice, ...]
    description: str = ""


_XNNPACK = BackendChoice("XnnpackBackend", "int8")
# in a joint program the float nodes Ethos-U leaves go to the next backend or the CPU: allow them
_ETHOS_U = BackendChoice("EthosUBackend", "int8", {"cpu_fallback": True})

PROFILES: dict[str, TargetProfile] = {
    p.name: p for p in (
        TargetProfile("cpu", (_XNNPACK,), "XNNPACK, portable kernels for the rest"),
        TargetProfile("arm-ethos-u55", (_ETHOS_U,), "Ethos-U55 (int8), portable kernels for the rest"),
        TargetProfile("arm-ethos-u55+cpu", (_ETHOS_U, _XNNPACK), "Ethos-U55, then XNNPACK, then portable"),
        TargetProfile("qualcomm-htp", (BackendChoice("QnnBackend", "uint8"), _XNNPACK), "QNN HTP, then XNNPACK"),
        TargetProfile("apple", (BackendChoice("CoreMLBackend", "CoreMLQuantizer"), _XNNPACK),
                      "Core ML, then XNNPACK"),
        TargetProfile("vulkan", (BackendChoice("VulkanBackend"), _XNNPACK), "Vulkan GPU, then XNNPACK"),
    )
}


def resolve_profile(target: str | TargetProfile | None, backends: Sequence[str] | None = None) -> TargetProfile:
    """The profile named ``target``, or one made of ``backends`` (ids in priority order; they override
    ``target``'s list, keeping its options for the backends it names). Every backend must be installed."""
    if isinstance(target, TargetProfile):
        profile = target
    elif target is None:
        profile = PROFILES["cpu"]
    elif target in PROFILES:
        profile = PROFILES[target]
    else:
        raise ValueError(f"unknown target {target!r}; profiles: {', '.join(PROFILES)} "
                         "(or pass backends=[backend ids] / a TargetProfile)")
    if backends:
        known = {c.backend_id: c for p in (profile, *PROFILES.values()) for c in p.backends}
        profile = TargetProfile(f"{profile.name}[{','.join(backends)}]",
                                tuple(known.get(b, BackendChoice(b)) for b in backends))
    for choice in profile.backends:
        get_backend(choice.backend_id)  # BackendNotFoundError: lists the installed ones and the package
    return profile


@dataclass
class LoweringReport:
    """What :func:`lower` did: per-node ownership, quantization and decomposition decisions, the delegates."""

    target: str
    ownership: dict[str, Any]
    quantization: dict[str, Any]
    decompositions: dict[str, str]
    delegates: list[tuple[str, int]]  # (backend id, number of ops it runs) per delegate, in program order
    portable_ops: list[tuple[str, str, str]]  # (node, op, why not delegated)

    def table(self) -> str:
        """The delegation table: one line per backend, and the ops left on the CPU."""
        rows: dict[str, list[int]] = {}
        for backend, ops in self.delegates:
            rows.setdefault(backend, []).append(ops)
        lines = [f"{'backend':<18} {'delegates':>9} {'ops':>6}"]
        for backend, sizes in rows.items():
            lines.append(f"{backend:<18} {len(sizes):>9} {sum(sizes):>6}")
        lines.append(f"{'portable (CPU)':<18} {'-':>9} {len(self.portable_ops):>6}")
        for node, op, why in self.portable_ops:
            lines.append(f"  {node}: {op}: {why}")
        return "\n".join(lines)


def _stage(progress: Callable[[str], None] | None, name: str) -> None:
    log.info("lower: %s", name)
    if progress is not None:
        progress(name)


def _as_batches(calibration: Iterable[Any] | None, example_inputs: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    if calibration is None:
        return [example_inputs]
    return [tuple(b) if isinstance(b, (tuple, list)) else (b,) for b in calibration]


def _quantize(ep: Any, profile: TargetProfile, example_inputs: tuple[Any, ...],
              calibration: Iterable[Any] | None) -> tuple[Any, dict[str, Any]]:
    import torch

    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    except ImportError as exc:
        raise ImportError("quantize=True needs torchao (PT2E quantization): pip install 'edgeport[quantize]' "
                          f"(torchao==0.18.0); the import failed with: {exc}") from exc

    from edgeport.aot.composable_quantizer import OwnershipQuantizer, QuantizerEntry

    entries = []
    for choice in profile.backends:
        spec = get_backend(choice.backend_id)
        key = choice.quantizer or next(iter(spec.quantizers), None)
        if key is None:
            log.info("lower: %s has no quantizer; its nodes stay float", choice.backend_id)
            continue
        if key not in spec.quantizers:
            raise ValueError(f"backend {choice.backend_id!r} has no quantizer {key!r}; it has {list(spec.quantizers)}")
        table = spec.capabilities() if spec.capabilities is not None else None
        entries.append(QuantizerEntry(choice.backend_id, spec.quantizers[key](), table))
    if not entries:
        raise ValueError(f"quantize=True, but no backend of {profile.name!r} has a quantizer")
    quantizer = OwnershipQuantizer(entries)
    prepared = prepare_pt2e(ep.module(), quantizer)
    for batch in _as_batches(calibration, example_inputs):
        prepared(*batch)
    converted = convert_pt2e(prepared)
    return torch.export.export(converted, example_inputs), quantizer.report


def partitioners_for(target: str | TargetProfile | None = "cpu", backends: Sequence[str] | None = None) -> list[Any]:
    """The partitioners of a target profile (or of ``backends``, ids in priority order), each with the profile's
    options: what ``to_edge_transform_and_lower(ep, partitioner=...)`` takes."""
    return _partitioners(resolve_profile(target, backends))


def _partitioners(profile: TargetProfile) -> list[Any]:
    parts = []
    for choice in profile.backends:
        spec = get_backend(choice.backend_id)
        if spec.partitioner is None:
            raise PartitionError(f"backend {choice.backend_id!r} registers no partitioner; it cannot be in a profile")
        parts.append(spec.partitioner(**dict(choice.partitioner_options)))
    return parts


def _leftovers(program: Any, ownership: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    import operator

    from edgeport.aot.capability_partitioner import op_name
    from edgeport.aot.delegate_op import is_call_delegate

    out = []
    for n in program.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem or is_call_delegate(n):
            continue
        report = ownership.get(n.name)
        reasons = "; ".join(f"{b}: {why}" for b, why in report.not_taken.items()) if report else ""
        out.append((n.name, op_name(n.target), reasons or "no backend of the target takes it"))
    return out


def _op_allowed(op: str, allowed: Sequence[str]) -> bool:
    return any(op == a or op.startswith(a.rstrip(".") + ".") for a in allowed)


def lower(model: Any, example_inputs: Sequence[Any], target: str | TargetProfile = "cpu", *,
          quantize: bool = False, calibration: Iterable[Any] | None = None, backends: Sequence[str] | None = None,
          require_full_delegation: bool = False, allowed_portable_ops: Sequence[str] | None = None,
          min_partition_ops: int = 1, max_partitions: int | None = None, boundary_cost: int = 1,
          portable_fallbacks: bool = False, progress: Callable[[str], None] | None = None) -> Any:
    """Export, (quantize,) partition for the target's backends jointly, and serialize: an
    ``ExecutorchProgramManager`` whose ``lowering_report`` (:class:`LoweringReport`) says who runs what and why.

    ``target``: a profile name (:data:`PROFILES`) or a :class:`TargetProfile`; ``backends`` overrides its
    backend list. ``quantize=True`` quantizes each node with its owner backend's quantizer, calibrated on
    ``calibration`` (an iterable of input tuples; default: the example inputs). ``require_full_delegation``
    raises ``PartitionError`` naming every node left on the CPU and why; ``allowed_portable_ops`` (op names
    such as ``"aten.sin.default"`` or ``"aten.sin"``) allows those ops, and only those, on the CPU.
    ``portable_fallbacks`` makes the program carry portable versions of its delegates (for
    ``on_backend_unavailable="portable"`` at load). ``progress(stage)`` is called as each stage starts.
    """
    import torch

    from edgeport.aot.config import ExecutorchBackendConfig
    from edgeport.aot.edge import to_edge_transform_and_lower
    from edgeport.aot.joint_partitioner import JointPartitioner

    profile = resolve_profile(target, backends)
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"lower: expected a torch.nn.Module, got {type(model).__name__}")
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    _stage(progress, "export")
    try:
        ep = torch.export.export(model.eval(), inputs)
    except Exception as exc:
        raise ExportError(f"lower: torch.export failed: {type(exc).__name__}: {exc}") from exc
    quantization: dict[str, Any] = {}
    if quantize:
        _stage(progress, "quantize")
        ep, quantization = _quantize(ep, profile, inputs, calibration)
    _stage(progress, "partition")
    joint = JointPartitioner(_partitioners(profile), min_partition_ops=min_partition_ops,
                             max_partitions=max_partitions, boundary_cost=boundary_cost)

    def partitioned(result: Any) -> None:
        used = {s.backend_id for s in result.partition_tags.values()}
        _stage(progress, "preprocess: " + (", ".join(c.backend_id for c in profile.backends
                                                     if c.backend_id in used) or "(no delegates)"))

    joint.on_partitioned = partitioned
    edge = to_edge_transform_and_lower(ep, partitioner=[joint])
    program = edge.exported_program()
    leftovers = _leftovers(program, joint.ownership)
    for node, op, why in leftovers:
        log.info("lower: %s (%s) runs on the CPU: %s", node, op, why)
    if require_full_delegation or allowed_portable_ops is not None:
        allowed = list(allowed_portable_ops or [])
        bad = [x for x in leftovers if not _op_allowed(x[1], allowed)]
        if bad:
            lines = "\n".join(f"  {node} ({op}): {why}" for node, op, why in bad)
            allow = f" (allowed: {allowed})" if allowed else ""
            raise PartitionError(
                f"strict mode: {len(bad)} node(s) would run on the CPU{allow} with target {profile.name!r}:\n{lines}\n"
                "Add a backend that takes them (backends=[...]), allow them (allowed_portable_ops=[...]), or "
                "drop require_full_delegation")
    _stage(progress, "serialize")
    manager = edge.to_executorch(ExecutorchBackendConfig(portable_fallbacks=portable_fallbacks))
    delegates = []
    from edgeport.aot.delegate_op import is_call_delegate, lookup_lowered_module

    for n in program.graph.nodes:
        if is_call_delegate(n):
            lowered = lookup_lowered_module(n.args[0])
            ops = sum(1 for m in lowered.original_module.graph.nodes if m.op == "call_function")
            delegates.append((lowered.backend_id, ops))
    manager.lowering_report = LoweringReport(profile.name, joint.ownership, quantization, joint.decompositions,
                                             delegates, leftovers)
    return manager
