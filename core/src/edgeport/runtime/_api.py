"""The public runtime API, mirroring ``executorch.runtime``: Runtime -> Program -> Method."""

from __future__ import annotations

import gc
import mmap as _mmap
import os
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Union

import numpy as np

from edgeport.errors import ProgramError
from edgeport.program import schema as S
from edgeport.program.reader import LoadedPte, load_pte
from edgeport.program.verify import verify_program
from edgeport.runtime._backends import BackendStatus, backend_status, resolve_backend_options
from edgeport.runtime._execute import MethodRunner
from edgeport.runtime._method import MethodPlan
from edgeport.runtime._profile import MethodProfile
from edgeport.runtime._values import TensorInfo

__all__ = ["Runtime", "Program", "Method", "MethodMeta", "TensorInfo", "LoadedProgram", "load"]

ProgramSource = Union[str, os.PathLike, bytes, bytearray, memoryview, BinaryIO]


@dataclass(frozen=True)
class MethodMeta:
    """Inputs, outputs and memory of one method, read from the program without loading it.

    ``inputs``/``outputs`` hold a :class:`TensorInfo` per tensor (``dtype``, ``shape`` — the upper bound when
    ``dynamic``) or the Python type of a scalar. The ``executorch.runtime``-style accessors (``num_inputs()``,
    ``input_tensor_meta(i)``, ...) are provided as well.
    """

    name: str
    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    memory_planned_buffer_sizes: tuple[int, ...]
    backends: tuple[str, ...]
    operators: tuple[str, ...]

    @property
    def input_dtypes(self) -> list[np.dtype | None]:
        return [i.dtype if isinstance(i, TensorInfo) else None for i in self.inputs]

    @property
    def input_shapes(self) -> list[tuple[int, ...] | None]:
        return [i.shape if isinstance(i, TensorInfo) else None for i in self.inputs]

    @property
    def output_dtypes(self) -> list[np.dtype | None]:
        return [o.dtype if isinstance(o, TensorInfo) else None for o in self.outputs]

    @property
    def output_shapes(self) -> list[tuple[int, ...] | None]:
        return [o.shape if isinstance(o, TensorInfo) else None for o in self.outputs]

    def num_inputs(self) -> int:
        return len(self.inputs)

    def num_outputs(self) -> int:
        return len(self.outputs)

    def input_tensor_meta(self, index: int) -> TensorInfo:
        return self._tensor(self.inputs, index, "input")

    def output_tensor_meta(self, index: int) -> TensorInfo:
        return self._tensor(self.outputs, index, "output")

    def num_memory_planned_buffers(self) -> int:
        return len(self.memory_planned_buffer_sizes)

    def memory_planned_buffer_size(self, index: int) -> int:
        return self.memory_planned_buffer_sizes[index]

    def uses_backend(self, backend_id: str) -> bool:
        return backend_id in self.backends

    @staticmethod
    def _tensor(infos: tuple[Any, ...], index: int, what: str) -> TensorInfo:
        info = infos[index]
        if not isinstance(info, TensorInfo):
            raise TypeError(f"{what} {index} is a {getattr(info, '__name__', info)}, not a tensor")
        return info


def _meta_of(plan: S.ExecutionPlan) -> MethodMeta:
    values = plan.values

    def info(idx: int) -> Any:
        if not 0 <= idx < len(values):
            raise ProgramError(f"method {plan.name!r}: input/output value {idx} out of range")
        v = values[idx].val
        if isinstance(v, S.Tensor):
            try:
                dtype = S.numpy_dtype(v.scalar_type)
            except ValueError as exc:
                raise ProgramError(f"method {plan.name!r}: values[{idx}]: {exc}") from None
            return TensorInfo(dtype, tuple(v.sizes), int(v.shape_dynamism) != 0, v.allocation_info is not None,
                              tuple(v.dim_order))
        return {S.Int: int, S.Double: float, S.Bool: bool, S.String: str, S.Null: type(None)}.get(type(v), object)

    return MethodMeta(
        plan.name,
        tuple(info(i) for i in plan.inputs),
        tuple(info(i) for i in plan.outputs),
        tuple(plan.non_const_buffer_sizes[1:]),
        tuple(sorted({d.id for d in plan.delegates})),
        tuple(f"{o.name}.{o.overload}" if o.overload else o.name for o in plan.operators),
    )


class Method:
    """A loaded method. ``execute`` is safe to call from several threads at once (each run gets its own
    planned memory); delegates whose executor is not declared ``thread_safe`` are called one at a time."""

    def __init__(self, program: Program, plan: MethodPlan) -> None:
        self._program = program
        self._plan = plan
        self._runner = MethodRunner(plan)
        self._run = self._runner.run if plan.stateful else self._runner._run
        self._finalizer = weakref.finalize(self, plan.destroy)

    @property
    def name(self) -> str:
        return self._plan.name

    @property
    def metadata(self) -> MethodMeta:
        return _meta_of(self._plan.plan)

    @property
    def profile(self) -> MethodProfile:
        """Kernel library per op, the executor or portable fallback of each delegate, run counters."""
        return self._plan.profile

    @property
    def time_ops(self) -> bool:
        """When true, each run adds its per-op wall time to ``profile.op_seconds`` / ``profile.op_calls``."""
        return self._runner.time_ops

    @time_ops.setter
    def time_ops(self, on: bool) -> None:
        self._runner.time_ops = bool(on)

    def execute(self, inputs: Sequence[Any]) -> list[Any]:
        """Run the method on ``inputs`` (numpy arrays, or torch tensors when torch is installed, or scalars);
        returns the outputs as numpy arrays (fresh copies) or Python scalars."""
        if type(inputs) is not list and type(inputs) is not tuple and (
                isinstance(inputs, np.ndarray) or not isinstance(inputs, (list, tuple))):
            inputs = list(inputs) if isinstance(inputs, Iterator) else [inputs]
        return self._run(inputs)

    def __call__(self, *inputs: Any) -> list[Any]:
        return self.execute(inputs)

    def prepare(self, example_inputs: Sequence[Any]) -> None:
        """Do now the one-time work that the first call with inputs of these shapes would do: run the method
        once on ``example_inputs`` (any values of the shapes and dtypes to come, e.g. a decoder's one-token
        step) and discard the results. Delegates specialize for a shape they have not seen on its first call;
        this moves that work out of, say, the first decode step of a generation into load time.

        The method's state (mutable buffers such as a KV cache) is untouched, and ``profile.runs`` does not count
        the run, nor does an ETDump record it. Raises like :meth:`execute` for inputs the method cannot take.

        It ends with a full garbage collection (``gc.collect()``): loading leaves tens of thousands of new objects,
        and the collector's first full pass over them (15-25 ms for a decoder on a busy host) would otherwise fall
        into a later call -- in a generation, the first decode step."""
        if isinstance(example_inputs, np.ndarray) or not isinstance(example_inputs, (list, tuple)):
            example_inputs = [example_inputs]
        self._runner.prepare(example_inputs)
        gc.collect()

    def release(self) -> None:
        """Destroy delegate handles now (also happens when the method is garbage collected)."""
        self._finalizer()

    def __enter__(self) -> Method:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        m = self.metadata
        return f"<edgeport Method {m.name!r}: {len(m.inputs)} inputs, {len(m.outputs)} outputs>"


class Program:
    """A loaded ``.pte`` program (memory-mapped or in memory): its methods and their metadata."""

    def __init__(self, loaded: LoadedPte, source: Any, kernels: Any = None, etdump: Any = None) -> None:
        self._loaded = loaded
        self._source = source  # keeps the mmap / bytes alive while views exist
        self._kernels = kernels
        self._names = [p.name for p in loaded.program.execution_plan]
        self._etdump = etdump  # an ETDumpRecorder when loaded with enable_etdump=True

    def write_etdump_result_to_file(self, etdump_path: str | os.PathLike, debug_buffer_path: str | os.PathLike |
                                    None = None) -> None:
        """Write what this program's methods recorded (``enable_etdump=True``) as an ETDump file (ExecuTorch's
        name and format). ``debug_buffer_path`` gets the debug buffer: the intermediate outputs recorded when the
        program was loaded with ``debug_buffer_size`` > 0 (the ETDump's debug events point into it)."""
        if self._etdump is None:
            raise RuntimeError("nothing was recorded: load the program with "
                               "Runtime.get().load_program(..., enable_etdump=True)")
        self._etdump.write(os.fspath(etdump_path),
                           None if debug_buffer_path is None else os.fspath(debug_buffer_path))

    @property
    def method_names(self) -> set[str]:
        return set(self._names)

    @property
    def program(self) -> S.Program:
        """The decoded program tree."""
        return self._loaded.program

    def _plan_index(self, name: str) -> int:
        if name not in self._names:
            raise ProgramError(f"no method named {name!r} in the program; methods: {sorted(self._names)}")
        return self._names.index(name)

    def metadata(self, method_name: str) -> MethodMeta:
        return _meta_of(self._loaded.program.execution_plan[self._plan_index(method_name)])

    def required_backends(self) -> list[BackendStatus]:
        """The backends this program's delegates call (every method), each with whether this machine has it."""
        return [backend_status(b) for b in self._backend_ids()]

    def _backend_ids(self) -> list[str]:
        seen: dict[str, None] = {}
        for plan in self._loaded.program.execution_plan:
            for d in plan.delegates:
                seen.setdefault(d.id, None)
        return list(seen)

    def load_method(self, name: str = "forward", *, allow_fallback: bool = False,
                    fold_constants: bool = True, backend_options: Mapping[str, Any] | None = None,
                    on_backend_unavailable: str | None = None) -> Method:
        """Resolve kernels and delegates of ``name`` and return a runnable :class:`Method`.

        Raises ``UnsupportedOperatorError`` for an op without a kernel and ``BackendNotFoundError`` for a
        delegate whose backend is not installed or not available — at load, never mid-run. With
        ``allow_fallback=True`` such a delegate runs on the portable fallback the program carries for it (a
        method named by the delegate's ``edgeport.portable_fallback`` compile spec); ``method.profile`` lists
        every fallback taken.

        ``fold_constants`` runs kernel calls whose inputs are all constants (weight permutes and expands) once,
        here, instead of on every execution (``method.profile.folded_instructions`` counts them); with it, a
        repeated pure kernel call on unchanged inputs copies the earlier result, or takes it as is while it stays
        intact (``reused_calls``), math attention's fully-masked-row guard runs as one fused operation
        (``fused_calls``), and a delegate call its executor declares a mere reshape (``reshape_only``) becomes a view
        of its input (``viewed_delegates``); outputs are identical.

        ``on_backend_unavailable`` is the policy spelled out: ``"error"`` (the default) raises
        ``BackendNotFoundError`` naming the backend and how to install it; ``"portable"`` is ``allow_fallback=True``.
        Each fallback taken is a ``DelegateInfo`` with ``status="fallback"`` and its reason in ``method.profile``,
        a ``RuntimeWarning`` and a ``logging`` warning (logger ``edgeport.runtime``) — never silent.

        ``backend_options`` gives backends their runtime options, e.g. ``{"XnnpackBackend": {"num_threads": 1}}``
        (each backend's ``BackendSpec.runtime_options`` says which it takes; ``edgeport.runtime.backends()``
        lists them). A backend the program does not use, an unknown option or a wrong type raises
        ``BackendOptionsError`` before any delegate is initialised.
        """
        from edgeport.registry import kernel_registry

        allow_fallback = _fallback_policy(on_backend_unavailable, allow_fallback)
        start = time.perf_counter_ns()
        index = self._plan_index(name)
        options = resolve_backend_options(backend_options, self._backend_ids())
        kernels = self._kernels if self._kernels is not None else kernel_registry()
        init_start = time.perf_counter_ns()
        plan = MethodPlan(self, index, kernels, allow_fallback=allow_fallback,
                          fold_constants=fold_constants, backend_options=options)
        method = Method(self, plan)
        if self._etdump is not None:
            end = time.perf_counter_ns()
            self._etdump.loading_event("Method::init", init_start, end)
            self._etdump.loading_event("Program::load_method", start, end)
            method._runner.recorder = self._etdump
            method._runner.attach_delegate_tracer(plan)
        return method

    def __repr__(self) -> str:
        return f"<edgeport Program methods={sorted(self._names)}>"


_POLICIES = ("error", "portable")


def _fallback_policy(on_backend_unavailable: str | None, allow_fallback: bool) -> bool:
    """``allow_fallback`` as set by the ``on_backend_unavailable`` policy (``None``: keep ``allow_fallback``)."""
    if on_backend_unavailable is None:
        return allow_fallback
    if on_backend_unavailable not in _POLICIES:
        raise ValueError(f"on_backend_unavailable must be one of {_POLICIES}, got {on_backend_unavailable!r}")
    if on_backend_unavailable == "error" and allow_fallback:
        raise ValueError("on_backend_unavailable='error' contradicts allow_fallback=True; pass one of them")
    return on_backend_unavailable == "portable"


def _read_source(data: Any, mmap: bool, what: str) -> Any:
    """The bytes (or a read-only mmap) of a path, bytes-like object or binary file."""
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if mmap and size > 0:
                    return _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ)
                return f.read()
        except OSError as exc:
            raise ProgramError(f"cannot read {what} file {str(path)!r}: {exc}") from exc
    if isinstance(data, (bytes, bytearray, memoryview)):
        return data
    if hasattr(data, "read"):
        return data.read()
    raise TypeError(f"load_program expects a path, bytes or a binary file for the {what}, got {type(data).__name__}")


class Runtime:
    """Entry point of edgeport's torch-free runtime (``Runtime.get()`` returns the process-wide instance)."""

    _instance: Runtime | None = None
    _instance_lock = threading.Lock()

    def __init__(self, kernels: Any = None) -> None:
        self._kernels = kernels

    @staticmethod
    def get() -> Runtime:
        with Runtime._instance_lock:
            if Runtime._instance is None:
                Runtime._instance = Runtime()
            return Runtime._instance

    @property
    def operator_names(self) -> set[str]:
        """Ops that have a registered kernel."""
        from edgeport.registry import kernel_registry

        return set((self._kernels or kernel_registry()).ops())

    @property
    def backend_names(self) -> list[str]:
        from edgeport.registry import list_backends

        return [b.backend_id for b in list_backends()]

    def load_program(self, data: ProgramSource, *, mmap: bool = True, verification: bool = True,
                     data_path: ProgramSource | Sequence[ProgramSource] | None = None,
                     enable_etdump: bool = False, debug_buffer_size: int = 0) -> Program:
        """Load a program from a path (memory-mapped by default: constants stay zero-copy views of the file),
        bytes-like data or a binary file object. Every defect raises ``ProgramError``.

        ``data_path``: the ``.ptd`` data file(s) holding what the program stores outside itself (constants written
        with ``external_constants``, backends' external named data) — a path, bytes, or a list of them.

        ``enable_etdump`` (ExecuTorch's name): every method of the program records a profiling event per kernel
        and delegate call of each execution; ``program.write_etdump_result_to_file(path)`` writes them as ETDump.
        ``debug_buffer_size`` > 0 also records every kernel's and delegate call's outputs (intermediate outputs) into
        a debug buffer of up to that many bytes, written by ``write_etdump_result_to_file(..., debug_buffer_path)``.
        """
        source = _read_source(data, mmap, "program")
        loaded = load_pte(source)
        if data_path is not None:
            from edgeport.program.ptd import ExternalData, load_ptd

            items = list(data_path) if isinstance(data_path, (list, tuple)) else [data_path]
            files = []
            for i, item in enumerate(items):
                name = repr(os.fspath(item)) if isinstance(item, (str, os.PathLike)) else f"data_path[{i}]"
                files.append(load_ptd(_read_source(item, mmap, "data"), name))
            loaded.external = ExternalData(files)
        if verification:
            verify_program(loaded.program)
        recorder = None
        if enable_etdump:
            from edgeport.devtools.etdump import ETDumpRecorder

            recorder = ETDumpRecorder(debug_buffer_size)
        return Program(loaded, source, self._kernels, etdump=recorder)


class LoadedProgram:
    """What :func:`load` returns: every method is an attribute (``m.forward(x)``) or an item (``m["forward"]``)."""

    def __init__(self, program: Program, allow_fallback: bool = False,
                 backend_options: Mapping[str, Any] | None = None) -> None:
        self.program = program
        self._allow_fallback = allow_fallback
        self._backend_options = backend_options
        self._methods: dict[str, Method] = {}
        self._lock = threading.Lock()

    @property
    def method_names(self) -> set[str]:
        return self.program.method_names

    def __getitem__(self, name: str) -> Method:
        with self._lock:
            m = self._methods.get(name)
            if m is None:
                m = self._methods[name] = self.program.load_method(name, allow_fallback=self._allow_fallback,
                                                                   backend_options=self._backend_options)
            return m

    def __getattr__(self, name: str) -> Method:
        if name.startswith("_") or name not in self.__dict__.get("program").method_names:
            raise AttributeError(name)
        return self[name]

    def __call__(self, *inputs: Any) -> list[Any]:
        return self["forward"].execute(inputs)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | self.method_names)

    def __repr__(self) -> str:
        return f"<edgeport program methods={sorted(self.method_names)}>"


def load(path_or_bytes: ProgramSource, *, allow_fallback: bool = False, mmap: bool = True,
         backend_options: Mapping[str, Any] | None = None, on_backend_unavailable: str | None = None) -> LoadedProgram:
    """Load a ``.pte`` and return an object whose methods are callables: ``edgeport.load(p).forward(x)``
    (or ``edgeport.load(p)(x)`` for ``forward``); each returns a list of numpy arrays. ``backend_options`` as
    for :meth:`Program.load_method`, checked here against the program's backends; ``on_backend_unavailable``
    (``"error"`` or ``"portable"``) as for :meth:`Program.load_method`."""
    allow_fallback = _fallback_policy(on_backend_unavailable, allow_fallback)
    program = Runtime.get().load_program(path_or_bytes, mmap=mmap)
    resolve_backend_options(backend_options, program._backend_ids())
    return LoadedProgram(program, allow_fallback, backend_options)
