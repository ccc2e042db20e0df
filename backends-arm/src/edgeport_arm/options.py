"""Compile specs of the Arm backends (torch-free), with ExecuTorch's names and encoding.

``TosaCompileSpec("TOSA-1.0+INT")`` lowers to a TOSA 1.0 graph (``TOSABackend``); ``EthosUCompileSpec
("ethos-u55-128", system_config=..., memory_mode=..., extra_flags=...)`` lowers to TOSA 1.0 INT and compiles it
with Arm's Vela for that Ethos-U target (``EthosUBackend``). Both convert to and from the ``CompileSpec`` list
ExecuTorch 1.5.1 writes: ``tosa_spec``, ``compile_flags`` (Vela's command line), ``output_format`` (``tosa`` /
``vela``) and ``preserve_io_quantization`` -- plain strings, not JSON.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from edgeport.backend import CompileOptions, CompileSpec

TOSA_BACKEND_ID = "TOSABackend"
ETHOSU_BACKEND_ID = "EthosUBackend"

ETHOSU_TARGETS = (
    "ethos-u55-32", "ethos-u55-64", "ethos-u55-128", "ethos-u55-256",
    "ethos-u65-256", "ethos-u65-512",
    "ethos-u85-128", "ethos-u85-256", "ethos-u85-512", "ethos-u85-1024", "ethos-u85-2048",
)
_SPEC_RE = re.compile(r"^TOSA-(\d+)\.(\d+)(?:\.(\d+))?((?:\+[A-Za-z0-9]+)*)$")
_PROFILES = ("INT", "FP")
_EXTENSIONS = ("int16", "int4", "u55", "cf", "bf16", "fp8e4m3", "fp8e5m2", "fft", "variable", "shape", "mxfp",
               "random", "controlflow", "doubleround", "inexactround", "dynamic")


@dataclass(frozen=True)
class TosaSpecification:
    """A parsed TOSA target string such as ``TOSA-1.0+INT+int16+u55``."""

    major: int
    minor: int
    profiles: tuple[str, ...]
    extensions: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> TosaSpecification:
        m = _SPEC_RE.match(text.strip()) if isinstance(text, str) else None
        if m is None:
            raise ValueError(f"not a TOSA specification: {text!r}; write e.g. 'TOSA-1.0+INT' or 'TOSA-1.0+FP'")
        major, minor = int(m.group(1)), int(m.group(2))
        if (major, minor) != (1, 0):
            raise ValueError(f"TOSA {major}.{minor} is not supported: edgeport-arm writes TOSA 1.0 ('TOSA-1.0+INT')")
        parts = [p for p in m.group(4).split("+") if p]
        profiles = tuple(p for p in parts if p in _PROFILES)
        extensions = tuple(p for p in parts if p not in _PROFILES)
        if not profiles:
            raise ValueError(f"{text!r} names no TOSA profile: add '+INT' (integer) or '+FP' (floating point)")
        unknown = [e for e in extensions if e not in _EXTENSIONS]
        if unknown:
            raise ValueError(f"{text!r}: unknown TOSA extension(s) {unknown}; known: {list(_EXTENSIONS)}")
        return cls(major, minor, profiles, extensions)

    @property
    def is_int(self) -> bool:
        return "INT" in self.profiles

    @property
    def is_fp(self) -> bool:
        return "FP" in self.profiles

    def __str__(self) -> str:
        return f"TOSA-{self.major}.{self.minor}" + "".join(f"+{p}" for p in (*self.profiles, *self.extensions))


def _decode(spec: CompileSpec) -> str:
    try:
        return bytes(spec.value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"compile spec {spec.key!r} is not UTF-8 text: {exc}") from exc


@dataclass
class TosaCompileSpec(CompileOptions):
    """``TOSABackend``'s options: the TOSA target (``"TOSA-1.0+INT"`` or ``"TOSA-1.0+FP"``).

    ``preserve_io_quantization`` is accepted for ExecuTorch compatibility; edgeport always keeps the
    quantize at a partition's inputs and the dequantize at its outputs outside the delegate (int8 I/O).
    """

    tosa_spec: str = "TOSA-1.0+INT"
    preserve_io_quantization: bool = False

    def __post_init__(self) -> None:
        self.tosa_spec = str(TosaSpecification.parse(self.tosa_spec))

    @property
    def specification(self) -> TosaSpecification:
        return TosaSpecification.parse(self.tosa_spec)

    def to_compile_specs(self) -> list[CompileSpec]:
        return [
            CompileSpec("tosa_spec", self.tosa_spec.encode()),
            CompileSpec("output_format", b"tosa"),
            CompileSpec("preserve_io_quantization", str(bool(self.preserve_io_quantization)).encode()),
        ]

    @classmethod
    def from_compile_specs(cls, specs: Sequence[CompileSpec]) -> TosaCompileSpec:
        values = _read_specs(specs, "tosa")
        if "compile_flags" in values:
            raise ValueError("compile spec 'compile_flags' belongs to EthosUBackend, not TOSABackend")
        return cls(values.get("tosa_spec", "TOSA-1.0+INT"), _bool(values.get("preserve_io_quantization", "False")))


@dataclass
class EthosUCompileSpec(CompileOptions):
    """``EthosUBackend``'s options: the Ethos-U target and how Vela compiles for it (ExecuTorch's names).

    ``system_config`` and ``memory_mode`` default per family as ExecuTorch does (U55: High_End_Embedded +
    Shared_Sram, U65: High_End + Dedicated_Sram_384KB, U85: SYS_DRAM_Mid + Sram_Only); ``extra_flags`` go to Vela
    as given; ``config_ini`` is Vela's configuration file (its bundled ``Arm/vela.ini`` by default).
    """

    target: str = "ethos-u55-128"
    system_config: str | None = None
    memory_mode: str | None = None
    extra_flags: list[str] = field(default_factory=list)
    config_ini: str = "Arm/vela.ini"

    def __post_init__(self) -> None:
        if self.target not in ETHOSU_TARGETS:
            raise ValueError(f"unknown Ethos-U target {self.target!r}; one of {list(ETHOSU_TARGETS)}")
        family_defaults = default_system_config(self.target)
        if self.system_config is None:
            self.system_config = family_defaults[0]
        if self.memory_mode is None:
            self.memory_mode = family_defaults[1]
        self.extra_flags = [str(f) for f in self.extra_flags]
        for flag in self.extra_flags:
            if not flag.startswith("--") or any(c.isspace() for c in flag):
                raise ValueError(f"Vela flag {flag!r}: write each flag as one '--name=value' item without spaces")

    @property
    def tosa_spec(self) -> str:
        """The TOSA profile Vela accepts for this target (integer only: the NPU has no float datapath)."""
        extension = "+u55" if ("u55" in self.target or "u65" in self.target) else "+cf"
        return f"TOSA-1.0+INT+int16{extension}"

    @property
    def specification(self) -> TosaSpecification:
        return TosaSpecification.parse(self.tosa_spec)

    def compiler_flags(self) -> list[str]:
        """Vela's command line (without the output directory and input file)."""
        return [*self.extra_flags, f"--accelerator-config={self.target}", f"--config={self.config_ini}",
                "--output-format=raw", f"--system-config={self.system_config}", f"--memory-mode={self.memory_mode}"]

    def to_compile_specs(self) -> list[CompileSpec]:
        return [
            CompileSpec("tosa_spec", self.tosa_spec.encode()),
            CompileSpec("compile_flags", " ".join(self.compiler_flags()).encode()),
            CompileSpec("output_format", b"vela"),
            CompileSpec("preserve_io_quantization", b"False"),
        ]

    @classmethod
    def from_compile_specs(cls, specs: Sequence[CompileSpec]) -> EthosUCompileSpec:
        values = _read_specs(specs, "vela")
        flags = shlex.split(values.get("compile_flags", ""))
        known = {"--accelerator-config": "target", "--config": "config_ini", "--system-config": "system_config",
                 "--memory-mode": "memory_mode"}
        kwargs: dict[str, object] = {}
        extra: list[str] = []
        for flag in flags:
            name, _, value = flag.partition("=")
            if name in known:
                kwargs[known[name]] = value
            elif name != "--output-format":
                extra.append(flag)
        if "target" not in kwargs:
            raise ValueError("EthosUBackend compile specs name no target: 'compile_flags' lacks --accelerator-config")
        return cls(extra_flags=extra, **kwargs)  # type: ignore[arg-type]


def default_system_config(target: str) -> tuple[str, str]:
    """Vela's system configuration and memory mode ExecuTorch picks for a target's family."""
    if target not in ETHOSU_TARGETS:
        raise ValueError(f"unknown Ethos-U target {target!r}; one of {list(ETHOSU_TARGETS)}")
    if "ethos-u55" in target:
        return "Ethos_U55_High_End_Embedded", "Shared_Sram"
    if "ethos-u65" in target:
        return "Ethos_U65_High_End", "Dedicated_Sram_384KB"
    if "ethos-u85" in target:
        return "Ethos_U85_SYS_DRAM_Mid", "Sram_Only"
    raise ValueError(f"unknown Ethos-U target {target!r}; one of {list(ETHOSU_TARGETS)}")


def _read_specs(specs: Sequence[CompileSpec], output_format: str) -> dict[str, str]:
    known = ("tosa_spec", "compile_flags", "output_format", "preserve_io_quantization", "debug_artifact_path",
             "dump_debug_info", "transform_pipeline_config")
    values: dict[str, str] = {}
    for spec in specs:
        if spec.key not in known:
            raise ValueError(f"unknown compile spec {spec.key!r} for the Arm backends; known keys: {list(known)}")
        values[spec.key] = _decode(spec)
    fmt = values.get("output_format", output_format)
    if fmt != output_format:
        raise ValueError(f"compile specs are for output_format {fmt!r}, expected {output_format!r}")
    return values


def _bool(text: str) -> bool:
    if text not in ("True", "False"):
        raise ValueError(f"compile spec 'preserve_io_quantization' must be 'True' or 'False', got {text!r}")
    return text == "True"
