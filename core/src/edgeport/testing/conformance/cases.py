"""What the conformance suite tests: :class:`Case` (one op sample or one zoo model), :func:`op_cases` /
:func:`model_case` to make them, :class:`OpModule` to call one op overload, and test-id matching."""

from __future__ import annotations

import importlib
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from edgeport.backend import CapabilityTable
from edgeport.testing.conformance.samples import SAMPLES, Const, Sample, SampleMaker


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


def stable_seed(text: str) -> int:
    """A seed derived from ``text`` (the same in every run and process)."""
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
            gen = torch.Generator().manual_seed(stable_seed(f"{cap.op}-{dtype_name}"))
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
    """The case of model ``name`` of :data:`edgeport.testing.models.MODELS` (a failing case if unknown)."""
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
