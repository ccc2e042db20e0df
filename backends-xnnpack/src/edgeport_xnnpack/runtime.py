"""``XnnpackExecutor``: runs XNNPACK delegate blobs (edgeport's and ExecuTorch's) on libXNNPACK. Torch-free.

``init`` reads and checks the blob (any malformation -> :class:`~edgeport.errors.ProgramError`) and plans it
(:mod:`edgeport_xnnpack._planner`, :mod:`edgeport_xnnpack._plan`): each node runs in a native XNNPACK subgraph/runtime, in a numpy host segment
(nodes this libXNNPACK lacks: batch matrix multiply, slice, concatenate, ...; reshapes, transposes and slices
there are free views) or, for 2-D transposes such as NCHW <-> NHWC, on XNNPACK's channel-shuffle operator; the
nodes are reordered (dependencies kept) so that each kind clusters into few steps. Values crossing a step get a
padded buffer allocated once. Constants are read-only views of the blob or the program's named data (no copy);
XNNPACK packs most when a runtime is created, the few it keeps pointers to are copied per runtime. The views
stay referenced for re-specializing (below). ``execute(handle, inputs, out=None)`` binds the
caller's arrays and the ``out`` arrays (or fresh ones) without copying them, re-runs XNNPACK's setup only when
a bound pointer changed, and keeps no reference to them afterwards -- except a host segment that got the same
arrays twice in a row: it keeps views of them to replay its kernels on (:mod:`edgeport_xnnpack._replay`) until
a call with other arrays or ``destroy``. ``destroy`` frees every native object.

Dynamic shapes: a blob declares upper-bound dims. Inputs smaller in some dims run on a *specialization* for
their shapes (:mod:`edgeport_xnnpack._specialize`): every value's dims are inferred and the same planning and
subgraph definition run at those dims; a small LRU cache keeps the last few. Float32 fully connected layers run on
operators packed once and shared by every specialization (:mod:`edgeport_xnnpack._fc_ops`); the weights of other
native nodes (convolutions) are packed again per specialization. A delegate whose ``static_shapes`` compile spec
is ``true`` (no dynamic dims when it was partitioned) keeps its fully connected nodes inside its native runtimes:
faster at its one shape, and still correct (re-packed per specialization) if called at others.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edgeport.backend import CompileSpec, RuntimeExecutor
from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport_xnnpack import _fc_ops, native
from edgeport_xnnpack._call import input_arrays, results_for
from edgeport_xnnpack._constants import NamedData
from edgeport_xnnpack._direct import direct_call
from edgeport_xnnpack._dynamic_quant import (
    dequantize_dynamic_filters,
    emulate_dynamic_values,
    host_dynamic_products,
)
from edgeport_xnnpack._host_gemm import describe, resolve
from edgeport_xnnpack._host_qd8 import kernel_available as qd8_available
from edgeport_xnnpack._planner import Planner, fail
from edgeport_xnnpack._rewrite_int8 import rewrite_int8
from edgeport_xnnpack._specialize import Plan, Specializer, specializations_from_env
from edgeport_xnnpack._steps import HostStep, NativeStep, ShuffleStep, XnnpackHandle
from edgeport_xnnpack.capabilities import BACKEND_ID
from edgeport_xnnpack.options import XnnpackCompileOptions, XnnpackRuntimeOptions
from edgeport_xnnpack.schema.graph import (
    QBINT4,
)
from edgeport_xnnpack.schema.reader import BlobError, read_blob

_F32 = np.dtype(np.float32)


def load(processed: Any, compile_specs: Sequence[CompileSpec] = (), named_data: NamedData | None = None,
         num_threads: int | None = None, max_specializations: int | None = None,
         fully_connected: str = "auto") -> XnnpackHandle:
    """Parse, check and build a blob (the body of :meth:`XnnpackExecutor.init`); ``fully_connected``: where
    float32 fully-connected layers and 1x1 convolutions run (see ``_host_gemm``)."""
    try:
        options = XnnpackCompileOptions.from_compile_specs(list(compile_specs))
    except ValueError as exc:
        raise ProgramError(f"{BACKEND_ID}: {exc}") from exc
    capacity = specializations_from_env(max_specializations)
    try:
        lib = native.library()
    except native.XnnpackError as exc:
        raise RuntimeExecutionError(f"{BACKEND_ID}: {exc}") from exc
    try:
        graph, constants = read_blob(processed)
    except (BlobError, TypeError) as exc:
        raise fail(str(exc)) from exc
    try:  # qdint8 (dynamic int8) values: float32 values holding the dequantized numbers, see _dynamic_quant
        dynamic = emulate_dynamic_values(graph)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    planner = Planner(graph, constants, named_data, lib)
    # shared operators suit delegates that specialize for other input shapes (LLM prefill + decode); a delegate
    # hinted static (``static_shapes``, written by XnnpackPartitioner) keeps them inside its native runtimes
    planner.fc_operators = _fc_ops.available() and not options.static_shapes
    inputs, outputs = planner.check_values()
    try:  # qint8 x qcint8 fully connected -> 1x1 convolution; int8 transposes (see _rewrite_int8)
        rewrite_int8(graph, planner.values, planner.dims, planner.const)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    planner.check_nodes(inputs)
    try:
        planner.products = resolve(fully_connected)
    except ValueError as exc:
        raise RuntimeExecutionError(f"{BACKEND_ID}: {exc}") from exc
    held: set[int] = set()
    if dynamic:
        try:
            if fully_connected != "xnnpack" and qd8_available():  # "xnnpack": XNNPACK's float32 kernels
                held = host_dynamic_products(graph, dynamic, planner.values, planner.const, planner.group_scales)
            dequantize_dynamic_filters(graph, dynamic, planner.values, planner.const, planner.group_scales)
        except ValueError as exc:
            raise fail(str(exc)) from exc
    if any(v.datatype == QBINT4 and vid not in held for vid, v in planner.values.items()):
        raise fail("a qbint4 filter is read by a node other than a fully connected over a qdint8 input; this "
                    "executor runs blockwise 4-bit weights only in dynamically quantized fully connected nodes")
    threads = num_threads or options.num_threads
    pool = native.shared_pools.acquire(threads) if threads != 1 else None
    ins, outs = [(i, planner.dims[i]) for i in inputs], [(o, planner.dims[o]) for o in outputs]
    steps: list[NativeStep | HostStep | ShuffleStep] = []
    try:
        steps, buffers = planner.plan(inputs, outputs, pool)
        direct = direct_call(ins, outs, steps, buffers)
    except BaseException:
        for step in steps:
            step.close()
        planner.close_shared()
        if pool is not None:
            native.shared_pools.release(pool)
        raise
    summary = {"native_steps": sum(isinstance(s, NativeStep) for s in steps),
               "host_steps": sum(isinstance(s, HostStep) for s in steps),
               "operator_steps": sum(isinstance(s, (ShuffleStep, _fc_ops.FullyConnectedStep)) for s in steps),
               "nodes": len(graph.nodes),
               "fully_connected": describe(planner.products)}
    base = dict(planner.dims)

    def build(dims: dict[int, tuple[int, ...]]) -> tuple[list, dict]:
        planner.dims = dims  # the same planning and subgraph definition as above, at other dims
        try:
            return planner.plan(inputs, outputs, pool)
        finally:
            planner.dims = base

    slots = [planner.values[i].external_id for i in inputs]
    n_args = graph.num_externs - len(outputs)
    specializer = Specializer(graph.nodes, base, ins, outs, build, capacity, on_close=planner.close_shared)
    return XnnpackHandle(ins, outs, steps, buffers, pool, summary, direct=direct, n_args=n_args,
                         arg_slots=None if slots == list(range(n_args)) else tuple(slots), specializer=specializer)


class XnnpackExecutor(RuntimeExecutor):
    """Runtime executor of ``XnnpackBackend`` (see the module docstring). ``max_specializations``: input-shape
    specializations kept per delegate (default ``$EDGEPORT_XNNPACK_SPECIALIZATIONS`` or 8; 0: only the declared
    shapes run)."""

    thread_safe = True  # execute serializes the runs of its handles under its own lock
    pure = True  # no state: the same inputs give the same outputs (the runtime folds calls on constants at load)

    def __init__(self, num_threads: int | None = None, max_specializations: int | None = None) -> None:
        self.num_threads = num_threads
        self.max_specializations = max_specializations
        self._lock = threading.Lock()

    def is_available(self) -> tuple[bool, str]:
        return native.is_available()

    def init(self, processed: memoryview, compile_specs: Sequence[CompileSpec] = (), *,
             named_data: NamedData | None = None,
             runtime_options: XnnpackRuntimeOptions | None = None) -> XnnpackHandle:
        threads = self.num_threads
        if runtime_options is not None and runtime_options.num_threads:
            threads = runtime_options.num_threads
        fully_connected = runtime_options.fully_connected if runtime_options is not None else "auto"
        return load(processed, compile_specs, named_data, threads, self.max_specializations, fully_connected)

    def num_outputs(self, handle: XnnpackHandle) -> int:
        """Outputs of the delegate (its trailing call arguments): the blob says, so a call whose inputs include
        state (a mutable buffer the program planned) is split into inputs and outputs without guessing."""
        if type(handle) is not XnnpackHandle:
            raise RuntimeExecutionError(f"{BACKEND_ID}: num_outputs needs a handle from init")
        return len(handle.outputs)

    def reshape_only(self, handle: XnnpackHandle) -> bool:
        """True when the delegate is one reshape (``XnnpackHandle.reshape_only``: one input, one output of as many
        elements, one host step of reshapes between them); the core runtime may then run its calls as views."""
        return type(handle) is XnnpackHandle and handle.reshape_only()

    def direct_execute(self, handle: XnnpackHandle) -> Callable[[list[Any], list[np.ndarray]], bool] | None:
        """The core's per-call shortcut (``RuntimeExecutor.direct_execute``): the delegate's direct call when it
        has one and takes the inputs as given; ``run(inputs, outs)`` is ``False`` (nothing written) whenever
        :meth:`execute` would not take the direct call -- destroyed handle, a tracer, arrays it refuses."""
        if type(handle) is not XnnpackHandle or handle.direct is None or handle.arg_slots is not None:
            return None
        lock, n_args = self._lock, handle.n_args

        def run(inputs: list[Any], outs: list[np.ndarray]) -> bool:
            if len(inputs) != n_args:
                return False
            with lock:
                direct = handle.direct
                if not handle.alive or direct is None or handle.tracer is not None:
                    return False
                try:
                    direct(inputs, outs)
                except (ValueError, native.XnnpackError):
                    return False  # execute's general path converts, specializes, or raises the precise error
                return True
        return run

    def execute(self, handle: XnnpackHandle, inputs: Sequence[Any],
                out: Sequence[np.ndarray | None] | None = None) -> list[np.ndarray]:
        """Run the delegate. ``out`` (optional): one entry per output, a writable C-contiguous float32 array of
        the output's shape to compute into, or ``None``; the returned list holds those same arrays (it is ``out``
        itself when ``out`` is a list without ``None`` entries). Inputs smaller than declared in some dims run
        on a specialization for their shapes (see :mod:`edgeport_xnnpack._specialize`); their outputs have the
        shapes that follow (``out`` entries for them are ``None`` or arrays of those shapes)."""
        if type(handle) is not XnnpackHandle or not handle.alive:
            raise RuntimeExecutionError(f"{BACKEND_ID}: execute needs a live handle from init")
        if len(inputs) != handle.n_args:
            raise RuntimeExecutionError(f"{BACKEND_ID}: expected {handle.n_args} inputs, got {len(inputs)}")
        if handle.arg_slots is not None:  # non-tensor arguments (symbolic sizes) are not read
            inputs = [inputs[k] for k in handle.arg_slots]
        direct = handle.direct
        tracer = handle.tracer
        if tracer is not None:
            direct = None  # step by step, timing each step
        full = type(out) is list  # out holds no None entry (the direct call would refuse it)
        if full:
            for a in out:  # type: ignore[union-attr]
                if a is None:
                    full = False
                    break
        if direct is not None and full:
            with self._lock:
                if not handle.alive:  # destroyed meanwhile (destroy takes this lock)
                    raise RuntimeExecutionError(f"{BACKEND_ID}: execute needs a live handle from init")
                try:
                    direct(inputs, out)
                    return out
                except (ValueError, native.XnnpackError):
                    pass  # the general path below converts what it can, specializes, or raises the precise error
        if tracer is None and (out is None or type(out) is list):
            tried = direct is not None and full  # just refused
            results = self._known_shapes(handle, inputs, out, skip_declared=tried)
            if results is not None:
                return results
        arrays, declared = input_arrays(handle, inputs)
        step = None
        with self._lock:
            if not handle.alive:
                raise RuntimeExecutionError(f"{BACKEND_ID}: execute needs a live handle from init")
            plan: XnnpackHandle | Plan = handle
            if not declared:
                plan = handle.specializer.plan_for([a.shape for a in arrays])
            results = results_for(plan, out)
            env = dict(plan.buffers)  # per call: no reference to the caller's arrays outlives it
            for (vid, _), a in zip(plan.inputs, arrays):
                env[vid] = a
            for (vid, _), r in zip(plan.outputs, results):
                env[vid] = r
            try:
                if tracer is None:
                    for step in plan.steps:
                        step.run(env)
                else:
                    for k, step in enumerate(plan.steps):
                        start = tracer.now_ns()
                        step.run(env)
                        tracer.log_profiling_delegate(step.label, step.event_id or f"step {k}: {step.label}", start,
                                                      tracer.now_ns(), debug_handles=step.debug_handles)
            except (native.XnnpackError, ValueError) as exc:
                label = step.label if step is not None else "?"
                raise RuntimeExecutionError(f"{BACKEND_ID}: {label} failed: {exc}") from exc
        return results

    def _known_shapes(self, handle: XnnpackHandle, inputs: Sequence[Any], out: list[Any] | None,
                      skip_declared: bool) -> list[np.ndarray] | None:
        """The direct call of a cached specialization whose input shapes these are (or of the declared shapes when
        ``out`` has ``None`` entries), outputs from ``results_for`` as on the general path; ``None`` when it does
        not apply or refuses the arrays (the general path then converts, specializes or raises).

        When every ``out`` entry is ``None`` the outputs are fresh arrays of the plan's dims, as ``results_for``
        makes (a decode step: the specializer's repeated lookup is cheap too, see ``Specializer.known``)."""
        key = []
        for a in inputs:
            if type(a) is not np.ndarray:
                return None
            key.append(a.shape)
        shapes = tuple(key)
        with self._lock:
            if not handle.alive:
                raise RuntimeExecutionError(f"{BACKEND_ID}: execute needs a live handle from init")
            plan: XnnpackHandle | Plan | None
            if shapes == handle.declared:
                plan, call = handle, None if skip_declared else handle.direct
            else:
                plan = handle.specializer.known(shapes)
                call = plan.direct if plan is not None else None
            if call is None:
                return None
            dims = plan.out_dims
            fresh = out is None or len(out) == len(dims)
            if fresh and out is not None:
                for a in out:
                    if a is not None:
                        fresh = False
                        break
            if fresh:
                results = [np.empty(d, _F32) for d in dims]
            else:
                try:
                    results = results_for(plan, out)
                except RuntimeExecutionError:
                    return None  # the general path raises it after checking the inputs
            try:
                call(inputs, results)
            except (ValueError, native.XnnpackError):
                return None
        return results

    def set_event_tracer(self, handle: XnnpackHandle, tracer: Any) -> None:
        """While ``tracer`` is set (the program records an ETDump), each call reports every step -- a native
        XNNPACK runtime, a numpy host segment, a channel shuffle -- as a delegate sub-event named by its label
        (delegate debug id ``"step K: <label>"``, or for a step of one blob node the id ExecuTorch's XNNPACK
        delegate reports that node's operator under), with the debug handles of the edge nodes it carries out. The
        2022 library has no per-operator profiling, so a step is the finest unit timed. ``None`` turns it off."""
        if isinstance(handle, XnnpackHandle):
            handle.tracer = tracer

    def destroy(self, handle: XnnpackHandle) -> None:
        if not isinstance(handle, XnnpackHandle):
            return
        with self._lock:  # never under a running call of this executor
            if not handle.alive:
                return
            handle.alive = False
            handle.direct = None
            for step in handle.steps:
                step.close()
            handle.steps, handle.buffers = [], {}
            handle.specializer.close()
            if handle.pool is not None:
                native.shared_pools.release(handle.pool)
                handle.pool = None
