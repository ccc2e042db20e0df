"""Compile options of ``VulkanBackend`` (torch-free), encoded as ExecuTorch's Vulkan compile specs.

ExecuTorch's ``VulkanPartitioner(compile_options={...})`` writes each bool option as a one-byte compile spec
(``force_fp16`` = ``b"\\x01"``); edgeport reads and writes the same keys. ExecuTorch's other keys (storage and
memory-layout overrides, texture limits, ...) describe its texture-based runtime: they are accepted and ignored,
as ExecuTorch ignores keys it does not handle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edgeport.backend import CompileOptions, CompileSpec, RuntimeOptions

BACKEND_ID = "VulkanBackend"
_BOOL_KEYS = ("force_fp16", "require_dynamic_shapes")
IGNORED_KEYS = ("storage_type_override", "memory_layout_override", "texture_limits_x", "texture_limits_y",
                "texture_limits_z", "skip_tag_memory_metadata", "downcast_64_bit", "small_texture_limits",
                "skip_memory_planning", "alias_buffer_mutations", "external_constants_max_data_bytes")


@dataclass
class VulkanCompileOptions(CompileOptions):
    """``force_fp16``: keep activations and weights in fp16 on the device (arithmetic stays fp32 in the shaders;
    needs 16-bit storage buffers). ``require_dynamic_shapes``: partition for dynamic shapes -- edgeport's Vulkan
    executor is static-shape only, so the partitioner then delegates nothing and says why."""

    force_fp16: bool = False
    require_dynamic_shapes: bool = False

    def __post_init__(self) -> None:
        for key in _BOOL_KEYS:
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"VulkanCompileOptions.{key} must be a bool, got {getattr(self, key)!r}")

    def to_compile_specs(self) -> list[CompileSpec]:
        return [CompileSpec(key, bytes([int(getattr(self, key))])) for key in _BOOL_KEYS]

    @classmethod
    def from_compile_specs(cls, specs: Sequence[CompileSpec]) -> VulkanCompileOptions:
        values: dict[str, bool] = {}
        for spec in specs:
            if spec.key in _BOOL_KEYS:
                raw = bytes(spec.value)
                if not raw or any(raw[1:]) or raw[0] > 1:
                    raise ValueError(f"compile spec {spec.key!r}: expected a little-endian bool (b'\\x00' or "
                                     f"b'\\x01'), got {raw!r}")
                values[spec.key] = bool(raw[0])
            elif spec.key not in IGNORED_KEYS:
                raise ValueError(f"unknown compile spec {spec.key!r} for VulkanBackend; known keys: "
                                 f"{list(_BOOL_KEYS + IGNORED_KEYS)}")
        return cls(**values)


@dataclass
class VulkanRuntimeOptions(RuntimeOptions):
    """Options given at load: ``load_method(name, backend_options={"VulkanBackend": {"device": "llvmpipe"}})``.

    ``device``: a substring of the Vulkan device name to run on (empty: ``EDGEPORT_VULKAN_DEVICE``, else a
    discrete GPU first and lavapipe last). Which device runs a program is a property of the machine, not of the
    program, so it is chosen here rather than at lowering.
    """

    device: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or len(self.device) > 256:
            raise ValueError(f"VulkanRuntimeOptions.device must be a device-name substring, got {self.device!r}")
