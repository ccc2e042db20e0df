"""ExampleBackend's runtime executor: a numpy interpreter of the blob written by ``preprocess``.

Torch-free (numpy and ``edgeport``'s torch-free modules only). ``init`` checks everything in the blob before use
-- magic, version, JSON, every name, every op and every constant's offset and size -- and raises
:class:`edgeport.errors.ProgramError` naming what is wrong; constants become zero-copy numpy views of the
blob's memory. ``execute`` raises :class:`edgeport.errors.RuntimeExecutionError` for bad inputs or a failing op.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeport.backend import CompileSpec, RuntimeExecutor
from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport_example import format as fmt
from edgeport_example.capabilities import BACKEND_ID
from edgeport_example.options import ExampleCompileOptions


def _add(a: Any, b: Any, alpha: Any = 1) -> Any:
    return np.add(a, b) if alpha == 1 else np.add(a, np.multiply(alpha, b))


def _sub(a: Any, b: Any, alpha: Any = 1) -> Any:
    return np.subtract(a, b) if alpha == 1 else np.subtract(a, np.multiply(alpha, b))


def _addmm(bias: Any, m1: Any, m2: Any, beta: Any = 1, alpha: Any = 1) -> Any:
    out = np.matmul(m1, m2)
    if alpha != 1:
        out = np.multiply(alpha, out)
    if beta == 0:  # torch ignores bias (even nan/inf) when beta == 0
        return out
    return np.add(out, bias if beta == 1 else np.multiply(beta, bias))


def _permute(a: Any, dims: Sequence[int]) -> Any:
    return np.ascontiguousarray(np.transpose(a, [int(d) for d in dims]))


def _linear(x: Any, w: Any, b: Any = None) -> Any:
    out = np.matmul(x, np.swapaxes(w, -1, -2))
    return out if b is None else np.add(out, b)


# op name -> (kernel, number of schema arguments)
KERNELS: dict[str, tuple[Callable[..., Any], int]] = {
    "aten.add.Tensor": (_add, 3),
    "aten.sub.Tensor": (_sub, 3),
    "aten.mul.Tensor": (np.multiply, 2),
    "aten.sin.default": (np.sin, 1),
    "aten.relu.default": (lambda a: np.maximum(a, np.zeros((), dtype=a.dtype)), 1),
    "aten.mm.default": (np.matmul, 2),
    "aten.addmm.default": (_addmm, 5),
    "aten.permute_copy.default": (_permute, 2),
    "aten.linear.default": (_linear, 3),
}

_ERR = f"{BACKEND_ID} blob"


@dataclass
class _Node:
    op: str
    kernel: Callable[..., Any]
    args: list[Any]
    output: str


@dataclass
class ExampleProgram:
    """What ``init`` returns: the checked document, its constants (views of the blob) and the node list."""

    document: dict[str, Any]
    inputs: list[str]
    input_specs: list[dict[str, Any]]
    constants: dict[str, np.ndarray]
    nodes: list[_Node]
    outputs: list[str]
    compile_options: ExampleCompileOptions
    alive: bool = field(default=True)


class _Ref:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _fail(msg: str) -> ProgramError:
    return ProgramError(f"{_ERR}: {msg}")


def _as_bytes_view(processed: Any) -> memoryview:
    try:
        mv = memoryview(processed)
    except TypeError as exc:
        raise _fail(f"expected a bytes-like object, got {type(processed).__name__}") from exc
    if mv.ndim != 1 or mv.itemsize != 1:
        try:
            mv = mv.cast("B")
        except TypeError as exc:
            raise _fail("the buffer must be C-contiguous bytes") from exc
    return mv


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(f"{what} must be a non-empty string, got {value!r}")
    return value


def _decode_arg(value: Any, defined: set[str], where: str, depth: int = 0) -> Any:
    if depth > 8:
        raise _fail(f"{where}: argument nested too deeply")
    if isinstance(value, dict):
        if set(value) != {"value"}:
            raise _fail(f'{where}: an argument object must be {{"value": name}}, got keys {sorted(value)}')
        name = _check_name(value["value"], f"{where}: value reference")
        if name not in defined:
            raise _fail(f"{where}: uses value {name!r} before it is defined")
        return _Ref(name)
    if isinstance(value, list):
        return [_decode_arg(v, defined, where, depth + 1) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise _fail(f"{where}: unsupported argument {value!r}")


def parse_blob(processed: Any) -> tuple[dict[str, Any], memoryview, int]:
    """Check the header and decode the JSON document: ``(document, blob view, data region start)``."""
    mv = _as_bytes_view(processed)
    size = len(mv)
    if size < fmt.HEADER.size:
        raise _fail(f"truncated: {size} bytes, the header alone needs {fmt.HEADER.size}")
    magic, version, json_len = fmt.HEADER.unpack_from(mv, 0)
    if magic != fmt.MAGIC:
        raise _fail(f"bad magic {bytes(magic)!r}, expected {fmt.MAGIC!r}: this is not an {BACKEND_ID} blob")
    if version != fmt.FORMAT_VERSION:
        raise _fail(
            f"format version {version} is not supported (this executor reads version {fmt.FORMAT_VERSION}); "
            "lower the model again with the installed edgeport-example"
        )
    end = fmt.HEADER.size + json_len
    if end > size:
        raise _fail(
            f"truncated: the JSON document needs bytes {fmt.HEADER.size}..{end} but the blob has {size}"
        )
    try:
        document = json.loads(bytes(mv[fmt.HEADER.size : end]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _fail(f"the JSON document is corrupt: {exc}") from exc
    if not isinstance(document, dict):
        raise _fail(f"the JSON document must be an object, got {type(document).__name__}")
    return document, mv, fmt.data_start(json_len)


def load_program(processed: Any, compile_specs: Sequence[CompileSpec] = ()) -> ExampleProgram:
    """Validate a blob and build the program the executor runs (the body of ``ExampleExecutor.init``)."""
    try:
        options = ExampleCompileOptions.from_compile_specs(list(compile_specs))
    except ValueError as exc:
        raise ProgramError(f"{BACKEND_ID}: {exc}") from exc
    doc, mv, start = parse_blob(processed)
    size = len(mv)

    def field_of(key: str, kind: type) -> Any:
        if key not in doc:
            raise _fail(f"the JSON document has no {key!r}")
        if not isinstance(doc[key], kind):
            raise _fail(f"{key!r} must be a {kind.__name__}, got {type(doc[key]).__name__}")
        return doc[key]

    if field_of("backend_id", str) != BACKEND_ID:
        raise _fail(f"written for backend {doc['backend_id']!r}, not {BACKEND_ID!r}")
    field_of("plugin_version", str)
    inputs = [_check_name(n, "an input name") for n in field_of("inputs", list)]
    input_specs = field_of("input_specs", list)
    if len(input_specs) != len(inputs):
        raise _fail(f"{len(inputs)} inputs but {len(input_specs)} input_specs")
    for i, spec in enumerate(input_specs):
        if (
            not isinstance(spec, dict)
            or spec.get("dtype") not in fmt.DTYPES
            or not isinstance(spec.get("shape"), list)
        ):
            raise _fail(f"input_specs[{i}] must be {{'dtype': <known dtype>, 'shape': [...]}}, got {spec!r}")
        if not all(
            d is None or (isinstance(d, int) and not isinstance(d, bool) and d >= 0) for d in spec["shape"]
        ):
            raise _fail(f"input_specs[{i}]: bad shape {spec['shape']!r}")
    defined: set[str] = set()
    for name in inputs:
        if name in defined:
            raise _fail(f"input {name!r} is listed twice")
        defined.add(name)

    constants: dict[str, np.ndarray] = {}
    for i, c in enumerate(field_of("constants", list)):
        where = f"constants[{i}]"
        if not isinstance(c, dict):
            raise _fail(f"{where} must be an object")
        name = _check_name(c.get("name"), f"{where}.name")
        if name in defined:
            raise _fail(f"{where}: name {name!r} is already defined")
        dtype = c.get("dtype")
        if dtype not in fmt.DTYPES:
            raise _fail(f"{where} ({name}): unknown dtype {dtype!r}")
        shape, offset, nbytes = c.get("shape"), c.get("offset"), c.get("nbytes")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise _fail(f"{where} ({name}): bad shape {shape!r}")
        for key, v in (("offset", offset), ("nbytes", nbytes)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise _fail(f"{where} ({name}): bad {key} {v!r}")
        np_dtype = np.dtype(fmt.DTYPES[dtype])
        count = math.prod(shape)
        if nbytes != count * np_dtype.itemsize:
            raise _fail(f"{where} ({name}): nbytes {nbytes} does not match shape {shape} of {dtype}")
        if offset % fmt.ALIGNMENT:
            raise _fail(f"{where} ({name}): offset {offset} is not aligned to {fmt.ALIGNMENT}")
        if start + offset + nbytes > size:
            raise _fail(
                f"{where} ({name}): bytes {start + offset}..{start + offset + nbytes} lie outside the "
                f"{size}-byte blob (truncated?)"
            )
        array = np.frombuffer(mv, dtype=np_dtype, count=count, offset=start + offset).reshape(shape)
        constants[name] = array
        defined.add(name)

    nodes: list[_Node] = []
    for i, n in enumerate(field_of("nodes", list)):
        where = f"nodes[{i}]"
        if not isinstance(n, dict):
            raise _fail(f"{where} must be an object")
        op = n.get("op")
        if op not in KERNELS:
            raise _fail(f"{where}: op {op!r} is not an {BACKEND_ID} op (known: {sorted(KERNELS)})")
        kernel, arity = KERNELS[op]
        args = n.get("args")
        if not isinstance(args, list) or len(args) != arity:
            raise _fail(f"{where} ({op}): expected a list of {arity} args, got {args!r}")
        output = _check_name(n.get("output"), f"{where}.output")
        decoded = [_decode_arg(a, defined, f"{where} ({op})") for a in args]
        if output in defined:
            raise _fail(f"{where} ({op}): output {output!r} is already defined")
        defined.add(output)
        nodes.append(_Node(op, kernel, decoded, output))

    outputs = [_check_name(o, "an output name") for o in field_of("outputs", list)]
    for o in outputs:
        if o not in defined:
            raise _fail(f"output {o!r} is not defined")
    return ExampleProgram(doc, inputs, input_specs, constants, nodes, outputs, options)


def _resolve(arg: Any, env: dict[str, Any]) -> Any:
    if isinstance(arg, _Ref):
        return env[arg.name]
    if isinstance(arg, list):
        return [_resolve(a, env) for a in arg]
    return arg


class ExampleExecutor(RuntimeExecutor):
    """Runs ExampleBackend blobs with numpy."""

    def is_available(self) -> tuple[bool, str]:
        return True, ""

    def init(self, processed: memoryview, compile_specs: Sequence[CompileSpec] = ()) -> ExampleProgram:
        return load_program(processed, compile_specs)

    def execute(self, handle: ExampleProgram, inputs: Sequence[Any]) -> list[np.ndarray]:
        if not isinstance(handle, ExampleProgram):
            raise RuntimeExecutionError(f"{BACKEND_ID}: execute needs the handle init returned")
        if not handle.alive:
            raise RuntimeExecutionError(f"{BACKEND_ID}: this handle was destroyed")
        if len(inputs) != len(handle.inputs):
            raise RuntimeExecutionError(
                f"{BACKEND_ID}: expected {len(handle.inputs)} inputs ({', '.join(handle.inputs)}), got {len(inputs)}"
            )
        env: dict[str, Any] = dict(handle.constants)
        given: set[int] = set()
        for name, spec, value in zip(handle.inputs, handle.input_specs, inputs, strict=True):
            array = np.asarray(value)
            want = np.dtype(fmt.DTYPES[spec["dtype"]])
            if array.dtype != want:
                raise RuntimeExecutionError(
                    f"{BACKEND_ID}: input {name!r} must be {spec['dtype']}, got {array.dtype}"
                )
            shape = spec["shape"]
            if array.ndim != len(shape) or any(
                d is not None and d != s for d, s in zip(shape, array.shape, strict=True)
            ):
                raise RuntimeExecutionError(
                    f"{BACKEND_ID}: input {name!r} must have shape {shape} (None = any), got {list(array.shape)}"
                )
            env[name] = array
            given.add(id(array))
        for node in handle.nodes:
            try:
                env[node.output] = np.asarray(node.kernel(*(_resolve(a, env) for a in node.args)))
            except Exception as exc:  # noqa: BLE001 - name the node whatever numpy raised
                raise RuntimeExecutionError(
                    f"{BACKEND_ID}: node {node.output!r} ({node.op}) failed: {type(exc).__name__}: {exc}"
                ) from exc
        results = []
        for name in handle.outputs:
            out = env[name]
            if (
                name in handle.constants
                or id(out) in given
                or not out.flags.owndata
                or not out.flags.writeable
            ):
                out = out.copy()  # never hand out views of the blob or of the caller's inputs
            results.append(out)
        return results

    def destroy(self, handle: ExampleProgram) -> None:
        if isinstance(handle, ExampleProgram):
            handle.alive = False
            handle.constants = {}
            handle.nodes = []
