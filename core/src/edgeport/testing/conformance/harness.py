"""The machinery behind :class:`~edgeport.testing.conformance.BackendConformance`, usable on its own.

* :class:`Case` / :func:`op_cases` / :func:`model_case` - what is tested: one call of one claimed op (op, dtype,
  sample) or one model of :mod:`edgeport.testing.models`;
* :class:`OpModule` - a tiny ``torch.nn.Module`` that calls one op overload on its inputs;
* :class:`RecordingPartitioner` - wraps a backend's partitioner inside the real pipeline and checks, at the moment
  it returns, that it only tagged nodes and which nodes it tagged (:class:`PartitionRecord`);
* :func:`lower_case` - export, ``to_edge_transform_and_lower``, ``to_executorch``, keeping each stage's error;
* :func:`compare_outputs`, :func:`corrupt_blob`, :func:`patch_program` - the runtime checks.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import operator
import re
import struct
import traceback
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from edgeport.backend import CapabilityTable, CompileSpec, DelegationSpec
from edgeport.testing.conformance.samples import SAMPLES, Const, Sample, SampleMaker

__all__ = [
    "DEFAULT_MODELS",
    "DEFAULT_MODEL_TOLERANCES",
    "DEFAULT_TOLERANCES",
    "Case",
    "LoweredCase",
    "NodeRecord",
    "OpModule",
    "PartitionRecord",
    "RecordingPartitioner",
    "compare_outputs",
    "corrupt_blob",
    "lower_case",
    "model_case",
    "op_cases",
    "patch_program",
    "resolve_op",
]

DEFAULT_MODELS = ("mlp", "cnn_bn_pool", "mobilenet_v2_style", "resnet_block", "transformer_encoder_layer")
"""Models of :data:`edgeport.testing.models.MODELS` every backend is run on."""

# (atol, rtol) by dtype name; integer and bool outputs must match exactly.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-5, 1.3e-6),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1.6e-2),
}
DEFAULT_MODEL_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-6, 1e-6),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}


# -- ops and cases -----------------------------------------------------------------------------------------


def resolve_op(name: str) -> torch._ops.OpOverload:
    """``"aten.add.Tensor"`` -> ``torch.ops.aten.add.Tensor`` (``ValueError`` if there is no such overload)."""
    parts = name.split(".")
    if len(parts) != 3:
        raise ValueError(f"op name {name!r} must look like 'namespace.op.overload' (e.g. 'aten.add.Tensor')")
    namespace, op, overload = parts
    if namespace == "quantized_decomposed":  # torch registers these ops only when this module is imported
        importlib.import_module("torch.ao.quantization.fx._decomposed")
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        return getattr(packet, overload)
    except (AttributeError, RuntimeError) as exc:
        raise ValueError(f"{name!r} is not a torch operator overload: {exc}") from None


class OpModule(torch.nn.Module):
    """Calls one op overload: tensors of the sample are the inputs, :class:`Const` tensors are parameters."""

    def __init__(self, op: Any, sample: Sample) -> None:
        super().__init__()
        self.op = op
        self.op_name = str(op)
        self.kwargs = dict(sample.kwargs)
        self.outputs = sample.outputs
        self.example_inputs: list[torch.Tensor] = []
        consts = 0

        def template(value: Any) -> Any:
            nonlocal consts
            if isinstance(value, Const):
                name = f"w{consts}"
                consts += 1
                self.register_parameter(name, torch.nn.Parameter(value.tensor.clone(), requires_grad=False))
                return ("const", name)
            if isinstance(value, torch.Tensor):
                self.example_inputs.append(value)
                return ("input", len(self.example_inputs) - 1)
            if isinstance(value, (list, tuple)):
                return ("seq", type(value), [template(v) for v in value])
            return ("lit", value)

        self._template = [template(a) for a in sample.args]

    def _build(self, spec: Any, inputs: Sequence[torch.Tensor]) -> Any:
        kind = spec[0]
        if kind == "const":
            return getattr(self, spec[1])
        if kind == "input":
            return inputs[spec[1]]
        if kind == "seq":
            return spec[1](self._build(s, inputs) for s in spec[2])
        return spec[1]

    def forward(self, *inputs: torch.Tensor) -> Any:
        result = self.op(*(self._build(s, inputs) for s in self._template), **self.kwargs)
        if self.outputs is not None:
            picked = tuple(result[i] for i in self.outputs)
            return picked[0] if len(picked) == 1 else picked
        return result


@dataclass(frozen=True)
class Case:
    """One thing the suite lowers and runs: an op sample (``kind="op"``) or a zoo model (``kind="model"``)."""

    id: str
    kind: str
    op: str | None = None
    dtype: str | None = None
    sample: Sample | None = None
    model: str | None = None
    error: str | None = None  # set when the case cannot be built; its tests fail with this message

    def build(self) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        if self.error is not None:
            raise RuntimeError(self.error)
        if self.kind == "model":
            from edgeport.testing.models import MODELS

            module, inputs = MODELS[self.model](seed=0)  # type: ignore[index]
            return module, tuple(inputs)
        assert self.op is not None and self.sample is not None
        module = OpModule(resolve_op(self.op), self.sample).eval()
        return module, tuple(module.example_inputs)


def _seed(text: str) -> int:
    return zlib.crc32(text.encode())


def op_cases(
    table: CapabilityTable,
    extra_samples: Mapping[str, SampleMaker] | None = None,
    max_samples: int = 3,
) -> tuple[list[Case], list[str]]:
    """Cases for every claimed op x dtype x sample (up to ``max_samples`` each), and the ops without samples.

    An op claimed with an empty dtype tuple (any dtype) is tested in float32.
    """
    makers = {**SAMPLES, **(extra_samples or {})}
    cases: list[Case] = []
    untested: list[str] = []
    seen: set[str] = set()
    for cap in table.ops:
        if cap.op in seen:
            continue
        seen.add(cap.op)
        maker = makers.get(cap.op)
        if maker is None:
            untested.append(cap.op)
            continue
        for dtype_name in cap.dtypes or ("float32",):
            dtype = getattr(torch, dtype_name, None)
            if not isinstance(dtype, torch.dtype):
                continue  # reported by test_capability_table_is_valid
            gen = torch.Generator().manual_seed(_seed(f"{cap.op}-{dtype_name}"))
            try:
                samples = maker(dtype, gen)[:max_samples]
            except Exception as exc:  # noqa: BLE001 - a broken maker becomes a failing case, not a crash
                cases.append(Case(f"{cap.op}-{dtype_name}-samples", "op", cap.op, dtype_name,
                                  error=f"sample maker for {cap.op} failed: {type(exc).__name__}: {exc}"))
                continue
            for sample in samples:
                cases.append(Case(f"{cap.op}-{dtype_name}-{sample.label}", "op", cap.op, dtype_name, sample))
    return cases, untested


def model_case(name: str) -> Case:
    from edgeport.testing.models import MODELS

    if name not in MODELS:
        return Case(f"model-{name}", "model", model=name,
                    error=f"no model {name!r} in edgeport.testing.models.MODELS ({sorted(MODELS)})")
    return Case(f"model-{name}", "model", model=name)


def _glob(pattern: str) -> re.Pattern[str]:
    """``*`` matches any text, ``?`` one character; everything else (brackets included) is literal."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern) + r"\Z")


def matches_any(test_id: str, param_id: str, patterns: Iterable[str]) -> list[str]:
    """The patterns that match ``test_name[param_id]`` or ``param_id`` alone (``*`` and ``?`` are wildcards;
    brackets are literal, so ``"test_x[aten.mm.default-*]"`` works as written)."""
    return [p for p in patterns if _glob(p).match(test_id) or _glob(p).match(param_id)]


# -- the partition contract --------------------------------------------------------------------------------

_TAG = "delegation_tag"


def _describe(value: Any) -> Any:
    """A comparable summary of a meta value: tensors by (shape, dtype), containers element-wise."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_describe(v) for v in value))
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    return ("object", type(value).__name__, id(value))


def _snapshot(ep: Any) -> dict[str, Any]:
    def fmt(arg: Any) -> str:
        return repr(torch.fx.node.map_arg(arg, lambda n: f"%{n.name}"))

    nodes = []
    for n in ep.graph.nodes:
        meta = {k: v for k, v in n.meta.items() if k != _TAG}
        nodes.append((n.name, n.op, str(n.target), fmt((n.args, n.kwargs)), meta))
    sig = ep.graph_signature
    return {
        "nodes": nodes,
        "inputs": [(s.kind.name, getattr(s.arg, "name", repr(s.arg)), s.target) for s in sig.input_specs],
        "outputs": [(s.kind.name, getattr(s.arg, "name", repr(s.arg)), s.target) for s in sig.output_specs],
        "state": {k: id(v) for k, v in ep.state_dict.items()},
        "constants": {k: id(v) for k, v in ep.constants.items()},
    }


def _meta_equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(_describe(a) == _describe(b)) if not isinstance(a, (dict, set)) else bool(a == b)
    except Exception:  # noqa: BLE001 - uncomparable: different objects count as changed
        return False


def _diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    changes: list[str] = []
    b_nodes = {n[0]: n for n in before["nodes"]}
    a_nodes = {n[0]: n for n in after["nodes"]}
    for name in b_nodes.keys() - a_nodes.keys():
        changes.append(f"node {name!r} was removed")
    for name in a_nodes.keys() - b_nodes.keys():
        changes.append(f"node {name!r} was added")
    if not changes and [n[0] for n in before["nodes"]] != [n[0] for n in after["nodes"]]:
        changes.append("nodes were reordered")
    for name in b_nodes.keys() & a_nodes.keys():
        (_, op0, t0, a0, m0), (_, op1, t1, a1, m1) = b_nodes[name], a_nodes[name]
        if (op0, t0) != (op1, t1):
            changes.append(f"node {name!r}: target changed from {t0} to {t1}")
        if a0 != a1:
            changes.append(f"node {name!r}: arguments changed from {a0} to {a1}")
        for key in sorted(m0.keys() | m1.keys()):
            if key not in m1:
                changes.append(f"node {name!r}: meta[{key!r}] was removed")
            elif key not in m0:
                changes.append(f"node {name!r}: meta[{key!r}] was added (only meta[{_TAG!r}] may be set)")
            elif not _meta_equal(m0[key], m1[key]):
                changes.append(f"node {name!r}: meta[{key!r}] was changed")
    for key in ("inputs", "outputs", "state", "constants"):
        if before[key] != after[key]:
            changes.append(f"the program's {key} changed" if key in ("state", "constants")
                           else f"the graph signature's {key} changed")
    return changes


@dataclass
class NodeRecord:
    """A ``call_function`` node the partitioner saw: its op, its tag, and ``claim`` = ``None`` when the
    capability table claims it (else the reason it does not)."""

    name: str
    op: str
    tag: str | None
    claim: str | None


@dataclass
class PartitionRecord:
    """What one ``partition`` call did, checked the moment it returned."""

    changes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # result type, tags without spec, wrong backend id, ...
    nodes: list[NodeRecord] = field(default_factory=list)
    partition_tags: dict[str, Any] = field(default_factory=dict)
    tagged: dict[str, str] = field(default_factory=dict)  # every tagged node (constants included) -> tag
    ops_seen: list[str] = field(default_factory=list)


class RecordingPartitioner:
    """Wraps a backend's partitioner: the pipeline calls it as usual, and each call leaves a
    :class:`PartitionRecord` in :attr:`records`."""

    def __init__(self, inner: Any, backend_id: str, table: CapabilityTable,
                 compile_options_type: type | None = None) -> None:
        from edgeport.aot.capability_partitioner import CapabilityBasedPartitioner

        self.inner = inner
        self.backend_id = backend_id
        self.compile_options_type = compile_options_type
        self.checker = CapabilityBasedPartitioner(backend_id, table)
        self.records: list[PartitionRecord] = []

    def as_partitioner(self) -> Any:
        from edgeport.aot.partitioner import Partitioner

        recorder = self

        class _Recording(Partitioner):
            def ops_to_not_decompose(self, ep: Any) -> Any:
                return recorder.inner.ops_to_not_decompose(ep)

            def partition(self, ep: Any) -> Any:
                return recorder.partition(ep)

        _Recording.__name__ = f"Recording[{type(self.inner).__name__}]"
        return _Recording()

    def partition(self, ep: Any) -> Any:
        from edgeport.aot.capability_partitioner import op_name
        from edgeport.aot.partitioner import PartitionResult

        before = _snapshot(ep)
        result = self.inner.partition(ep)
        record = PartitionRecord()
        self.records.append(record)
        if not isinstance(result, PartitionResult):
            record.problems.append(f"partition returned {type(result).__name__}, not a PartitionResult")
            return result
        tagged_ep = result.tagged_exported_program
        record.changes = _diff(before, _snapshot(tagged_ep))
        tags = result.partition_tags
        if not isinstance(tags, Mapping):
            record.problems.append(f"partition_tags is a {type(tags).__name__}, not a dict")
            tags = {}
        record.partition_tags = dict(tags)
        for tag, spec in tags.items():
            if not isinstance(spec, DelegationSpec):
                record.problems.append(f"partition_tags[{tag!r}] is a {type(spec).__name__}, not a DelegationSpec")
                continue
            if spec.backend_id != self.backend_id:
                record.problems.append(
                    f"partition_tags[{tag!r}].backend_id is {spec.backend_id!r}, expected {self.backend_id!r}"
                )
            if not all(isinstance(c, CompileSpec) for c in spec.compile_specs):
                record.problems.append(f"partition_tags[{tag!r}].compile_specs must be a list of CompileSpec")
            elif self.compile_options_type is not None:
                try:
                    self.compile_options_type.from_compile_specs(list(spec.compile_specs))
                except Exception as exc:  # noqa: BLE001
                    record.problems.append(
                        f"partition_tags[{tag!r}].compile_specs do not parse as "
                        f"{self.compile_options_type.__name__}: {type(exc).__name__}: {exc}"
                    )
        for node in tagged_ep.graph.nodes:
            tag = node.meta.get(_TAG)
            if tag is not None:
                record.tagged[node.name] = tag
                if tag not in tags:
                    record.problems.append(f"node {node.name!r} is tagged {tag!r}, which has no DelegationSpec")
            if node.op != "call_function" or node.target is operator.getitem:
                continue
            name = op_name(node.target)
            record.ops_seen.append(name)
            record.nodes.append(NodeRecord(node.name, name, tag, self.checker.check_node(node)))
        unused = set(tags) - set(record.tagged.values())
        if unused:
            record.problems.append(f"partition_tags {sorted(unused)} are not used by any node")
        return result


# -- lowering ----------------------------------------------------------------------------------------------


@dataclass
class LoweredCase:
    """A case taken through the pipeline; ``errors`` maps a stage name to the formatted error it raised."""

    case: Case
    module: Any = None
    inputs: tuple[Any, ...] = ()
    expected: list[Any] = field(default_factory=list)
    recorder: RecordingPartitioner | None = None
    edge: Any = None
    lowered_modules: list[Any] = field(default_factory=list)
    executorch: Any = None
    pte: bytes | None = None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def records(self) -> list[PartitionRecord]:
        return self.recorder.records if self.recorder is not None else []

    def failed_stage(self, *stages: str) -> str | None:
        """The first of ``stages`` (or of all stages) that raised, with its error."""
        for stage in stages or tuple(self.errors):
            if stage in self.errors:
                return f"{stage} failed for {self.case.id}:\n{self.errors[stage]}"
        return None


def _flatten_outputs(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        for v in value:
            out.extend(_flatten_outputs(v))
        return out
    return [value]


def _error(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-6))


def lower_case(
    case: Case,
    partitioner: Any,
    backend_id: str,
    table: CapabilityTable,
    compile_options_type: type | None = None,
) -> LoweredCase:
    """Build, run eagerly, export, lower with ``partitioner`` (wrapped in a :class:`RecordingPartitioner`) and
    serialize one case. Never raises: each stage's error is kept in ``LoweredCase.errors``."""
    from edgeport import to_edge_transform_and_lower
    from edgeport.aot.lowered_module import LoweredBackendModule

    out = LoweredCase(case)
    try:
        module, inputs = case.build()
        out.module, out.inputs = module, inputs
        with torch.no_grad():
            out.expected = _flatten_outputs(module(*copy.deepcopy(inputs)))
    except Exception as exc:  # noqa: BLE001
        out.errors["build"] = _error(exc)
        return out
    try:
        ep = torch.export.export(module, inputs)
    except Exception as exc:  # noqa: BLE001
        out.errors["export"] = _error(exc)
        return out
    out.recorder = RecordingPartitioner(partitioner, backend_id, table, compile_options_type)
    try:
        out.edge = to_edge_transform_and_lower(ep, partitioner=[out.recorder.as_partitioner()])
    except Exception as exc:  # noqa: BLE001
        out.errors["lowering"] = _error(exc)
        return out
    gm = out.edge.exported_program().graph_module
    out.lowered_modules = [m for _, m in gm.named_children() if isinstance(m, LoweredBackendModule)]
    try:
        out.executorch = out.edge.to_executorch()
        out.pte = bytes(out.executorch.buffer)
    except Exception as exc:  # noqa: BLE001
        out.errors["to_executorch"] = _error(exc)
    return out


# -- runtime checks ----------------------------------------------------------------------------------------


def compare_outputs(
    got: Sequence[Any], expected: Sequence[Any], tolerances: Mapping[str, tuple[float, float]], where: str
) -> None:
    """Assert the runtime's outputs match eager's: count, dtype, shape, values within the dtype's tolerance."""
    assert len(got) == len(expected), f"{where}: {len(got)} outputs, eager PyTorch gives {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if not isinstance(e, torch.Tensor):
            assert g == e, f"{where}: output {i} is {g!r}, eager PyTorch gives {e!r}"
            continue
        dtype = str(e.dtype).removeprefix("torch.")
        want = e.detach().cpu()
        want_np = want.float().numpy() if e.dtype == torch.bfloat16 else want.numpy()
        g = np.asarray(g)
        if e.dtype != torch.bfloat16:
            assert g.dtype == want_np.dtype, f"{where}: output {i} has dtype {g.dtype}, eager PyTorch gives {dtype}"
        assert g.shape == want_np.shape, (
            f"{where}: output {i} has shape {list(g.shape)}, eager PyTorch gives {list(want_np.shape)}"
        )
        if e.dtype.is_floating_point:
            atol, rtol = tolerances.get(dtype, (1e-5, 1e-5))
            np.testing.assert_allclose(
                g.astype(np.float64), want_np.astype(np.float64), atol=atol, rtol=rtol, equal_nan=True,
                err_msg=f"{where}: output {i} ({dtype}) differs from eager PyTorch beyond atol={atol}, rtol={rtol}",
            )
        else:
            np.testing.assert_array_equal(g, want_np, err_msg=f"{where}: output {i} ({dtype}) differs from eager")


CORRUPTIONS = ("empty", "truncated_header", "truncated_half", "bad_magic", "version_mismatch", "garbage")
"""Default kinds of blob corruption; the same-length ones are also patched into a whole program."""

SAME_LENGTH = frozenset({"bad_magic", "version_mismatch", "garbage"})


def corrupt_blob(kind: str, blob: bytes, version_offset: int = 4, version_format: str = "<I") -> bytes | None:
    """A corrupted copy of ``blob`` (``None`` when ``kind`` does not apply to it).

    ``version_mismatch`` adds 1 to the format version stored at ``version_offset`` (DESIGN.md's header: magic,
    then format version as a little-endian uint32); ``bad_magic`` inverts the first four bytes; ``garbage`` is
    random bytes of the same length.
    """
    if kind == "empty":
        return b""
    if kind == "truncated_header":
        return blob[: min(len(blob) - 1, 6)] if len(blob) > 1 else None
    if kind == "truncated_half":
        return blob[: len(blob) // 2] if len(blob) > 1 else None
    if kind == "bad_magic":
        if len(blob) < 4:
            return None
        return bytes(b ^ 0xFF for b in blob[:4]) + blob[4:]
    if kind == "version_mismatch":
        size = struct.calcsize(version_format)
        if len(blob) < version_offset + size:
            return None
        (version,) = struct.unpack_from(version_format, blob, version_offset)
        bumped = struct.pack(version_format, (version + 1) % (1 << (8 * size)))
        return blob[:version_offset] + bumped + blob[version_offset + size:]
    if kind == "garbage":
        rng = np.random.default_rng(_seed(f"garbage-{len(blob)}"))
        return rng.integers(0, 256, len(blob), dtype=np.uint8).tobytes()
    raise ValueError(f"unknown corruption {kind!r}; known: {CORRUPTIONS}")


def patch_program(pte: bytes, blob: bytes, replacement: bytes) -> bytes:
    """``pte`` with the (unique) copy of delegate ``blob`` replaced by a same-length ``replacement``."""
    if len(replacement) != len(blob):
        raise ValueError("patch_program needs a replacement of the same length")
    where = pte.find(blob)
    if where < 0:
        raise ValueError("the delegate blob is not stored verbatim in the program")
    return pte[:where] + replacement + pte[where + len(blob):]


def options_type_of(spec: Any) -> type | None:
    options = getattr(spec, "compile_options", None)
    return options if isinstance(options, type) and dataclasses.is_dataclass(options) else None


def describe_untagged(record: PartitionRecord) -> list[str]:
    """Claimed nodes the partitioner did not tag."""
    return [f"{n.name} ({n.op})" for n in record.nodes if n.claim is None and n.tag is None]


def describe_unclaimed_tagged(record: PartitionRecord) -> list[str]:
    """Tagged compute nodes the capability table does not claim."""
    return [f"{n.name} ({n.op}: {n.claim})" for n in record.nodes if n.claim is not None and n.tag is not None]

