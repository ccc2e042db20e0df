"""Minimal SPIR-V reflection (torch- and Vulkan-free): what a compute shader expects from the host.

Reads the descriptor bindings (set 0), the push-constant block size, the specialization-constant ids and the
workgroup size straight from the
module, so a :class:`~edgeport_vulkan.device.Kernel`'s layout can never drift from its shader.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["ShaderInterface", "reflect"]

_MAGIC = 0x07230203
# opcodes
_OP_ENTRY_POINT, _OP_EXECUTION_MODE = 15, 16
_OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR = 21, 22, 23
_OP_TYPE_ARRAY, _OP_TYPE_RUNTIME_ARRAY, _OP_TYPE_STRUCT, _OP_TYPE_POINTER = 28, 29, 30, 32
_OP_CONSTANT, _OP_VARIABLE, _OP_DECORATE, _OP_MEMBER_DECORATE = 43, 59, 71, 72
# decorations, storage classes, execution modes
_DEC_SPEC_ID, _DEC_ARRAY_STRIDE, _DEC_BINDING, _DEC_SET, _DEC_OFFSET = 1, 6, 33, 34, 35
_SC_UNIFORM, _SC_PUSH_CONSTANT, _SC_STORAGE_BUFFER = 2, 9, 12
_EM_LOCAL_SIZE = 17
_EXEC_MODEL_GL_COMPUTE = 5


@dataclass(frozen=True)
class ShaderInterface:
    """Host-visible interface of a compute shader."""

    bindings: int  # storage buffers at set 0, bindings 0..bindings-1
    push_constant_size: int  # bytes; 0 when the shader has no push-constant block
    local_size: tuple[int, int, int]
    spec_constants: tuple[int, ...] = ()  # constant_id of each (32-bit) specialization constant, sorted


def _words(code: bytes) -> tuple[int, ...]:
    if len(code) < 20 or len(code) % 4:
        raise ValueError(f"not a SPIR-V module ({len(code)} bytes)")
    (magic,) = struct.unpack_from("<I", code)
    fmt = "<" if magic == _MAGIC else ">"
    words = struct.unpack(f"{fmt}{len(code) // 4}I", code)
    if words[0] != _MAGIC:
        raise ValueError("not a SPIR-V module (bad magic number)")
    return words


def reflect(code: bytes) -> ShaderInterface:
    """Reflects a compiled GLSL compute shader (one GLCompute entry point, descriptor set 0 only)."""
    words = _words(code)
    types: dict[int, tuple[int, ...]] = {}
    constants: dict[int, int] = {}
    decorations: dict[tuple[int, int], int] = {}
    member_offsets: dict[tuple[int, int], int] = {}
    variables: list[tuple[int, int, int]] = []  # (id, pointer type, storage class)
    local_size: tuple[int, int, int] | None = None
    has_compute_entry = False
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0 or i + count > len(words):
            raise ValueError("truncated SPIR-V module")
        ops = words[i + 1 : i + count]
        if op == _OP_ENTRY_POINT and ops[0] == _EXEC_MODEL_GL_COMPUTE:
            has_compute_entry = True
        elif op == _OP_EXECUTION_MODE and ops[1] == _EM_LOCAL_SIZE:
            local_size = (ops[2], ops[3], ops[4])
        elif op in (_OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR, _OP_TYPE_ARRAY, _OP_TYPE_RUNTIME_ARRAY,
                    _OP_TYPE_STRUCT, _OP_TYPE_POINTER):
            types[ops[0]] = (op, *ops[1:])
        elif op == _OP_CONSTANT and len(ops) >= 3:
            constants[ops[1]] = ops[2]
        elif op == _OP_VARIABLE:
            variables.append((ops[1], ops[0], ops[2]))
        elif op == _OP_DECORATE and len(ops) >= 3:
            decorations[(ops[0], ops[1])] = ops[2]
        elif op == _OP_MEMBER_DECORATE and ops[2] == _DEC_OFFSET:
            member_offsets[(ops[0], ops[1])] = ops[3]
        i += count
    if not has_compute_entry or local_size is None:
        raise ValueError("SPIR-V module has no GLCompute entry point with a LocalSize execution mode")

    def size_of(type_id: int) -> int:
        t = types[type_id]
        if t[0] in (_OP_TYPE_INT, _OP_TYPE_FLOAT):
            return t[1] // 8
        if t[0] == _OP_TYPE_VECTOR:
            return size_of(t[1]) * t[2]
        if t[0] == _OP_TYPE_ARRAY:
            stride = decorations.get((type_id, _DEC_ARRAY_STRIDE), size_of(t[1]))
            return stride * constants[t[2]]
        if t[0] == _OP_TYPE_STRUCT:
            members = t[1:]
            if not members:
                return 0
            last = len(members) - 1
            return member_offsets.get((type_id, last), 0) + size_of(members[last])
        raise ValueError(f"unsupported push-constant member type (opcode {t[0]})")

    bindings: set[int] = set()
    push_size = 0
    for var_id, ptr_type, storage in variables:
        if storage in (_SC_STORAGE_BUFFER, _SC_UNIFORM):
            if decorations.get((var_id, _DEC_SET), 0) != 0:
                raise ValueError("only descriptor set 0 is supported")
            bindings.add(decorations[(var_id, _DEC_BINDING)])
        elif storage == _SC_PUSH_CONSTANT:
            push_size = size_of(types[ptr_type][2])
    if bindings != set(range(len(bindings))):
        raise ValueError(f"descriptor bindings must be 0..n-1, got {sorted(bindings)}")
    spec_ids = tuple(sorted(v for (_, dec), v in decorations.items() if dec == _DEC_SPEC_ID))
    return ShaderInterface(bindings=len(bindings), push_constant_size=push_size, local_size=local_size,
                           spec_constants=spec_ids)
