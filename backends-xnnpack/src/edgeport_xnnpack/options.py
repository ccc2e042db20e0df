"""Typed compile options of XnnpackBackend (torch-free)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from edgeport.backend import CompileOptions, CompileSpec, RuntimeOptions


@dataclass
class XnnpackCompileOptions(CompileOptions):
    """Options carried as compile specs (each value JSON-encoded; ExecuTorch's XNNPACK runtime ignores them).

    ``num_threads``: threads of the pthreadpool edgeport's executor runs this delegate with; ``None`` (the
    default) means ``EDGEPORT_XNNPACK_THREADS`` or every core available to the process (its affinity mask, capped by
    its cgroups' CPU quota).

    ``static_shapes``: whether the delegate is only ever called at its declared shapes (none of its inputs or
    outputs has a dynamic dim). :class:`~edgeport_xnnpack.partitioner.XnnpackPartitioner` writes it per
    partition. ``True`` lets edgeport's executor keep float32 fully connected nodes inside the native XNNPACK
    runtimes (faster at one shape); ``False`` or absent (programs of older writers, ExecuTorch's) keeps them as
    operators packed once and shared by every input-shape specialization. A hint only: any value runs correctly
    at any shape.
    """

    num_threads: int | None = None
    static_shapes: bool | None = None

    def __post_init__(self) -> None:
        n = self.num_threads
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1024):
            raise ValueError(f"XnnpackCompileOptions.num_threads must be an int in 1..1024, got {n!r}")
        if self.static_shapes is not None and not isinstance(self.static_shapes, bool):
            raise ValueError(f"XnnpackCompileOptions.static_shapes must be true or false, got {self.static_shapes!r}")

    def to_compile_specs(self) -> list[CompileSpec]:
        specs = []
        if self.num_threads is not None:
            specs.append(CompileSpec("num_threads", json.dumps(self.num_threads).encode()))
        if self.static_shapes is not None:
            specs.append(CompileSpec(STATIC_SHAPES, json.dumps(self.static_shapes).encode()))
        return specs

    @classmethod
    def from_compile_specs(cls, specs: Sequence[CompileSpec]) -> XnnpackCompileOptions:
        """Parse compile specs; unknown or repeated keys raise ``ValueError`` naming the known ones."""
        values = {}
        for spec in specs:
            if spec.key not in _KEYS:
                raise ValueError(f"unknown compile spec {spec.key!r} for XnnpackBackend; known keys: {list(_KEYS)}")
            if spec.key in values:
                raise ValueError(f"compile spec {spec.key!r} given twice")
            try:
                values[spec.key] = json.loads(bytes(spec.value).decode())
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"compile spec {spec.key!r} is not JSON: {exc}") from exc
            if spec.key == STATIC_SHAPES and not isinstance(values[spec.key], bool):
                raise ValueError(f"compile spec {spec.key!r} must be JSON true or false, got {bytes(spec.value)!r}")
        return cls(**values)


STATIC_SHAPES = "static_shapes"
"""Compile-spec key of :attr:`XnnpackCompileOptions.static_shapes` (JSON ``true`` / ``false``)."""
_KEYS = ("num_threads", STATIC_SHAPES)


@dataclass
class XnnpackRuntimeOptions(RuntimeOptions):
    """Options given when a method is loaded: ``load_method(name, backend_options={"XnnpackBackend": {...}})``.

    ``num_threads``: threads of the pthreadpool the delegates run with (1: on the caller's thread, no pool);
    0 (the default) keeps the delegate's ``num_threads`` compile option, else ``EDGEPORT_XNNPACK_THREADS`` or
    every core available to the process. Set here, it overrides the compile option: the thread count is a
    property of the machine a program runs on, not of the program.

    ``fully_connected``: where fully-connected layers and convolutions run -- ``"xnnpack"`` (in the delegate's
    XNNPACK runtimes), ``"host"`` (edgeport's own kernels, tiled on the delegate's thread pool: float32
    fully-connected and 1x1 ones, float32 dense convolutions, and int8 ones where the CPU has AVX512-VNNI),
    ``"host-float"`` / ``"host-conv"`` / ``"host-int8"`` (only those; ``+`` combines them), or ``"auto"`` (the
    default: float32 fully-connected on the host on x86-64 CPUs with AVX2 but no AVX-512, float32 dense
    convolutions on CPUs with AVX2 and FMA, int8 on CPUs with AVX512-VNNI -- where the 2022 libXNNPACK's kernels
    are slow; see ``docs/backends/xnnpack.md``, "Speed by CPU kind").
    """

    num_threads: int = 0
    fully_connected: str = "auto"

    def __post_init__(self) -> None:
        n = self.num_threads
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 1024:
            raise ValueError(f"XnnpackRuntimeOptions.num_threads must be an int in 0..1024, got {n!r}")
        fc = self.fully_connected
        parts = fc.split("+") if isinstance(fc, str) else [None]
        single = ("auto", "xnnpack", "host", "host-float", "host-int8", "host-conv")
        if not (len(parts) == 1 and parts[0] in single) and not (
                len(parts) > 1 and all(p in ("host-float", "host-int8", "host-conv") for p in parts)):
            raise ValueError("XnnpackRuntimeOptions.fully_connected must be 'auto', 'xnnpack', 'host', 'host-float', "
                             "'host-int8', 'host-conv' or a '+'-joined combination of the last three (e.g. "
                             f"'host-float+host-conv'), got {fc!r}")
