"""Running a compiled method: the execute loop over its operation lists, with a pool of execution contexts.

    for fn, get, post in ops:
        r = fn(*get(vals))          # get is an operator.itemgetter over the value slots
        if post is not None:
            post(vals, r)           # only where a result must be stored (dynamic shapes, scalars, delegates)

Thread safety: a context (arenas + value slots) is used by one run at a time; :class:`MethodRunner` keeps a pool
of them, so concurrent ``execute`` calls each run in their own planned memory. A method with state (a planned
buffer read before it is written, e.g. mutated buffers written back with ``aten::copy_``) has a single context
and its runs take turns under a lock, so the state carries from run to run as in ExecuTorch.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport.runtime._compile import JUMP, _vals_only
from edgeport.runtime._memory import Context

if TYPE_CHECKING:
    from edgeport.runtime._method import MethodPlan

__all__ = ["MAX_STEPS", "MethodRunner"]

#: Upper bound on instructions executed in one run of a method with jumps (guards against endless loops).
MAX_STEPS = 50_000_000

_clock = time.perf_counter
_ndarray = np.ndarray

try:  # numpy's floating-point error state is a context variable: set it directly (np.errstate costs ~1.5 us a run)
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj

    _QUIET: Any = _make_extobj(all="ignore")
except Exception:  # noqa: BLE001 - another numpy: np.errstate below
    _extobj_contextvar = None


_LABEL = re.compile(r"chains\[\d+\]\.instructions\[(\d+)\](?: \((.*)\))?$")


class MethodRunner:
    """Runs a :class:`~edgeport.runtime._method.MethodPlan`; a pool of execution contexts makes concurrent runs
    safe. With ``time_ops`` set, each run adds its per-op wall time to the plan's profile."""

    def __init__(self, plan: MethodPlan, max_idle_contexts: int = 8) -> None:
        self.plan = plan
        self._pool: list[Context] = []
        self._max_idle = 1 if plan.stateful else max_idle_contexts
        self._state_lock = threading.Lock()
        try:  # allocate the first context now, so that unsatisfiable memory fails at load, not mid-run
            self._pool.append(plan.new_context())
        except RuntimeExecutionError as exc:
            raise ProgramError(str(exc)) from exc
        self.time_ops = False
        #: an ``edgeport.devtools.etdump.ETDumpRecorder`` when the program was loaded with ``enable_etdump=True``
        self.recorder: Any = None
        #: an ``edgeport.devtools.etdump.DelegateEventTracer`` given to executors that report sub-events
        self.delegate_tracer: Any = None
        self._trace_names: list[list[tuple[int, str | None]]] | None = None
        #: output slots; ``_one_output`` is the slot of a method's only output, else -1
        self._outputs = tuple(plan.output_indices)
        self._one_output = self._outputs[0] if len(self._outputs) == 1 else -1
        #: how the only output is copied: a statically planned tensor in contiguous dim order is a C-contiguous view,
        #: copied as such; anything else keeps its layout (np.array's order "K")
        sp = plan._layout.mv.specs.get(self._one_output)
        static = sp is not None and sp.mem_id and not sp.dynamic and sp.contiguous_order
        self._copy_one = _ndarray.copy if static else np.array
        #: a method whose only operation is one call of its arguments (a fully delegated method): run it directly
        self._fast = None
        if len(plan.chains) == 1 and not plan.chains[0][1] and len(plan.chains[0][0]) == 1:
            fn, get, post = plan.chains[0][0][0]
            if get is _vals_only and post is None and not plan.uses_kernels:
                self._fast = fn

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """Run the method (its callers may call ``_run`` directly for a method without state)."""
        if self.plan.stateful:
            # one set of planned memory holds the method's state: runs take turns
            with self._state_lock:
                return self._run(inputs)
        return self._run(inputs)

    def _run(self, inputs: Sequence[Any]) -> list[Any]:
        plan = self.plan
        binders = plan.binders
        if len(inputs) != len(binders):
            raise RuntimeExecutionError(f"{plan.where}: expected {len(binders)} inputs, got {len(inputs)}")
        t0 = _clock()
        pool = self._pool
        try:
            ctx = pool.pop()
        except IndexError:
            ctx = plan.new_context()
        vals = ctx.vals
        try:
            if len(binders) == 1:
                binders[0](vals, inputs[0])
            else:
                for bind, x in zip(binders, inputs):
                    bind(vals, x)
            fast = self._fast
            if fast is not None and not self.time_ops and self.recorder is None:
                try:
                    fast(vals)
                except Exception as exc:
                    raise self._wrap(exc, plan.chains[0][2], 0) from exc
            elif plan.uses_kernels:  # kernels run with numpy's floating-point warnings off
                if _extobj_contextvar is not None:
                    token = _extobj_contextvar.set(_QUIET)
                    try:
                        self._run_chains(plan, vals)
                    finally:
                        _extobj_contextvar.reset(token)
                else:
                    with np.errstate(all="ignore"):
                        self._run_chains(plan, vals)
            else:
                self._run_chains(plan, vals)
            # copies: the context (and its arenas) goes back to the pool for the next run
            if self._one_output >= 0:
                v = vals[self._one_output]
                outs = [self._copy_one(v) if type(v) is _ndarray else np.array(v) if isinstance(v, _ndarray) else v]
            else:
                outs = [np.array(v) if isinstance(v, _ndarray) else v for v in map(vals.__getitem__, self._outputs)]
        finally:
            for i in plan.borrowed:  # hold no reference to the caller's arrays between runs
                vals[i] = None
            if len(pool) < self._max_idle:
                pool.append(ctx)
        prof = plan.profile
        prof.runs += 1
        prof.last_run_seconds = _clock() - t0
        return outs

    def prepare(self, inputs: Sequence[Any]) -> None:
        """Run the method once on ``inputs`` for the one-time work of their shapes (e.g. delegates specializing
        for a shape they have not seen) and throw the results away: nothing is recorded or counted, and the
        method's state is left as it was. Before the first run of a method with state, the run happens in its own
        memory, which then starts again from the initial values (so no second copy of the state is needed);
        after that, and for methods without state, in memory of its own."""
        plan = self.plan
        binders = plan.binders
        if len(inputs) != len(binders):
            raise RuntimeExecutionError(f"{plan.where}: expected {len(binders)} inputs, got {len(inputs)}")
        with self._state_lock:
            own = plan.stateful and plan.profile.runs == 0 and bool(self._pool)
            ctx = self._pool.pop() if own else plan.new_context()
            vals = ctx.vals
            try:
                for bind, x in zip(binders, inputs):
                    bind(vals, x)
                with np.errstate(all="ignore"):
                    for ops, has_jump, labels in plan.chains:
                        if has_jump:
                            self._run_with_jumps(ops, labels, vals)
                        else:
                            self._run_ops(ops, labels, vals)
            finally:
                del vals, ctx  # the state touched by this run goes away before fresh memory is allocated
                if own:
                    self._pool.append(plan.new_context())

    def _run_chains(self, plan: MethodPlan, vals: list) -> None:
        if self.recorder is not None:
            self._run_traced(plan, vals)
            return
        for ops, has_jump, labels in plan.chains:
            if self.time_ops and not has_jump:
                self._run_timed(ops, labels, vals)
                continue
            if has_jump:
                self._run_with_jumps(ops, labels, vals)
                continue
            self._run_ops(ops, labels, vals)

    def _run_ops(self, ops: list[tuple], labels: list[str], vals: list) -> None:
        i = -1
        try:
            for i, (fn, get, post) in enumerate(ops):  # noqa: B007 - i names the failing op
                r = fn(*get(vals))
                if post is not None:
                    post(vals, r)
        except Exception as exc:
            raise self._wrap(exc, labels, i) from exc

    def _run_timed(self, ops: list[tuple], labels: list[str], vals: list) -> None:
        prof = self.plan.profile
        secs, calls = prof.op_seconds, prof.op_calls
        clock = time.perf_counter
        i = -1
        try:
            for i, (fn, get, post) in enumerate(ops):  # noqa: B007
                t = clock()
                r = fn(*get(vals))
                if post is not None:
                    post(vals, r)
                dt = clock() - t
                label = labels[i]
                key = label[label.find("(") + 1:-1] if "(" in label else label
                secs[key] = secs.get(key, 0.0) + dt
                calls[key] = calls.get(key, 0) + 1
        except Exception as exc:
            raise self._wrap(exc, labels, i) from exc

    def _trace_plan(self, plan: MethodPlan) -> list[list[tuple[int, str | None]]]:
        """Per chain, per op: its instruction index and the event name (``None``: no event of its own)."""
        if self._trace_names is None:
            names = []
            for _ops, _, labels in plan.chains:
                per_op = []
                for label in labels:
                    m = _LABEL.match(label)
                    instr, what = (int(m.group(1)), m.group(2)) if m else (-1, None)
                    if what is None or what in ("move", "free", "jump_false"):
                        per_op.append((instr, None))
                    elif what.startswith("delegate "):
                        per_op.append((instr, "DELEGATE_CALL"))
                    else:
                        per_op.append((instr, what.split("::", 1)[-1]))
                names.append(per_op)
            self._trace_names = names
        return self._trace_names

    def attach_delegate_tracer(self, plan: MethodPlan) -> None:
        """Give every backend delegate whose executor has ``set_event_tracer`` the method's tracer (the program
        records an ETDump); its sub-events then land inside each recorded run."""
        from edgeport.devtools.etdump import DelegateEventTracer

        tracer = DelegateEventTracer()
        for delegate in plan._delegates.items:
            setter = getattr(delegate.executor, "set_event_tracer", None)
            if delegate.kind == "backend" and callable(setter):
                setter(delegate.handle, tracer)
                self.delegate_tracer = tracer

    def _run_traced(self, plan: MethodPlan, vals: list) -> None:
        """Run every chain, recording one ETDump profiling event per kernel or delegate call (nanoseconds), and
        the sub-events executors report through the delegate tracer."""
        events: list[tuple] = []
        clock = time.perf_counter_ns
        tracer = self.delegate_tracer
        if tracer is not None:
            tracer._events = events
        outputs = self.recorder.output_event if self.recorder.records_outputs else None
        for ci, ((ops, has_jump, labels), names) in enumerate(zip(plan.chains, self._trace_plan(plan), strict=True)):
            if has_jump:  # control flow: run it, without per-instruction events
                self._run_with_jumps(ops, labels, vals)
                continue
            i = -1
            try:
                for i, (fn, get, post) in enumerate(ops):
                    instr, name = names[i]
                    if tracer is not None:
                        tracer._chain, tracer._instruction = ci, instr
                    t = clock()
                    r = fn(*get(vals))
                    if post is not None:
                        post(vals, r)
                    if name is not None:
                        events.append((name, ci, instr, t, clock()))
                        if outputs is not None:
                            slots = getattr(fn, "out_slots", None)  # a delegate call stores into its slots
                            outputs(events, ci, instr, r if slots is None else [vals[o] for o in slots])
            except Exception as exc:
                if tracer is not None:
                    tracer._events = None
                raise self._wrap(exc, labels, i) from exc
        if tracer is not None:
            tracer._events = None
        self.recorder.execution(events)

    def _run_with_jumps(self, ops: list[tuple], labels: list[str], vals: list) -> None:
        pc = 0
        n = len(ops)
        steps = 0
        try:
            while pc < n:
                fn, get, post = ops[pc]
                steps += 1
                if steps > MAX_STEPS:
                    raise RuntimeExecutionError(f"ran {MAX_STEPS} instructions without finishing (endless loop?)")
                if fn is JUMP:
                    cond = vals[get]
                    if isinstance(cond, np.ndarray):
                        cond = bool(cond.reshape(-1)[0]) if cond.size else False
                    pc = pc + 1 if cond else post
                    continue
                r = fn(*get(vals))
                if post is not None:
                    post(vals, r)
                pc += 1
        except Exception as exc:
            raise self._wrap(exc, labels, pc) from exc

    def _wrap(self, exc: Exception, labels: list[str], i: int) -> RuntimeExecutionError:
        where = labels[i] if 0 <= i < len(labels) else "?"
        if isinstance(exc, RuntimeExecutionError):
            msg = str(exc)
        else:
            msg = f"{type(exc).__name__}: {exc}"
        return RuntimeExecutionError(f"{self.plan.where} {where}: {msg}")
