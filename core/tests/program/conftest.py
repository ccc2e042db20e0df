"""Helpers for the program-format tests: random programs, and conversion/comparison with ExecuTorch's classes.

Helpers are exposed as fixtures because tests run with ``--import-mode=importlib`` (no sibling imports).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
from typing import Any

import pytest

from edgeport.program import schema as S

# ----------------------------------------------------------------------------------------- random programs


def _rand_str(rng: random.Random) -> str:
    alphabet = "abcxyz_:.0123456789 ÄüЖ日本"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def _rand_tensor(rng: random.Random, nconst: int, arena: int) -> S.Tensor:
    rank = rng.randint(0, 4)
    sizes = [rng.randint(0, 5) for _ in range(rank)]
    order = list(range(rank))
    rng.shuffle(order)
    constant = nconst > 1 and rng.random() < 0.3
    return S.Tensor(
        scalar_type=rng.choice(list(S.ScalarType)),
        storage_offset=0,
        sizes=sizes,
        dim_order=order,
        requires_grad=rng.random() < 0.2,
        data_buffer_idx=rng.randrange(1, nconst) if constant else 0,
        allocation_info=None if constant or rng.random() < 0.2 else S.AllocationDetails(
            1, rng.randrange(0, max(arena, 1)), rng.choice([0, 0, 1])),
        layout=0,
        shape_dynamism=rng.choice(list(S.TensorShapeDynamism)),
        extra_tensor_info=None if rng.random() < 0.8 else S.ExtraTensorInfo(
            mutable_data_segments_idx=0, fully_qualified_name=rng.choice([None, _rand_str(rng)]),
            location=S.TensorDataLocation.SEGMENT, device_type=rng.choice(list(S.DeviceType)),
            device_index=rng.randint(-3, 3)),
    )


def _rand_value(rng: random.Random, n: int, nconst: int) -> S.EValue:
    kind = rng.randrange(11)
    idx = lambda: rng.randrange(max(n, 1))  # noqa: E731
    val: Any = [
        lambda: S.Null(),
        lambda: S.Int(rng.choice([0, 1, -1, 2**63 - 1, -(2**63), rng.randint(-1000, 1000)])),
        lambda: S.Bool(rng.random() < 0.5),
        lambda: S.Double(rng.choice([0.0, -0.0, 1.5, -2.25e300, math.inf, -math.inf, rng.uniform(-9, 9)])),
        lambda: _rand_tensor(rng, nconst, 1 << 12),
        lambda: S.String(_rand_str(rng)),
        lambda: S.IntList([idx() for _ in range(rng.randint(0, 4))]),
        lambda: S.DoubleList([rng.uniform(-5, 5) for _ in range(rng.randint(0, 4))]),
        lambda: S.BoolList([rng.random() < 0.5 for _ in range(rng.randint(0, 4))]),
        lambda: S.TensorList([idx() for _ in range(rng.randint(0, 4))]),
        lambda: S.OptionalTensorList([rng.choice([-1, idx()]) for _ in range(rng.randint(0, 4))]),
    ][kind]()
    return S.EValue(val)


def _rand_instruction(rng: random.Random, n: int, nops: int, ndel: int, ninstr: int) -> S.Instruction:
    idx = lambda: rng.randrange(max(n, 1))  # noqa: E731
    kind = rng.randrange(5)
    if kind == 0 or (kind == 1 and ndel == 0):
        return S.Instruction(S.KernelCall(rng.randrange(max(nops, 1)), [idx() for _ in range(rng.randint(0, 6))]))
    if kind == 1:
        return S.Instruction(S.DelegateCall(rng.randrange(ndel), [idx() for _ in range(rng.randint(0, 6))]))
    if kind == 2:
        return S.Instruction(S.MoveCall(idx(), idx()))
    if kind == 3:
        return S.Instruction(S.JumpFalseCall(idx(), rng.randint(0, ninstr)))
    return S.Instruction(S.FreeCall(idx()))


def random_program(seed: int, *, max_values: int = 30) -> S.Program:
    """A structurally rich random Program (every table and union member shows up over a few seeds).

    Constants are in ``constant_buffer`` (entry 0 empty) and delegate blobs inline, as ``serialize_pte`` expects.
    """
    rng = random.Random(seed)
    nconst = rng.randint(1, 5)
    constant_buffer = [S.Buffer(b"")] + [S.Buffer(rng.randbytes(rng.randint(0, 70))) for _ in range(nconst - 1)]
    blobs: list[S.BackendDelegateInlineData] = []
    plans = []
    for p in range(rng.randint(1, 3)):
        n = rng.randint(1, max_values)
        values = [_rand_value(rng, n, nconst) for _ in range(n)]
        operators = [S.Operator(f"aten::op{i}", rng.choice(["out", "Tensor_out", ""])) for i in range(rng.randint(0, 4))]
        delegates = []
        for _ in range(rng.randint(0, 3)):
            blobs.append(S.BackendDelegateInlineData(rng.choice([b"", rng.randbytes(rng.randint(1, 300)), b"same"])))
            delegates.append(S.BackendDelegate(
                id=rng.choice(["XnnpackBackend", "example", _rand_str(rng)]),
                processed=S.BackendDelegateDataReference(S.DataLocation.INLINE, len(blobs) - 1),
                compile_specs=[S.CompileSpec(_rand_str(rng), rng.randbytes(rng.randint(0, 9)))
                               for _ in range(rng.randint(0, 3))]))
        chains = []
        for _ in range(rng.randint(0, 2)):
            ninstr = rng.randint(0, 8)
            instrs = [_rand_instruction(rng, n, len(operators), len(delegates), ninstr) for _ in range(ninstr)]
            stack = None if rng.random() < 0.6 else [
                S.FrameList([S.Frame(_rand_str(rng), rng.randint(0, 999), _rand_str(rng), _rand_str(rng))
                             for _ in range(rng.randint(0, 2))]) for _ in instrs]
            chains.append(S.Chain([rng.randrange(n)], [rng.randrange(n)], instrs, stack))
        plans.append(S.ExecutionPlan(
            name=f"method_{p}",
            container_meta_type=S.ContainerMetadata(_rand_str(rng), _rand_str(rng)),
            values=values,
            inputs=[rng.randrange(n) for _ in range(rng.randint(0, 3))],
            outputs=[rng.randrange(n) for _ in range(rng.randint(0, 3))],
            chains=chains,
            operators=operators,
            delegates=delegates,
            non_const_buffer_sizes=[0, rng.randint(0, 1 << 40)],
            non_const_buffer_device=None if rng.random() < 0.7 else [
                S.NonConstBufferDevice(1, rng.choice(list(S.DeviceType)), rng.randint(0, 3))],
        ))
    return S.Program(version=0, execution_plan=plans, constant_buffer=constant_buffer, backend_delegate_data=blobs)


# ----------------------------------------------------------------------------------- ExecuTorch conversion


def to_executorch(obj: Any) -> Any:
    """Convert an edgeport schema object tree into ``executorch.exir.schema`` objects (by class/field name)."""
    from executorch.exir import schema as ets
    from executorch.exir.backend.compile_spec_schema import CompileSpec as EtCompileSpec

    if isinstance(obj, list):
        return [to_executorch(x) for x in obj]
    if isinstance(obj, S.CompileSpec):
        return EtCompileSpec(obj.key, bytes(obj.value))
    if isinstance(obj, S.Double):
        return ets.Double(float(obj.double_val))
    if dataclasses.is_dataclass(obj):
        cls = getattr(ets, type(obj).__name__)
        return cls(**{f.name: to_executorch(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    if isinstance(obj, enum.IntEnum):
        et_enum = getattr(ets, type(obj).__name__, None)
        if et_enum is None:
            from executorch.exir.scalar_type import ScalarType as EtScalarType
            et_enum = EtScalarType
        return et_enum(int(obj))
    return obj


def from_executorch(obj: Any) -> Any:
    """Convert ``executorch.exir.schema`` objects into edgeport schema objects (by class/field name)."""
    if isinstance(obj, list):
        return [from_executorch(x) for x in obj]
    if dataclasses.is_dataclass(obj):
        name = type(obj).__name__
        cls = S.TABLES[name]
        kwargs = {f.name: from_executorch(getattr(obj, f.name)) for f in dataclasses.fields(cls)}
        if name == "Double" and isinstance(kwargs["double_val"], str):
            kwargs["double_val"] = float(kwargs["double_val"])
        if name == "CompileSpec":
            kwargs["value"] = bytes(kwargs["value"])
        return cls(**kwargs)
    if isinstance(obj, enum.Enum):
        return int(obj.value)
    return obj


def assert_same(ours: Any, theirs: Any, path: str = "program") -> None:
    """Field-by-field comparison of an edgeport object tree with an ExecuTorch one (names from our classes)."""
    if dataclasses.is_dataclass(ours):
        assert dataclasses.is_dataclass(theirs), f"{path}: {type(theirs).__name__} is not a table"
        assert type(ours).__name__ == type(theirs).__name__, f"{path}: {type(ours).__name__} != {type(theirs).__name__}"
        for f in dataclasses.fields(ours):
            assert_same(getattr(ours, f.name), getattr(theirs, f.name), f"{path}.{f.name}")
    elif isinstance(ours, list):
        assert theirs is not None and len(ours) == len(theirs), f"{path}: length {len(ours)} != {theirs!r:.80}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(ours, (bytes, bytearray, memoryview)):
        assert bytes(ours) == bytes(theirs), f"{path}: bytes differ"
    elif isinstance(ours, float):
        theirs = float(theirs)
        assert ours == theirs or (math.isnan(ours) and math.isnan(theirs)), f"{path}: {ours} != {theirs}"
    elif isinstance(ours, str) or ours is None:
        assert ours == theirs or (ours == "" and theirs is None), f"{path}: {ours!r} != {theirs!r}"
    else:
        assert int(ours) == int(theirs), f"{path}: {ours!r} != {theirs!r}"


@pytest.fixture
def rand_program():
    return random_program


@pytest.fixture
def et():
    """Namespace of ExecuTorch-oracle helpers; skips the test when executorch is not installed."""
    pytest.importorskip("executorch")
    import types

    return types.SimpleNamespace(to_executorch=to_executorch, from_executorch=from_executorch,
                                 assert_same=assert_same)
