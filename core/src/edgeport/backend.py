"""The data types of the backend contract: compile specs, delegation specs, capabilities, backend specs.

Names and meaning follow ExecuTorch's AOT API (``CompileSpec``, ``DelegationSpec``, ``PreprocessResult``) so
that people who know ExecuTorch read edgeport code without a dictionary.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # pragma: no cover
    from edgeport.aot.partitioner import Partitioner


PORTABLE_FALLBACK_SPEC = "edgeport.portable_fallback"
"""Compile-spec key the writer adds to a delegate when the program carries a portable fallback for it; its
value is the UTF-8 name of the method that computes the same outputs from the same inputs with portable ops."""


@dataclass(frozen=True)
class CompileSpec:
    """One backend-specific option, as a key and raw bytes (ExecuTorch's ``CompileSpec``)."""

    key: str
    value: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.key, str):
            raise TypeError(f"CompileSpec.key must be str, got {type(self.key).__name__}")
        if not isinstance(self.value, (bytes, bytearray)):
            raise TypeError(
                f"CompileSpec {self.key!r}: value must be bytes, got {type(self.value).__name__}; "
                "encode it, e.g. str(v).encode() or struct.pack(...)"
            )


class DelegationSpec(NamedTuple):
    """Which backend a tagged partition goes to, and with which compile specs."""

    backend_id: str
    compile_specs: list[CompileSpec]


@dataclass
class PreprocessResult:
    """What a backend's ``preprocess`` returns: the blob stored in the program, and debug data."""

    processed_bytes: bytes = b""
    debug_handle_map: dict[int | str, tuple[int, ...]] | None = None
    data_store_output: Any = None
    constant_inputs: tuple[Any, ...] = ()
    """Tensors the blob reads at run time by pointer: the program stores each as a constant tensor and passes
    them to the delegate call after the partition's own inputs (runtimes keep constant tensors alive for the
    program's life, while ExecuTorch 1.3.1 frees a delegate's named data after ``init``)."""


@dataclass(frozen=True)
class OpCapability:
    """One row of a backend's capability table.

    ``op`` is a core-ATen overload name as ``str(torch.ops.aten.add.Tensor)`` prints it (``"aten.add.Tensor"``).
    ``dtypes`` lists the torch dtype names accepted for the op's tensor inputs and outputs (``"float32"``).
    ``constraint`` optionally inspects an ``torch.fx.Node`` and returns ``None`` when supported, else a reason.
    """

    op: str
    dtypes: tuple[str, ...] = ("float32",)
    constraint: Callable[[Any], str | None] | None = None
    notes: str = ""


@dataclass(frozen=True)
class CapabilityTable:
    """A backend's claimed operators; drives its partitioner, the conformance tests and the docs' op table."""

    ops: tuple[OpCapability, ...]

    def lookup(self, op: str) -> OpCapability | None:
        for cap in self.ops:
            if cap.op == op:
                return cap
        return None

    @property
    def op_names(self) -> list[str]:
        return [cap.op for cap in self.ops]


@dataclass
class CompileOptions:
    """Base class of a backend's typed compile options; converts to and from ``List[CompileSpec]``.

    Subclasses declare dataclass fields of JSON-encodable types. Each field becomes one ``CompileSpec`` whose
    value is the field's JSON encoding.
    """

    def to_compile_specs(self) -> list[CompileSpec]:
        return [
            CompileSpec(f.name, json.dumps(getattr(self, f.name)).encode())
            for f in dataclasses.fields(self)
        ]

    @classmethod
    def from_compile_specs(cls, specs: Sequence[CompileSpec]) -> CompileOptions:
        known = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for spec in specs:
            if spec.key not in known:
                raise ValueError(
                    f"{cls.__name__}: unknown compile spec {spec.key!r}; known keys: {sorted(known)}"
                )
            try:
                values[spec.key] = json.loads(bytes(spec.value).decode())
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{cls.__name__}: compile spec {spec.key!r} is not JSON: {exc}") from exc
        return cls(**values)


@dataclass
class RuntimeOptions:
    """Base class of a backend's typed runtime options, given per backend when a method is loaded.

    Subclasses declare dataclass fields with defaults (``num_threads: int = 0``). The runtime builds one with
    :meth:`from_mapping` from ``load_method(name, backend_options={"<backend_id>": {...}})`` and passes it to
    the executor's ``init`` as ``runtime_options=`` when ``init`` declares that parameter. Unlike compile
    options, runtime options are not stored in the program: they describe the machine the program runs on
    (threads, device, compute unit), not the program.
    """

    @classmethod
    def from_mapping(cls, values: Any) -> RuntimeOptions:
        """Options from a ``{name: value}`` mapping; unknown names and wrong types raise ``ValueError``."""
        if isinstance(values, cls):
            return values
        if not isinstance(values, dict):
            raise ValueError(f"{cls.__name__}: expected a dict of option values, got {type(values).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in values.items():
            if name not in fields:
                raise ValueError(f"{cls.__name__}: unknown runtime option {name!r}; known options: {sorted(fields)}")
            _check_option_type(cls.__name__, name, fields[name], value)
        return cls(**values)


def _check_option_type(owner: str, name: str, f: dataclasses.Field, value: Any) -> None:
    default = f.default if f.default is not dataclasses.MISSING else None
    if default is None or value is None:
        return
    expected = type(default)
    ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise ValueError(
            f"{owner}: runtime option {name!r} must be {expected.__name__}, got {type(value).__name__} {value!r}"
        )


class RuntimeExecutor:
    """Interface of a backend's runtime executor (documented here; backends subclass or duck-type it).

    ``init`` receives the processed bytes as a memoryview and the compile specs and returns an opaque handle;
    ``execute`` takes the handle and a list of numpy arrays and returns a list of numpy arrays; ``destroy``
    releases the handle. It is called once per delegate at method load, not per run.

    ``execute`` must not write its inputs: they may be the caller's own arrays (a method input that only
    delegates read is passed as given, without a copy), read-only, or views into planned memory. An input has
    the dtype and shape the program declares but need not be C-contiguous or aligned (copy it, e.g. with
    ``np.ascontiguousarray``, when the library needs that).

    Optional parts the runtime honours:

    * ``init(processed, compile_specs, named_data=lookup)`` — when ``init`` accepts ``named_data``, it gets a
      ``key -> memoryview`` lookup into the program's named-data segments (where XNNPACK keeps weights);
    * ``describe_execution(handle) -> str`` — what actually executes the delegate, shown in the method profile
      (``DelegateInfo.execution``); say so when a reference model or emulator stands in for the hardware;
    * ``num_outputs(handle) -> int`` — how many trailing arguments of the delegate call are outputs (otherwise
      the runtime infers it from what the program defines);
    * ``set_event_tracer(handle, tracer)`` — called after ``init`` when the program records an ETDump
      (``enable_etdump=True``); during ``execute`` the executor reports the steps it can time with
      ``tracer.log_profiling_delegate(name, delegate_debug_id, start_ns, end_ns, debug_handles=...)`` (clock:
      ``tracer.now_ns()``), and they appear as delegate sub-events of the call (see
      :class:`edgeport.devtools.etdump.DelegateEventTracer`). Without it the call is still timed as a whole;
    * ``thread_safe = True`` — ``execute`` may run concurrently on one handle (otherwise calls are serialized
      under a per-delegate lock);
    * ``pure = True`` — ``execute`` keeps no state between calls and gives the same outputs for the same inputs;
      with ``num_outputs``, a call whose inputs are all constants then runs once at load and its outputs
      become constants (constant folding; e.g. rotary-embedding tables and attention masks);
    * ``reshape_only(handle) -> bool`` — with ``num_outputs``: true when the delegate has one tensor input and
      one output of the same dtype and size holding the input's elements in C order (a lone reshape, e.g.
      XNNPACK's static reshape). The runtime may then skip the call and give the output's slot a view of the
      input's memory, where that view reads what the call would have written (see ``edgeport.runtime._views``);
    * ``execute(handle, inputs, out=outs)`` — destination passing. When ``execute`` declares a parameter named
      ``out`` (a bare ``**kwargs`` does not count), every call passes ``outs``, a list with one entry per
      delegate output: the array the runtime planned for that output in the current run (writable,
      C-contiguous, of the declared dtype and shape, sharing no memory with any input or other output of the
      call), or ``None`` where the output is not a statically planned tensor (dynamic shape, not planned, not a
      tensor) or where writing it directly would not be safe. The executor writes each result into its given
      array and returns that same object in its place (the runtime then copies nothing); for a ``None`` entry
      it returns a fresh array as usual. Returning another array for a given entry is allowed (it is copied in,
      after a shape check). The arrays belong to the runtime: do not keep them past the call.
    * ``direct_execute(handle) -> run | None`` — with destination passing: a callable the runtime may call
      instead of ``execute`` when every output has its planned array, ``run(inputs, outs) -> bool`` (the same
      lists ``execute`` would get, ``outs`` without ``None``). It computes into ``outs`` and returns ``True``,
      or returns ``False`` having written nothing the caller relies on (it cannot take this call: other arrays,
      a tracer set, a destroyed handle), and the runtime calls ``execute`` as usual. Asked once per call site
      at load (``None``: never); it saves the per-call checks ``execute`` repeats (a few hundred ns per call).
    """

    thread_safe: bool = False
    pure: bool = False

    def is_available(self) -> tuple[bool, str]:
        return True, ""

    def init(self, processed: memoryview, compile_specs: Sequence[CompileSpec]) -> Any:
        raise NotImplementedError

    def execute(self, handle: Any, inputs: Sequence[Any]) -> list[Any]:  # optionally: out=None (see above)
        raise NotImplementedError

    def destroy(self, handle: Any) -> None:
        return None


@dataclass
class BackendSpec:
    """Everything a plugin registers for one backend.

    ``backend_id`` is the one stable string used in partition tags, ``DelegationSpec``, the serialized
    ``BackendDelegate.id`` and the runtime lookup. Factories are called lazily so that registering a backend
    never imports its SDK.
    """

    backend_id: str
    version: str
    preprocess: Callable[..., PreprocessResult]
    partitioner: Callable[..., Partitioner] | None = None
    executor: Callable[[], RuntimeExecutor] | None = None
    quantizers: dict[str, Callable[..., Any]] = field(default_factory=dict)
    capabilities: Callable[[], CapabilityTable] | None = None
    compile_options: type[CompileOptions] | None = None
    is_available: Callable[[], tuple[bool, str]] = lambda: (True, "")
    description: str = ""
    runtime_options: type[RuntimeOptions] | None = None
    # processed bytes -> a JSON-able description (format/producer version, target, op counts, tensor bytes,
    # compile options); shown by ``edgeport inspect``. Must not crash on bad bytes: raise ValueError instead.
    # When it declares a ``named_data`` parameter it also gets the program's ``key -> memoryview`` lookup.
    describe_blob: Callable[[bytes | memoryview], dict[str, Any]] | None = None
    distribution: str | None = None  # filled in by the registry for entry-point plugins
    # ``sys.platform`` values the executor can run on; empty: any. Elsewhere the backend still lowers, and
    # ``edgeport doctor`` reports it as "lowering only on this platform" rather than as a problem.
    execution_platforms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.backend_id or not isinstance(self.backend_id, str):
            raise ValueError("BackendSpec.backend_id must be a non-empty string")
        if not callable(self.preprocess):
            raise TypeError(f"BackendSpec {self.backend_id!r}: preprocess must be callable")
