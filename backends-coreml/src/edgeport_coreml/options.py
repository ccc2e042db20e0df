"""Compile specs of ``CoreMLBackend`` (torch-free, coremltools-free), with ExecuTorch's keys and encoding.

ExecuTorch 1.5.1's ``CoreMLBackend.generate_compile_specs`` writes plain UTF-8 strings, not JSON:

* ``compute_units``: ``coremltools.ComputeUnit`` member name in lower case (``all``, ``cpu_only``,
  ``cpu_and_gpu``, ``cpu_and_ne``); read back with ``.upper()``;
* ``min_deployment_target``: the integer value of ``coremltools.target`` (``iOS16`` = 7, ``iOS17`` = 8,
  ``iOS18`` = 9, ``iOS26`` = 10; also the macOS names of the same values), or empty for the converter's default;
* ``model_compute_precision``: ``coremltools.precision`` value, ``float16`` (the default) or ``float32``;
* ``model_type``: ``model`` (an ``.mlpackage`` in the blob) or ``compiled_model`` (an ``.mlmodelc``).

Weight compression (:mod:`edgeport_coreml.compression`): ``op_linear_quantizer_config`` (ExecuTorch's key, a JSON
``OpLinearQuantizerConfig``) and ``op_palettizer_config`` (edgeport's, a JSON ``OpPalettizerConfig``).

Enumerated input shapes (:mod:`edgeport_coreml.shapes`): ``enumerated_shapes`` (ExecuTorch's key and JSON).

ExecuTorch's other keys (``pass_pipeline``, ``multimethod_weight_sharing_strategy``) are recognised and refused
with a reason (not implemented here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgeport.backend import CompileOptions, CompileSpec
from edgeport.errors import LoweringError
from edgeport_coreml.compression import (
    LINEAR_QUANTIZER_KEY,
    PALETTIZER_KEY,
    check_compression,
    decode_config,
    encode_config,
)
from edgeport_coreml.shapes import (
    ENUMERATED_SHAPES_KEY,
    EnumeratedShapes,
    decode_enumerated_shapes,
    encode_enumerated_shapes,
)

COREML_BACKEND_ID = "CoreMLBackend"


class UnconvertiblePartition(LoweringError):
    """coremltools cannot make a Core ML model of this partition (its error, or a model Core ML cannot take): the
    partitioner refuses the partition's culprit node; any other ``LoweringError`` is a configuration error."""

COMPUTE_UNITS = ("all", "cpu_only", "cpu_and_gpu", "cpu_and_ne")
COMPUTE_PRECISIONS = ("float16", "float32")
MODEL_TYPES = ("model", "compiled_model")
#: coremltools.target values (coremltools 9.0): name -> integer written in ``min_deployment_target``.
DEPLOYMENT_TARGETS = {
    "iOS13": 4, "macOS10.15": 4, "watchOS6": 4, "tvOS13": 4,
    "iOS14": 5, "macOS11": 5, "watchOS7": 5, "tvOS14": 5,
    "iOS15": 6, "macOS12": 6, "watchOS8": 6, "tvOS15": 6, "visionOS1": 6,
    "iOS16": 7, "macOS13": 7, "watchOS9": 7, "tvOS16": 7,
    "iOS17": 8, "macOS14": 8, "watchOS10": 8, "tvOS17": 8, "visionOS2": 8,
    "iOS18": 9, "macOS15": 9, "watchOS11": 9, "tvOS18": 9,
    "iOS26": 10, "macOS26": 10, "watchOS26": 10, "tvOS26": 10, "visionOS26": 10,
}
#: Core ML model specification version an ML program gets for each deployment-target value.
SPEC_VERSION_OF_TARGET = {4: 4, 5: 5, 6: 6, 7: 7, 8: 8, 9: 9, 10: 10}
_NOT_IMPLEMENTED_KEYS = {
    "pass_pipeline": "custom coremltools pass pipelines are not implemented in edgeport-coreml yet",
    "multimethod_weight_sharing_strategy": "multifunction (weight-shared) models are not implemented yet",
}


def _enum_name(value: Any) -> str:
    """Accept a string or a coremltools enum member (``ct.ComputeUnit.ALL``, ``ct.precision.FLOAT32``...)."""
    if isinstance(value, str):
        return value
    name = getattr(value, "name", None)
    return str(name) if name is not None else str(value)


def _target_value(target: Any) -> int | None:
    if target is None or target == "":
        return None
    if isinstance(target, bool):
        raise ValueError(f"minimum_deployment_target must be a target name such as 'iOS16', got {target!r}")
    if isinstance(target, int):
        value = target
    elif isinstance(target, str):
        if target.isdigit():
            value = int(target)
        elif target in DEPLOYMENT_TARGETS:
            value = DEPLOYMENT_TARGETS[target]
        else:
            raise ValueError(f"unknown Core ML deployment target {target!r}; one of "
                             f"{sorted(DEPLOYMENT_TARGETS, key=DEPLOYMENT_TARGETS.get)}")
    else:  # a coremltools.target member
        value = int(getattr(target, "value", -1))
    if value not in SPEC_VERSION_OF_TARGET:
        raise ValueError(f"Core ML deployment target value {value} is not known to coremltools 9.0 "
                         f"(known: {sorted(SPEC_VERSION_OF_TARGET)})")
    if value < 7:
        raise ValueError(f"deployment target value {value} is older than iOS16/macOS13: ExecuTorch's Core ML "
                         "runtime (and this backend's ML programs) need iOS 16 / macOS 13 or newer")
    return value


@dataclass
class CoreMLCompileSpec(CompileOptions):
    """``CoreMLBackend``'s options, with ExecuTorch's names and defaults.

    ``compute_unit``: ``"all"`` | ``"cpu_only"`` | ``"cpu_and_gpu"`` | ``"cpu_and_ne"`` (or a ``ct.ComputeUnit``);
    ``minimum_deployment_target``: ``None`` (coremltools' default for ML programs, iOS15 -> raised to iOS16 here
    at conversion), ``"iOS16"``..``"iOS26"``, ``"macOS13"``.. or a ``ct.target`` member;
    ``compute_precision``: ``"float16"`` (ExecuTorch's default: weights and activations in fp16) or
    ``"float32"``; ``model_type``: ``"model"`` (an ``.mlpackage``) or ``"compiled_model"`` (needs macOS to compile);
    ``op_linear_quantizer_config`` / ``op_palettizer_config``: post-conversion weight compression, a dict of
    ``coremltools.optimize.coreml.OpLinearQuantizerConfig`` / ``OpPalettizerConfig`` fields (see
    :mod:`edgeport_coreml.compression`), checked against the deployment target.
    """

    compute_unit: str = "all"
    minimum_deployment_target: int | None = None
    compute_precision: str = "float16"
    model_type: str = "model"
    op_linear_quantizer_config: dict[str, Any] | None = None
    op_palettizer_config: dict[str, Any] | None = None
    enumerated_shapes: EnumeratedShapes | None = None

    def __post_init__(self) -> None:
        self.compute_unit = _enum_name(self.compute_unit).lower()
        if self.compute_unit not in COMPUTE_UNITS:
            raise ValueError(f"unknown Core ML compute unit {self.compute_unit!r}; one of {list(COMPUTE_UNITS)}")
        self.minimum_deployment_target = _target_value(self.minimum_deployment_target)
        precision = self.compute_precision
        self.compute_precision = str(getattr(precision, "value", precision)).lower()
        if self.compute_precision not in COMPUTE_PRECISIONS:
            raise ValueError(f"unknown Core ML compute precision {precision!r}; one of {list(COMPUTE_PRECISIONS)}")
        model_type = self.model_type
        self.model_type = str(getattr(model_type, "value", model_type)).lower()
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"unknown Core ML model type {model_type!r}; one of {list(MODEL_TYPES)}")
        if self.op_linear_quantizer_config is not None:
            encode_config(LINEAR_QUANTIZER_KEY, self.op_linear_quantizer_config)  # checks the fields
        if self.op_palettizer_config is not None:
            encode_config(PALETTIZER_KEY, self.op_palettizer_config)
        check_compression(self.op_linear_quantizer_config, self.op_palettizer_config, self.deployment_target_value)

    @property
    def deployment_target_value(self) -> int:
        """The target the conversion uses: the one given, or iOS16 (7), the oldest ExecuTorch's runtime runs."""
        return self.minimum_deployment_target if self.minimum_deployment_target is not None else 7

    def to_compile_specs(self) -> list[CompileSpec]:
        target = b"" if self.minimum_deployment_target is None else str(self.minimum_deployment_target).encode()
        specs = [
            CompileSpec("compute_units", self.compute_unit.encode()),
            CompileSpec("min_deployment_target", target),
            CompileSpec("model_compute_precision", self.compute_precision.encode()),
            CompileSpec("model_type", self.model_type.encode()),
        ]
        if self.op_linear_quantizer_config is not None:
            specs.append(CompileSpec(LINEAR_QUANTIZER_KEY,
                                     encode_config(LINEAR_QUANTIZER_KEY, self.op_linear_quantizer_config)))
        if self.op_palettizer_config is not None:
            specs.append(CompileSpec(PALETTIZER_KEY, encode_config(PALETTIZER_KEY, self.op_palettizer_config)))
        if self.enumerated_shapes is not None:
            specs.append(CompileSpec(ENUMERATED_SHAPES_KEY, encode_enumerated_shapes(self.enumerated_shapes)))
        return specs

    @classmethod
    def from_compile_specs(cls, specs: Sequence[CompileSpec]) -> CoreMLCompileSpec:
        known = {"compute_units": "compute_unit", "min_deployment_target": "minimum_deployment_target",
                 "model_compute_precision": "compute_precision", "model_type": "model_type"}
        kwargs: dict[str, Any] = {}
        for spec in specs:
            if spec.key in _NOT_IMPLEMENTED_KEYS:
                raise ValueError(f"CoreMLBackend compile spec {spec.key!r}: {_NOT_IMPLEMENTED_KEYS[spec.key]}")
            if spec.key.startswith("edgeport."):
                continue  # the core's own keys (portable fallback name)
            if spec.key in (LINEAR_QUANTIZER_KEY, PALETTIZER_KEY):
                kwargs[spec.key] = decode_config(spec.key, spec.value)
                continue
            if spec.key == ENUMERATED_SHAPES_KEY:
                kwargs["enumerated_shapes"] = decode_enumerated_shapes(spec.value)
                continue
            if spec.key not in known:
                raise ValueError(f"unknown compile spec {spec.key!r} for CoreMLBackend; known keys: "
                                 f"{sorted(known) + [LINEAR_QUANTIZER_KEY, PALETTIZER_KEY, ENUMERATED_SHAPES_KEY]}")
            try:
                text = bytes(spec.value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"compile spec {spec.key!r} is not UTF-8 text: {exc}") from None
            kwargs[known[spec.key]] = text
        return cls(**kwargs)


def generate_compile_specs(compute_unit: Any = "all", minimum_deployment_target: Any = None,
                           compute_precision: Any = "float16", model_type: Any = "model",
                           op_linear_quantizer_config: dict[str, Any] | None = None, *,
                           op_palettizer_config: dict[str, Any] | None = None) -> list[CompileSpec]:
    """ExecuTorch's ``CoreMLBackend.generate_compile_specs`` (same arguments, same keys and bytes), plus
    ``op_palettizer_config`` (edgeport's)."""
    return CoreMLCompileSpec(compute_unit, minimum_deployment_target, compute_precision, model_type,
                             op_linear_quantizer_config, op_palettizer_config).to_compile_specs()


class CoreMLBackend:
    """Name-compatible stand-in for ExecuTorch's ``CoreMLBackend`` compile-spec helpers (no lowering here:
    edgeport lowers through its registry, by backend id ``"CoreMLBackend"``)."""

    generate_compile_specs = staticmethod(generate_compile_specs)

    @staticmethod
    def generate_enumerated_shapes_compile_spec(ep: Any, enumerated_shapes: Any) -> CompileSpec:
        """ExecuTorch's name for :func:`edgeport_coreml.shapes.generate_enumerated_shapes_compile_spec`."""
        from edgeport_coreml.shapes import generate_enumerated_shapes_compile_spec

        return generate_enumerated_shapes_compile_spec(ep, enumerated_shapes)
