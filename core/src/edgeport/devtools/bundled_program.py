"""Bundled programs (``.bpte``): a program and test cases for its methods, in ExecuTorch's format.

``BundledProgram(program, method_test_suites)`` (ExecuTorch's names) bundles a ``.pte`` with inputs and the outputs
eager PyTorch gave for them; ``serialize_from_bundled_program_to_flatbuffer`` writes the ``.bpte`` the stock
ExecuTorch runtime loads and verifies (``_load_bundled_program_from_buffer(...).verify_result_with_bundled_expected_output``);
:func:`load_bundled_program` reads one (edgeport's or ExecuTorch's) and :meth:`LoadedBundledProgram.verify` runs every
test case on edgeport's runtime. The reader checks the file as the ``.pte`` reader does. Torch is optional: inputs
and outputs may be numpy arrays, torch tensors or Python scalars.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from edgeport.errors import EdgeportError, ProgramError, SerializationError
from edgeport.program import schema as S
from edgeport.program.flatbuffer_writer import _Writer
from edgeport.program.layout import Layout, build_layout, read_schema_text
from edgeport.program.reader import _byte_view, _Decoder

__all__ = [
    "BUNDLED_PROGRAM_SCHEMA_VERSION", "BundledProgram", "BundledVerificationError", "LoadedBundledProgram",
    "MethodTestCase", "MethodTestSuite", "load_bundled_program", "serialize_from_bundled_program_to_flatbuffer",
]

BUNDLED_PROGRAM_SCHEMA_VERSION = 2  # what ExecuTorch 1.5.1 writes
FILE_IDENTIFIER = b"BP08"


class BundledVerificationError(EdgeportError):
    """A bundled test case's outputs differ from its expected outputs."""


# --------------------------------------------------------------------------------------------- wire tables
@dataclass
class Int:
    int_val: int = 0


@dataclass
class Bool:
    bool_val: bool = False


@dataclass
class Double:
    double_val: float = 0.0


@dataclass
class Tensor:
    scalar_type: S.ScalarType = S.ScalarType.FLOAT
    sizes: list[int] = field(default_factory=list)
    data: bytes = b""
    dim_order: list[int] = field(default_factory=list)


@dataclass
class Value:
    val: Tensor | Int | Bool | Double = field(default_factory=Int)


@dataclass
class BundledMethodTestCase:
    inputs: list[Value] = field(default_factory=list)
    expected_outputs: list[Value] = field(default_factory=list)


@dataclass
class BundledMethodTestSuite:
    method_name: str = ""
    test_cases: list[BundledMethodTestCase] = field(default_factory=list)


@dataclass
class BundledProgramTable:
    version: int = BUNDLED_PROGRAM_SCHEMA_VERSION
    method_test_suites: list[BundledMethodTestSuite] = field(default_factory=list)
    program: bytes = b""


_CLASSES: dict[str, type] = {
    "Int": Int, "Bool": Bool, "Double": Double, "Tensor": Tensor, "Value": Value,
    "BundledMethodTestCase": BundledMethodTestCase, "BundledMethodTestSuite": BundledMethodTestSuite,
    "BundledProgram": BundledProgramTable,
}


@lru_cache(maxsize=1)
def _layout() -> Layout:
    text = resources.files("edgeport.devtools").joinpath("bundled_program.fbs").read_text(encoding="utf-8")
    lay = build_layout([read_schema_text("scalar_type.fbs"), text], _CLASSES,
                       types.SimpleNamespace(ScalarType=S.ScalarType))
    if lay.file_identifier != FILE_IDENTIFIER or lay.root != "BundledProgram":
        raise RuntimeError('bundled_program.fbs must declare file_identifier "BP08" and root_type BundledProgram')
    return lay


# --------------------------------------------------------------------------------------------- user API
@dataclass
class MethodTestCase:
    """Inputs of one run of a method and, optionally, the outputs it must produce (ExecuTorch's class)."""

    inputs: Sequence[Any]
    expected_outputs: Sequence[Any] | None = None


@dataclass
class MethodTestSuite:
    """The test cases of one method (ExecuTorch's class)."""

    method_name: str
    test_cases: Sequence[MethodTestCase]


def _as_array(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        return value.detach().cpu().contiguous().numpy()
    return None


def _to_value(value: Any, where: str) -> Value:
    arr = _as_array(value)
    if arr is not None:
        try:
            stype = S.scalar_type_from_numpy(arr.dtype)
        except (KeyError, ValueError, TypeError) as exc:
            raise SerializationError(f"{where}: dtype {arr.dtype} has no ExecuTorch scalar type") from exc
        arr = np.ascontiguousarray(arr)
        return Value(Tensor(stype, [int(d) for d in arr.shape], arr.tobytes(), list(range(arr.ndim))))
    if isinstance(value, bool):
        return Value(Bool(value))
    if isinstance(value, int):
        return Value(Int(value))
    if isinstance(value, float):
        return Value(Double(value))
    raise SerializationError(f"{where}: {type(value).__name__} is not a tensor, int, bool or float")


class BundledProgram:
    """A program with test cases (ExecuTorch's ``BundledProgram``): ``program`` is an
    ``ExecutorchProgramManager`` (edgeport's or ExecuTorch's) or ``.pte`` bytes.

    Every suite must name a method of the program, and every test case must give as many inputs as the method
    takes, with the dtypes and shapes it declares (a dynamic dimension may be smaller than its bound).
    """

    def __init__(self, program: Any, method_test_suites: Sequence[MethodTestSuite]) -> None:
        from edgeport.program import load_pte

        self.program_bytes = bytes(program.buffer if hasattr(program, "buffer") else program)
        #: the program manager it was made from (None when made from bytes): an ETRecord takes its debug maps
        self.executorch_program = program if hasattr(program, "debug_handle_map") else None
        plans = {p.name: p for p in load_pte(self.program_bytes).program.execution_plan}
        self.method_test_suites = list(method_test_suites)
        suites = []
        for suite in self.method_test_suites:
            plan = plans.get(suite.method_name)
            if plan is None:
                raise SerializationError(f"test suite for {suite.method_name!r}: the program has no such method "
                                         f"(methods: {sorted(plans)})")
            cases = []
            for ci, case in enumerate(suite.test_cases):
                where = f"{suite.method_name!r} test case {ci}"
                if len(case.inputs) != len(plan.inputs):
                    raise SerializationError(f"{where}: {len(case.inputs)} inputs, the method takes {len(plan.inputs)}")
                inputs = [_to_value(v, f"{where} input {i}") for i, v in enumerate(case.inputs)]
                for i, (value, index) in enumerate(zip(inputs, plan.inputs)):
                    _check_input(value, plan.values[index].val, f"{where} input {i}")
                outputs = [_to_value(v, f"{where} expected output {i}")
                           for i, v in enumerate(case.expected_outputs or [])]
                cases.append(BundledMethodTestCase(inputs, outputs))
            suites.append(BundledMethodTestSuite(suite.method_name, cases))
        self._table = BundledProgramTable(BUNDLED_PROGRAM_SCHEMA_VERSION, suites, self.program_bytes)
        self._buffer: bytes | None = None

    @property
    def buffer(self) -> bytes:
        """The ``.bpte`` bytes."""
        if self._buffer is None:
            self._buffer = serialize_from_bundled_program_to_flatbuffer(self)
        return self._buffer

    def save(self, path: str) -> None:
        """Write the ``.bpte`` atomically (temporary file, then rename)."""
        from edgeport.program.pte import write_pte_file

        write_pte_file(path, self.buffer)


def _check_input(value: Value, declared: Any, where: str) -> None:
    if isinstance(declared, S.Tensor):
        t = value.val
        if not isinstance(t, Tensor):
            raise SerializationError(f"{where}: the method takes a tensor, got {type(t).__name__.lower()}")
        if int(t.scalar_type) != int(declared.scalar_type):
            raise SerializationError(f"{where}: dtype {S.ScalarType(t.scalar_type).name}, the method takes "
                                     f"{S.ScalarType(declared.scalar_type).name}")
        bound = declared.shape_dynamism != S.TensorShapeDynamism.STATIC
        if len(t.sizes) != len(declared.sizes) or any(
                (g > d) if bound else (g != d) for g, d in zip(t.sizes, declared.sizes)):
            raise SerializationError(f"{where}: shape {t.sizes}, the method takes {list(declared.sizes)}"
                                     + (" (upper bounds)" if bound else ""))


def serialize_from_bundled_program_to_flatbuffer(bundled: BundledProgram) -> bytes:
    """The ``.bpte`` bytes of ``bundled`` (ExecuTorch's function name)."""
    import flatbuffers

    builder = flatbuffers.Builder(len(bundled.program_bytes) + 4096)
    root = _Writer(_layout(), 16, 16).packers["BundledProgram"](builder, bundled._table)
    builder.Finish(root, file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


# --------------------------------------------------------------------------------------------- reading
def _from_value(value: Value, where: str) -> Any:
    v = value.val
    if isinstance(v, Tensor):
        from edgeport.program.loaded import tensor_nbytes

        nbytes = tensor_nbytes(S.Tensor(scalar_type=v.scalar_type, sizes=list(v.sizes)), where)
        if len(v.data) != nbytes:
            raise ProgramError(f"{where}: tensor of {v.sizes} needs {nbytes} bytes, has {len(v.data)}")
        try:
            dtype = S.numpy_dtype(v.scalar_type)
        except ValueError as exc:
            raise ProgramError(f"{where}: {exc}") from None
        return np.frombuffer(bytes(v.data), dtype=dtype).reshape(v.sizes)
    if isinstance(v, Int):
        return int(v.int_val)
    if isinstance(v, Bool):
        return bool(v.bool_val)
    return float(v.double_val)


@dataclass
class LoadedBundledProgram:
    """A parsed ``.bpte``: ``program`` (the ``.pte`` bytes) and ``suites`` (method -> [(inputs, expected)])."""

    version: int
    program: bytes
    suites: dict[str, list[tuple[list[Any], list[Any]]]]

    def verify(self, method_name: str | None = None, *, rtol: float = 1e-5, atol: float = 1e-8,
               data_path: Any = None) -> dict[str, list[float]]:
        """Run every test case (of ``method_name``, or of every method) on edgeport's runtime; returns the largest
        absolute error of each case, and raises :class:`BundledVerificationError` on the first case whose outputs
        are not ``allclose(rtol, atol)`` to the expected ones (naming the method, case and output)."""
        from edgeport.runtime import Runtime

        program = Runtime.get().load_program(self.program, data_path=data_path)
        names = [method_name] if method_name is not None else list(self.suites)
        report: dict[str, list[float]] = {}
        for name in names:
            if name not in self.suites:
                raise ProgramError(f"the bundle has no test suite for {name!r} (suites: {sorted(self.suites)})")
            method = program.load_method(name)
            errors = []
            for ci, (inputs, expected) in enumerate(self.suites[name]):
                got = method.execute(inputs)
                worst = 0.0
                for oi, want in enumerate(expected):
                    have = np.asarray(got[oi])
                    want = np.asarray(want)
                    if have.shape != want.shape or not np.allclose(have, want, rtol=rtol, atol=atol, equal_nan=True):
                        diff = float(np.max(np.abs(have - want))) if have.shape == want.shape else float("inf")
                        raise BundledVerificationError(
                            f"method {name!r} test case {ci} output {oi}: max |got - expected| = {diff:.3g} "
                            f"(shape {list(have.shape)} vs {list(want.shape)}; rtol={rtol}, atol={atol})")
                    if want.size:
                        worst = max(worst, float(np.max(np.abs(have.astype(np.float64) - want))))
                errors.append(worst)
            report[name] = errors
        return report


def load_bundled_program(data: Any, name: str = "<bytes>") -> LoadedBundledProgram:
    """Parse and check a ``.bpte`` (edgeport's or ExecuTorch's); ``ProgramError`` names ``name`` and the problem."""
    view = _byte_view(data)
    n = len(view)
    if n < 8 or bytes(view[4:8]) != FILE_IDENTIFIER:
        raise ProgramError(f"bundled program {name}: not a .bpte (file identifier "
                           f"{bytes(view[4:8]) if n >= 8 else b''!r}, expected {FILE_IDENTIFIER!r})")
    (root,) = np.frombuffer(view[:4], "<u4")
    if not 8 <= int(root) < n:
        raise ProgramError(f"bundled program {name}: root table offset {int(root)} is outside the file ({n} bytes)")
    dec = _Decoder(_layout())
    dec.start(view, n)
    try:
        table = dec.table("BundledProgram", int(root), "bundled_program")
    except ProgramError as exc:
        raise ProgramError(f"bundled program {name}: {exc}") from None
    finally:
        dec.finish()
    if table.version > BUNDLED_PROGRAM_SCHEMA_VERSION:
        raise ProgramError(f"bundled program {name}: schema version {table.version} is newer than this reader "
                           f"({BUNDLED_PROGRAM_SCHEMA_VERSION})")
    suites: dict[str, list[tuple[list[Any], list[Any]]]] = {}
    for si, suite in enumerate(table.method_test_suites or []):
        cases = []
        for ci, case in enumerate(suite.test_cases or []):
            where = f"bundled program {name}: suite {si} ({suite.method_name!r}) case {ci}"
            cases.append(([_from_value(v, f"{where} input {i}") for i, v in enumerate(case.inputs or [])],
                          [_from_value(v, f"{where} expected output {i}")
                           for i, v in enumerate(case.expected_outputs or [])]))
        suites[suite.method_name] = cases
    return LoadedBundledProgram(int(table.version), bytes(table.program or b""), suites)
