"""TemplateBackend's runtime executor: runs blobs with numpy. Torch-free.

``init`` checks the whole blob before use -- header (magic, format version, backend id, target, sizes), then
every input, constant, node and output of the program document -- and raises :class:`edgeport.ProgramError`
naming the problem; constants become zero-copy views of the blob. ``execute`` checks the inputs and raises
``RuntimeExecutionError`` (an :class:`edgeport.EdgeportError`) when they do not match or an op fails.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeport import CompileSpec, ProgramError, RuntimeExecutor
from edgeport.errors import RuntimeExecutionError
from edgeport_template import schema
from edgeport_template.capabilities import BACKEND_ID
from edgeport_template.options import TARGETS, TemplateCompileOptions


def is_available() -> tuple[bool, str]:
    """Whether this machine can run the backend, and why not. (A real backend checks for its driver or SDK
    here, e.g. with ``ctypes.util.find_library``, and names the package that provides it.)"""
    return True, ""


def _add(a: Any, b: Any, alpha: Any = 1) -> Any:
    return np.add(a, b) if alpha == 1 else np.add(a, np.multiply(b, np.asarray(alpha, dtype=b.dtype)))


def _relu(a: Any) -> Any:
    return np.maximum(a, np.zeros((), dtype=a.dtype))


def _pad(a: Any, pad: Any, value: Any = 0) -> Any:
    widths = [(0, 0)] * a.ndim  # torch lists (before, after) pairs from the last dimension backwards
    for i in range(len(pad) // 2):
        widths[a.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    return np.pad(a, widths, constant_values=np.asarray(value, dtype=a.dtype))


#: op name -> (kernel, number of schema arguments); keep in step with capabilities.py.
KERNELS: dict[str, tuple[Callable[..., Any], int]] = {
    "aten.add.Tensor": (_add, 3),
    "aten.mul.Tensor": (np.multiply, 2),
    "aten.relu.default": (_relu, 1),
    "aten.constant_pad_nd.default": (_pad, 3),
}


@dataclass
class _Node:
    op: str
    kernel: Callable[..., Any]
    args: list[Any]
    output: str


class _Ref:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


@dataclass
class TemplateProgram:
    """The handle ``init`` returns."""

    header: schema.Header
    inputs: list[tuple[str, np.dtype, list[int | None]]]
    constants: dict[str, np.ndarray]
    nodes: list[_Node]
    outputs: list[str]
    alive: bool = field(default=True)


def _fail(msg: str) -> ProgramError:
    return ProgramError(f"{BACKEND_ID} blob: {msg}")


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(f"{what} must be a non-empty string, got {value!r}")
    return value


def _dims(value: Any, what: str, dynamic: bool) -> list[int | None]:
    ok = isinstance(value, list) and all(
        (d is None and dynamic) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0) for d in value
    )
    if not ok:
        raise _fail(f"{what}: bad shape {value!r}")
    return value


def _arg(value: Any, defined: set[str], where: str, depth: int = 0) -> Any:
    if depth > 4:
        raise _fail(f"{where}: argument nested too deeply")
    if isinstance(value, dict):
        if set(value) != {"ref"}:
            raise _fail(f'{where}: an argument object must be {{"ref": name}}, got {sorted(value)}')
        name = _name(value["ref"], f"{where}: reference")
        if name not in defined:
            raise _fail(f"{where}: uses {name!r} before it is defined")
        return _Ref(name)
    if isinstance(value, list):
        return [_arg(v, defined, where, depth + 1) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise _fail(f"{where}: unsupported argument {value!r}")


def load(processed: Any, compile_specs: Sequence[CompileSpec] = ()) -> TemplateProgram:
    """Validate a blob and build the program :class:`TemplateExecutor` runs."""
    from edgeport_template import __version__

    try:
        options = TemplateCompileOptions.from_compile_specs(list(compile_specs))
    except (ValueError, TypeError) as exc:
        raise ProgramError(f"{BACKEND_ID}: bad compile specs: {exc}") from exc
    try:
        blob = memoryview(processed).cast("B")
    except TypeError as exc:
        raise _fail(f"expected C-contiguous bytes, got {type(processed).__name__}") from exc
    header, doc, data = schema.unpack(blob, BACKEND_ID, __version__)
    if header.target not in TARGETS:
        raise _fail(f"compiled for target {header.target!r}, which this plugin cannot run (targets: {list(TARGETS)})")
    if header.target != options.target:
        raise _fail(f"compiled for target {header.target!r} but the compile specs say {options.target!r}")
    for key in ("inputs", "constants", "nodes", "outputs"):
        if not isinstance(doc.get(key), list):
            raise _fail(f"the program document needs a list {key!r}")

    defined: set[str] = set()
    inputs = []
    for i, spec in enumerate(doc["inputs"]):
        if not isinstance(spec, dict) or spec.get("dtype") not in schema.DTYPES:
            raise _fail(f"inputs[{i}] must be {{'name', 'dtype', 'shape'}} with a known dtype, got {spec!r}")
        name = _name(spec.get("name"), f"inputs[{i}].name")
        if name in defined:
            raise _fail(f"input {name!r} is listed twice")
        defined.add(name)
        inputs.append((name, np.dtype(schema.DTYPES[spec["dtype"]]), _dims(spec.get("shape"), name, True)))

    constants: dict[str, np.ndarray] = {}
    for i, c in enumerate(doc["constants"]):
        if not isinstance(c, dict) or c.get("dtype") not in schema.DTYPES:
            raise _fail(f"constants[{i}] must be an object with a known dtype, got {c!r}")
        name = _name(c.get("name"), f"constants[{i}].name")
        if name in defined:
            raise _fail(f"constant {name!r} is already defined")
        shape = _dims(c.get("shape"), name, False)
        offset, nbytes = c.get("offset"), c.get("nbytes")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (offset, nbytes)):
            raise _fail(f"constant {name!r}: bad offset/nbytes {offset!r}/{nbytes!r}")
        dtype = np.dtype(schema.DTYPES[c["dtype"]])
        if nbytes != math.prod(shape) * dtype.itemsize:
            raise _fail(f"constant {name!r}: nbytes {nbytes} does not match shape {shape} of {c['dtype']}")
        if offset % schema.ALIGNMENT or offset + nbytes > len(data):
            raise _fail(f"constant {name!r}: bytes {offset}..{offset + nbytes} are misaligned or outside the "
                        f"{len(data)}-byte data region")
        array = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
        constants[name] = array
        defined.add(name)

    nodes = []
    for i, n in enumerate(doc["nodes"]):
        if not isinstance(n, dict):
            raise _fail(f"nodes[{i}] must be an object")
        op = n.get("op")
        if op not in KERNELS:
            raise _fail(f"nodes[{i}]: {op!r} is not a {BACKEND_ID} op ({sorted(KERNELS)})")
        kernel, arity = KERNELS[op]
        args = n.get("args")
        if not isinstance(args, list) or len(args) != arity:
            raise _fail(f"nodes[{i}] ({op}): expected {arity} args, got {args!r}")
        decoded = [_arg(a, defined, f"nodes[{i}] ({op})") for a in args]
        output = _name(n.get("output"), f"nodes[{i}].output")
        if output in defined:
            raise _fail(f"nodes[{i}] ({op}): {output!r} is already defined")
        defined.add(output)
        nodes.append(_Node(op, kernel, decoded, output))

    outputs = [_name(o, "an output") for o in doc["outputs"]]
    for o in outputs:
        if o not in defined:
            raise _fail(f"output {o!r} is not defined")
    return TemplateProgram(header, inputs, constants, nodes, outputs)


def _resolve(arg: Any, env: dict[str, Any]) -> Any:
    if isinstance(arg, _Ref):
        return env[arg.name]
    if isinstance(arg, list):
        return [_resolve(a, env) for a in arg]
    return arg


class TemplateExecutor(RuntimeExecutor):
    """Runs TemplateBackend blobs with numpy. Handles are immutable after ``init``, so one handle may run on
    several threads at once."""

    thread_safe = True

    def is_available(self) -> tuple[bool, str]:
        return is_available()

    def init(self, processed: memoryview, compile_specs: Sequence[CompileSpec] = ()) -> TemplateProgram:
        return load(processed, compile_specs)

    def execute(self, handle: TemplateProgram, inputs: Sequence[Any]) -> list[np.ndarray]:
        if not isinstance(handle, TemplateProgram) or not handle.alive:
            raise RuntimeExecutionError(f"{BACKEND_ID}: execute needs a live handle from init")
        if len(inputs) != len(handle.inputs):
            raise RuntimeExecutionError(f"{BACKEND_ID}: expected {len(handle.inputs)} inputs, got {len(inputs)}")
        env: dict[str, Any] = dict(handle.constants)
        given: set[int] = set()
        for (name, dtype, shape), value in zip(handle.inputs, inputs, strict=True):
            array = np.asarray(value)
            if array.dtype != dtype:
                raise RuntimeExecutionError(f"{BACKEND_ID}: input {name!r} must be {dtype}, got {array.dtype}")
            if array.ndim != len(shape) or any(d is not None and d != s for d, s in zip(shape, array.shape)):
                raise RuntimeExecutionError(
                    f"{BACKEND_ID}: input {name!r} must have shape {shape} (None = any), got {list(array.shape)}"
                )
            env[name] = array
            given.add(id(array))
        for node in handle.nodes:
            try:
                env[node.output] = np.asarray(node.kernel(*(_resolve(a, env) for a in node.args)))
            except Exception as exc:  # noqa: BLE001 - name the failing node whatever numpy raised
                raise RuntimeExecutionError(
                    f"{BACKEND_ID}: node {node.output!r} ({node.op}) failed: {type(exc).__name__}: {exc}"
                ) from exc
        results = []
        for name in handle.outputs:
            out = env[name]
            if name in handle.constants or id(out) in given or not out.flags.owndata:
                out = out.copy()  # never hand out views of the blob or of the caller's inputs
            results.append(out)
        return results

    def destroy(self, handle: TemplateProgram) -> None:
        if isinstance(handle, TemplateProgram):
            handle.alive = False
            handle.constants = {}
            handle.nodes = []
