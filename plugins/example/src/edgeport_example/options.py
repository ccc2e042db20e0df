"""Typed compile options of ExampleBackend. Torch-free."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgeport.backend import CompileOptions, CompileSpec


@dataclass
class ExampleCompileOptions(CompileOptions):
    """ExampleBackend's compile options.

    ``max_value``: an integer 0..255, carried as ``CompileSpec("max_value", bytes([value]))`` (one raw byte, the
    encoding of ExecuTorch's backend tutorial). The backend records it in the blob's ``compile_specs``; it does
    not change the computation.
    """

    max_value: int | None = None

    def __post_init__(self) -> None:
        if self.max_value is not None and not (
            isinstance(self.max_value, int)
            and not isinstance(self.max_value, bool)
            and 0 <= self.max_value <= 255
        ):
            raise ValueError(
                f"ExampleCompileOptions.max_value must be an int in 0..255, got {self.max_value!r}"
            )

    def to_compile_specs(self) -> list[CompileSpec]:
        specs = []
        if self.max_value is not None:
            specs.append(CompileSpec("max_value", bytes([self.max_value])))
        return specs

    @classmethod
    def from_compile_specs(cls, specs: Sequence[CompileSpec]) -> ExampleCompileOptions:
        """Parse compile specs; raises ``ValueError`` naming an unknown key or a malformed value."""
        values: dict[str, Any] = {}
        for spec in specs:
            if not isinstance(spec, CompileSpec):
                raise ValueError(f"expected CompileSpec objects, got {type(spec).__name__}")
            if spec.key == "max_value":
                if len(spec.value) != 1:
                    raise ValueError(
                        f"compile spec 'max_value' must be one byte (e.g. bytes([4])), got {len(spec.value)} bytes"
                    )
                values["max_value"] = spec.value[0]
            else:
                raise ValueError(
                    f"unknown compile spec {spec.key!r} for ExampleBackend; known keys: ['max_value']"
                )
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """The options as recorded in the blob (only the ones that are set)."""
        return {} if self.max_value is None else {"max_value": self.max_value}
